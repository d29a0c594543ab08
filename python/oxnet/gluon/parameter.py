"""Gluon parameters (MXNet's ``mxnet.gluon.parameter``): named arrays with deferred
initialization, gradient buffers marked for autograd, and MXNet's file layouts."""

import re
import warnings
from collections import OrderedDict

import numpy as np

from .. import autograd, initializer
from .. import ndarray as nd
from .. import symbol
from ..base import MXNetError, dtype_name, np_dtype
from ..context import Context, cpu, current_context


class DeferredInitializationError(MXNetError):
    """A parameter was used before the first forward pass told its shape."""


_VALID_STYPES = ("default", "row_sparse", "csr")


def _shape_is_known(shape):
    return shape is not None and all(d > 0 for d in shape)


def _as_np_dtype(dtype):
    return np_dtype(dtype_name(dtype))


class Parameter:
    """A block's weight: its data on one or more contexts and, unless ``grad_req='null'``, its
    gradient buffers. Shapes with 0 (unknown) dimensions are completed at the first forward."""

    def __init__(self, name, grad_req="write", shape=None, dtype=np.float32, lr_mult=1.0, wd_mult=1.0, init=None,
                 allow_deferred_init=False, differentiable=True, stype="default", grad_stype="default"):
        for what, value in (("stype", stype), ("grad_stype", grad_stype)):
            if value not in _VALID_STYPES:
                raise AssertionError("%s for Parameter '%s' must be one of 'default', 'row_sparse', or 'csr', "
                                     "but got '%s'" % (what, name, value))
        self.name = name
        self._shape = None if shape is None else (tuple(shape) if isinstance(shape, (tuple, list)) else (shape,))
        self.dtype = _as_np_dtype(dtype)
        self.lr_mult = lr_mult
        self.wd_mult = wd_mult
        self.init = init
        self._allow_deferred_init = allow_deferred_init
        self._differentiable = differentiable
        self._grad_req = None
        self._data = None
        self._grad = None
        self._ctx_list = None
        self._deferred_init = ()
        self._var = None
        self._stype = stype
        # The Trainer updating this parameter (told when the value is replaced).
        self._trainer = None
        self.grad_req = grad_req

    def __repr__(self):
        return "Parameter {name} (shape={shape}, dtype={dtype})".format(name=self.name, shape=self.shape,
                                                                       dtype=np.dtype(self.dtype).name)

    # ---- shape and gradient request ------------------------------------------------------------
    @property
    def shape(self):
        return self._shape

    @shape.setter
    def shape(self, new_shape):
        new_shape = tuple(new_shape)
        if self._shape is None:
            self._shape = new_shape
            return
        compatible = len(self._shape) == len(new_shape) and all(
            i == j or i == 0 for i, j in zip(self._shape, new_shape))
        if not compatible:
            raise AssertionError("Expected shape %s is incompatible with given shape %s for Parameter '%s'."
                                 % (str(new_shape), str(self._shape), self.name))
        self._shape = new_shape

    @property
    def grad_req(self):
        return self._grad_req

    @grad_req.setter
    def grad_req(self, req):
        if req not in ("write", "add", "null"):
            raise ValueError("grad_req must be one of 'write', 'add', or 'null', but got '%s'" % req)
        if not self._differentiable:
            req = "null"
        if self._grad_req == req:
            return
        self._grad_req = req
        if req == "null" and self._grad is not None:
            self._grad = None
            self._data = [d.detach() for d in self._data]
        elif self._data is not None:
            self._init_grad()

    @property
    def stype(self):
        return self._stype

    # ---- initialization -------------------------------------------------------------------------
    def initialize(self, init=None, ctx=None, default_init=initializer.Uniform(), force_reinit=False):
        """Create the data on ``ctx`` (one context or a list) with ``init``, this parameter's own
        init, or ``default_init``; deferred until the first forward if the shape is unknown."""
        if self._data is not None and not force_reinit:
            warnings.warn("Parameter '%s' is already initialized, ignoring. Set force_reinit=True to re-initialize."
                          % self.name, stacklevel=2)
            return
        self._data = self._grad = None
        if ctx is None:
            ctx = [current_context()]
        if isinstance(ctx, Context):
            ctx = [ctx]
        if init is None:
            init = default_init if self.init is None else self.init
        if not _shape_is_known(self.shape):
            if self._allow_deferred_init:
                self._deferred_init = (init, ctx, default_init, None)
                return
            raise ValueError("Cannot initialize Parameter '%s' because it has invalid shape: %s."
                             % (self.name, str(self.shape)))
        self._deferred_init = (init, ctx, default_init, None)
        self._finish_deferred_init()

    def _finish_deferred_init(self):
        if not self._deferred_init:
            return
        init, ctx, default_init, data = self._deferred_init
        self._deferred_init = ()
        if not _shape_is_known(self.shape):
            raise DeferredInitializationError(
                "Cannot initialize Parameter '%s' because it has invalid shape: %s. Please specify in_units, "
                "in_channels, etc for `Block`s." % (self.name, str(self.shape)))
        with autograd.pause():
            if data is None:
                data = nd.zeros(self.shape, ctx=cpu(), dtype=self.dtype)
                desc = initializer.InitDesc(self.name, {"__init__": init})
                initializer.create(default_init)(desc, data)
            self._init_impl(data, ctx)

    def _init_impl(self, data, ctx_list):
        self._ctx_list = list(ctx_list)
        self._data = [data.copyto(ctx) if data.context != ctx else data.copy() for ctx in self._ctx_list]
        self._init_grad()

    def _init_grad(self):
        if self.grad_req == "null":
            self._grad = None
            return
        self._grad = [nd.zeros(d.shape, ctx=d.context, dtype=d.dtype) for d in self._data]
        autograd.mark_variables(self._data, self._grad, self.grad_req)

    def _load_init(self, data, ctx, cast_dtype=False, dtype_source="current"):
        if self.shape:
            unknown_dims = [i for i, d in enumerate(self.shape) if d == 0]
            expected = tuple(d if i not in unknown_dims else data.shape[i] for i, d in enumerate(self.shape))
            if len(self.shape) != len(data.shape) or expected != data.shape:
                raise AssertionError("Failed loading Parameter '%s' from saved params: shape incompatible expected "
                                     "%s vs saved %s" % (self.name, str(self.shape), str(data.shape)))
        self.shape = data.shape
        if cast_dtype:
            if dtype_source == "current":
                data = data.astype(self.dtype, copy=False)
            else:
                self.dtype = data.dtype
        elif np.dtype(self.dtype) != np.dtype(data.dtype):
            raise AssertionError("Failed loading Parameter '%s' from saved params: dtype incompatible expected %s "
                                 "vs saved %s. Set cast_dtype=True to cast the dtype of saved params."
                                 % (self.name, str(self.dtype), str(data.dtype)))
        if isinstance(ctx, Context):
            ctx = [ctx]
        if self._data is None:
            if self._deferred_init:
                ctx = self._deferred_init[1]
            elif ctx is None:
                ctx = [cpu()]
            self._deferred_init = ()
            self._init_impl(data, ctx)
        else:
            self.set_data(data)

    # ---- access ---------------------------------------------------------------------------------
    def _check_and_get(self, arr_list, ctx):
        if arr_list is not None:
            if ctx is list:
                return arr_list
            if ctx is None:
                if len(arr_list) == 1:
                    return arr_list[0]
                ctx = current_context()
            for arr, c in zip(arr_list, self._ctx_list):
                if c == ctx:
                    return arr
            raise RuntimeError("Parameter '%s' was not initialized on context %s. It was only initialized on %s."
                               % (self.name, str(ctx), str(self._ctx_list)))
        if self._deferred_init:
            raise DeferredInitializationError(
                "Parameter '%s' has not been initialized yet because initialization was deferred. Actual "
                "initialization happens during the first forward pass. Please pass one batch of data through the "
                "network before accessing Parameters. You can also avoid deferred initialization by specifying "
                "in_units, num_features, etc., for network layers." % self.name)
        raise RuntimeError("Parameter '%s' has not been initialized. Note that you should initialize parameters "
                           "and create Trainer with Block.collect_params() instead of Block.params because the "
                           "later does not include Parameters of nested child Blocks" % self.name)

    def data(self, ctx=None):
        return self._check_and_get(self._data, ctx)

    def list_data(self):
        return self._check_and_get(self._data, list)

    def grad(self, ctx=None):
        if self._data is not None and self._grad is None:
            raise RuntimeError("Cannot get gradient array for Parameter '%s' because grad_req='null'" % self.name)
        return self._check_and_get(self._grad, ctx)

    def list_grad(self):
        if self._data is not None and self._grad is None:
            raise RuntimeError("Cannot get gradient array for Parameter '%s' because grad_req='null'" % self.name)
        return self._check_and_get(self._grad, list)

    def list_ctx(self):
        if self._data is None:
            if self._deferred_init:
                return self._deferred_init[1]
            raise RuntimeError("Parameter '%s' has not been initialized" % self.name)
        return self._ctx_list

    def zero_grad(self):
        if self._grad is None:
            return
        for g in self._grad:
            g[:] = 0

    def _set_trainer(self, trainer):
        self._trainer = trainer

    def set_data(self, data):
        """Replace the value on every context (the shape must match)."""
        self.shape = data.shape
        if self._data is None:
            if not self._deferred_init:
                raise RuntimeError("Parameter '%s' has not been initialized" % self.name)
            self._deferred_init = self._deferred_init[:3] + (data,)
            return
        trainer = self._trainer
        if trainer is not None and trainer._kv_initialized and trainer._update_on_kvstore:
            # The store holds the weights it updates: rebuild it from the new values.
            if self not in trainer._params_to_init:
                trainer._reset_kvstore()
        for arr in self._data:
            arr[:] = data

    def reset_ctx(self, ctx):
        """Move the data (and gradients) to other contexts."""
        if isinstance(ctx, Context):
            ctx = [ctx]
        if self._data is not None:
            data = self._reduce()
            with autograd.pause():
                self._init_impl(data, ctx)
        elif self._deferred_init:
            init, _, default_init, data = self._deferred_init
            self._deferred_init = (init, ctx, default_init, data)
        else:
            raise ValueError("Cannot reset context for Parameter '%s' because it has not been initialized." % self.name)

    def _reduce(self):
        """The value as one CPU array (the mean over contexts, which hold copies)."""
        data = self.list_data()
        if len(data) == 1:
            return data[0].copyto(cpu())
        total = data[0].copyto(cpu())
        for d in data[1:]:
            total = total + d.copyto(cpu())
        return total / len(data)

    def var(self):
        """This parameter as a symbol variable (with its shape, dtype, multipliers and init)."""
        if self._var is None:
            self._var = symbol.var(self.name, shape=self.shape, dtype=self.dtype, lr_mult=self.lr_mult,
                                   wd_mult=self.wd_mult, init=self.init)
        return self._var

    def cast(self, dtype):
        """Convert the data (and gradients) to ``dtype``."""
        self.dtype = _as_np_dtype(dtype)
        self._var = None
        if self._data is None:
            return
        with autograd.pause():
            self._data = [d.astype(dtype) for d in self._data]
            self._init_grad()


class Constant(Parameter):
    """A parameter that never changes (``grad_req='null'``), initialized to ``value``."""

    def __init__(self, name, value):
        if not isinstance(value, nd.NDArray):
            value = nd.array(value)
        self.value = value

        class _Init(initializer.Initializer):
            def _init_weight(self, _, arr):
                value.copyto(arr)

            _init_default = _init_weight

        super().__init__(name, grad_req="null", shape=value.shape, dtype=value.dtype, init=_Init())

    def __repr__(self):
        return "Constant {name} (shape={shape}, dtype={dtype})".format(name=self.name, shape=self.shape,
                                                                      dtype=np.dtype(self.dtype).name)

    @property
    def grad_req(self):
        return "null"

    @grad_req.setter
    def grad_req(self, req):
        if req != "null":
            warnings.warn("Constant parameter \"{}\" does not support grad_req other than \"null\", and new value "
                          "\"{}\" is ignored.".format(self.name, req))
        self._grad_req = "null"


class ParameterDict:
    """Parameters by full name, all sharing one prefix; ``get`` creates or retrieves."""

    def __init__(self, prefix="", shared=None):
        self._prefix = prefix
        self._params = OrderedDict()
        self._shared = shared

    def __repr__(self):
        body = "\n".join("  " + repr(v) for v in self.values())
        return "%s(\n%s\n)" % (self._prefix + " " if self._prefix else "", body)

    def __getitem__(self, key):
        return self._params[key]

    def __iter__(self):
        return iter(self._params)

    def __len__(self):
        return len(self._params)

    def __contains__(self, key):
        return key in self._params

    def items(self):
        return self._params.items()

    def keys(self):
        return self._params.keys()

    def values(self):
        return self._params.values()

    @property
    def prefix(self):
        return self._prefix

    def _get_impl(self, name):
        if name in self._params:
            return self._params[name]
        if self._shared is not None and name in self._shared._params:
            self._params[name] = self._shared._params[name]
            return self._params[name]
        return None

    def get(self, name, **kwargs):
        """The parameter ``prefix + name``, created with ``kwargs`` if it does not exist; an existing
        one must agree with ``kwargs`` (unknown shape dimensions are filled in)."""
        name = self.prefix + name
        param = self._get_impl(name)
        if param is None:
            param = Parameter(name, **kwargs)
            self._params[name] = param
            return param
        for key, value in kwargs.items():
            if hasattr(param, key) and getattr(param, key) is not None:
                existing = getattr(param, key)
                if key == "shape" and len(value) == len(existing):
                    merged = []
                    for dim1, dim2 in zip(value, existing):
                        if dim1 != dim2 and dim1 * dim2 != 0:
                            break
                        merged.append(dim1 or dim2)
                    else:
                        param.shape = tuple(merged)
                        continue
                elif key == "dtype" and np.dtype(value) == np.dtype(existing):
                    continue
                assert value is None or value == existing, (
                    "Cannot retrieve Parameter '%s' because desired attribute does not match with stored for "
                    "attribute '%s': desired '%s' vs stored '%s'." % (name, key, str(value), str(existing)))
            else:
                setattr(param, key, value)
        return param

    def get_constant(self, name, value=None):
        name = self.prefix + name
        param = self._get_impl(name)
        if param is None:
            if value is None:
                raise KeyError("No constant named '{}'. Please specify value if you want to create a new "
                               "constant.".format(name))
            param = Constant(name, value)
            self._params[name] = param
        elif value is not None:
            if not isinstance(param, Constant):
                raise AssertionError("Parameter '{}' already exists but it is not a constant.".format(name))
        return param

    def update(self, other):
        for key, value in other.items():
            if key in self._params:
                if self._params[key] is not value:
                    raise AssertionError("Cannot update self with other because they have different Parameters "
                                         "with the same name '%s'" % key)
            else:
                self._params[key] = value

    def initialize(self, init=initializer.Uniform(), ctx=None, verbose=False, force_reinit=False):
        """Initialize every parameter (``init`` is the default for those without their own)."""
        for value in self.values():
            value.initialize(None, ctx, init, force_reinit=force_reinit)

    def zero_grad(self):
        for value in self.values():
            value.zero_grad()

    def reset_ctx(self, ctx):
        for value in self.values():
            value.reset_ctx(ctx)

    def list_ctx(self):
        ctxs = []
        for value in self.values():
            ctxs.extend(c for c in value.list_ctx() if c not in ctxs)
        return ctxs

    def setattr(self, name, value):
        """Set an attribute (``grad_req``, ``lr_mult``, ...) on every parameter."""
        for param in self.values():
            setattr(param, name, value)

    def select(self, pattern):
        """The parameters whose name matches the regular expression ``pattern``."""
        regex = re.compile(pattern)
        selected = ParameterDict(self._prefix)
        selected.update({k: v for k, v in self.items() if regex.match(k)})
        return selected

    def save(self, filename, strip_prefix=""):
        arg_dict = {}
        for param in self.values():
            weight = param._reduce()
            if not param.name.startswith(strip_prefix):
                raise ValueError("Prefix '%s' is to be striped before saving, but Parameter's name '%s' does not "
                                 "start with '%s'." % (strip_prefix, param.name, strip_prefix))
            arg_dict[param.name[len(strip_prefix):]] = weight
        nd.save(filename, arg_dict)

    def load(self, filename, ctx=None, allow_missing=False, ignore_extra=False, restore_prefix="",
             cast_dtype=False, dtype_source="current"):
        """Load values saved by ``save``, ``Block.export`` (``arg:``/``aux:`` keys) or MXNet."""
        if restore_prefix:
            for name in self.keys():
                if not name.startswith(restore_prefix):
                    raise ValueError("restore_prefix is '%s' but Parameters name '%s' does not start with '%s'"
                                     % (restore_prefix, name, restore_prefix))
        loaded = nd.load(filename)
        self.load_dict({} if isinstance(loaded, list) else loaded, ctx, allow_missing, ignore_extra, restore_prefix,
                       filename, cast_dtype, dtype_source)

    def load_dict(self, param_dict, ctx=None, allow_missing=False, ignore_extra=False, restore_prefix="",
                  filename=None, cast_dtype=False, dtype_source="current"):
        """Load the values of ``param_dict`` ({name: NDArray}, names optionally ``arg:``/``aux:``
        prefixed); ``filename`` names their source in errors."""
        source = "file '%s'" % filename if filename else "param_dict"
        arg_dict = {restore_prefix + (k[4:] if k.startswith(("arg:", "aux:")) else k): v for k, v in param_dict.items()}
        if not allow_missing:
            for name in self.keys():
                if name not in arg_dict:
                    raise AssertionError("Parameter '%s' is missing in %s, which contains parameters: %s. "
                                         "Please make sure source and target networks have the same prefix."
                                         % (name[len(restore_prefix):], source, _brief(arg_dict)))
        for name, value in arg_dict.items():
            if name not in self._params:
                if ignore_extra:
                    continue
                raise AssertionError("Parameter '%s' loaded from %s is not present in ParameterDict, which "
                                     "contains parameters %s. Set ignore_extra=True to ignore. "
                                     % (name[len(restore_prefix):], source, _brief(self._params)))
            self[name]._load_init(value, ctx, cast_dtype=cast_dtype, dtype_source=dtype_source)


def _brief(names):
    names = list(names)
    return ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
