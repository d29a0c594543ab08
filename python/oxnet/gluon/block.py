"""Gluon blocks (MXNet's ``mxnet.gluon.block``): Block, HybridBlock (hybridize compiles the
traced graph into one cached operator), SymbolBlock."""

import copy
import json
import re
import threading
import warnings
from collections import OrderedDict

import numpy as np

from .. import _core, autograd, initializer
from .. import name as _name
from .. import ndarray, symbol
from ..ndarray import NDArray
from ..symbol import Symbol
from .parameter import DeferredInitializationError, Parameter, ParameterDict


class _BlockScope:
    """Name scope of a block: children get ``<parent prefix><hint><count>_`` prefixes."""

    _current = threading.local()

    def __init__(self, block):
        self._block = block
        self._counter = {}
        self._old_scope = None
        self._name_scope = None

    @staticmethod
    def create(prefix, params, hint):
        current = getattr(_BlockScope._current, "value", None)
        if current is None:
            if prefix is None:
                prefix = _name.NameManager.current.get(None, hint) + "_"
            params = ParameterDict(prefix) if params is None else ParameterDict(params.prefix, params)
            return prefix, params
        if prefix is None:
            count = current._counter.get(hint, 0)
            prefix = "%s%d_" % (hint, count)
            current._counter[hint] = count + 1
        if params is None:
            parent = current._block.params
            params = ParameterDict(parent.prefix + prefix, parent._shared)
        else:
            params = ParameterDict(params.prefix, params)
        return current._block.prefix + prefix, params

    def __enter__(self):
        if self._block._empty_prefix:
            return self
        self._old_scope = getattr(_BlockScope._current, "value", None)
        _BlockScope._current.value = self
        self._name_scope = _name.Prefix(self._block.prefix)
        self._name_scope.__enter__()
        return self

    def __exit__(self, ptype, value, trace):
        if self._block._empty_prefix:
            return
        self._name_scope.__exit__(ptype, value, trace)
        self._name_scope = None
        _BlockScope._current.value = self._old_scope


def _flatten(args, inout_str):
    """Nested lists of arrays/symbols as a flat list plus the structure to rebuild them."""
    if isinstance(args, NDArray):
        return [args], 0
    if isinstance(args, Symbol):
        length = len(args.list_outputs())
        return [args], length if length > 1 else 0
    if args is None:
        return [None], -1
    if not isinstance(args, (list, tuple)):
        raise ValueError("When hybridized, the %s of a HybridBlock must be (nested) lists of Symbol or NDArray, "
                         "but got %s of type %s" % (inout_str, str(args), str(type(args))))
    flat, fmts = [], []
    for item in args:
        arg, fmt = _flatten(item, inout_str)
        flat.extend(arg)
        fmts.append(fmt)
    return flat, fmts


def _regroup(args, fmt):
    """Rebuild what ``_flatten`` flattened: (the structure, the flat items left over)."""
    if isinstance(fmt, int):
        if fmt == 0:
            return args[0], args[1:]
        if fmt == -1:
            if args[0] is not None:
                raise ValueError("A HybridBlock hybridized with None in this argument position cannot take "
                                 "%s there" % str(args[0]))
            return None, args[1:]
        return args[:fmt], args[fmt:]
    ret = []
    for sub in fmt:
        res, args = _regroup(args, sub)
        ret.append(res)
    return ret, args


def _gather_type_ctx_info(args):
    """Over nested lists of arguments: (any Symbol, any NDArray, the set of NDArray contexts,
    the first NDArray's context). Other values (None, numbers) count as neither."""
    if isinstance(args, NDArray):
        return False, True, {args.context}, args.context
    if isinstance(args, Symbol):
        return True, False, set(), None
    if not isinstance(args, (list, tuple)):
        return False, False, set(), None
    has_symbol, has_ndarray, contexts, first_ctx = False, False, set(), None
    for item in args:
        item_symbol, item_ndarray, item_contexts, item_first = _gather_type_ctx_info(item)
        has_symbol = has_symbol or item_symbol
        has_ndarray = has_ndarray or item_ndarray
        contexts |= item_contexts
        if first_ctx is None:
            first_ctx = item_first
    return has_symbol, has_ndarray, contexts, first_ctx


class _HookHandle:
    def __init__(self, hooks, key):
        self._hooks, self._key = hooks, key

    def detach(self):
        self._hooks.pop(self._key, None)

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self.detach()


class Block:
    """Base class of all layers and models: children, parameters, name scopes, hooks."""

    def __init__(self, prefix=None, params=None):
        self._empty_prefix = prefix == ""
        self._prefix, self._params = _BlockScope.create(prefix, params, self._alias())
        self._name = self._prefix[:-1] if self._prefix.endswith("_") else self._prefix
        self._scope = _BlockScope(self)
        self._children = OrderedDict()
        self._reg_params = {}
        self._forward_hooks = OrderedDict()
        self._forward_pre_hooks = OrderedDict()
        self._hook_count = 0

    def __repr__(self):
        lines = ["{name}(".format(name=self.__class__.__name__)]
        for key, block in self._children.items():
            child = repr(block).replace("\n", "\n  ")
            lines.append("  ({key}): {block}".format(key=key, block=child))
        return "\n".join(lines) + "\n)" if len(lines) > 1 else lines[0] + ")"

    def __setattr__(self, name, value):
        if hasattr(self, name) and name in self.__dict__:
            existing = getattr(self, name)
            if isinstance(existing, (Parameter, Block)) and not isinstance(value, type(existing)):
                raise TypeError("Changing attribute type for {name} from {type1} to {type2} is not allowed."
                                .format(name=name, type1=type(existing), type2=type(value)))
        if isinstance(value, Block):
            self.register_child(value, name)
        elif isinstance(value, Parameter):
            if name in self._reg_params:
                raise AssertionError("Overriding Parameter attribute %s is not allowed. If you want to share "
                                     "parameters between blocks, please set 'params' at Block construction instead.")
            self._reg_params[name] = value
        super().__setattr__(name, value)

    def _alias(self):
        return self.__class__.__name__.lower()

    @property
    def prefix(self):
        return self._prefix

    @property
    def name(self):
        return self._name

    @property
    def params(self):
        """This block's own parameters (not its children's)."""
        return self._params

    def name_scope(self):
        """Children and parameters created inside get this block's prefix."""
        return self._scope

    def _warn_unregistered_blocks_in_containers(self):
        """Blocks kept in a plain list, tuple or dict attribute are no children: their parameters
        would silently be left out of ``collect_params``."""
        children = set(map(id, self._children.values()))

        def holds_unregistered(data):
            if isinstance(data, (list, tuple)):
                return any(holds_unregistered(item) for item in data)
            if isinstance(data, dict):
                return any(holds_unregistered(item) for item in data.values())
            return isinstance(data, Block) and id(data) not in children

        for key, value in self.__dict__.items():
            if key.startswith("__") or key == "_children" or not isinstance(value, (list, tuple, dict)):
                continue
            if holds_unregistered(value):
                warnings.warn('"%s.%s" is an unregistered container with Blocks. Blocks inside a list, tuple or '
                              'dict are not registered automatically: register them with register_child() or use '
                              'nn.Sequential/nn.HybridSequential instead.' % (self.__class__.__name__, key),
                              stacklevel=3)

    def collect_params(self, select=None):
        """Parameters of this block and all its children; ``select`` filters names by regex."""
        self._warn_unregistered_blocks_in_containers()
        ret = ParameterDict(self._params.prefix)
        if not select:
            ret.update(self.params)
        else:
            pattern = re.compile(select)
            ret.update({n: p for n, p in self.params.items() if pattern.match(n)})
        for child in self._children.values():
            ret.update(child.collect_params(select=select))
        return ret

    def _collect_params_with_prefix(self, prefix=""):
        if prefix:
            prefix += "."
        ret = {prefix + key: val for key, val in self._reg_params.items()}
        for name, child in self._children.items():
            ret.update(child._collect_params_with_prefix(prefix + name))
        return ret

    def save_parameters(self, filename, deduplicate=False):
        """Save parameters under their structural names (``0.weight``), as MXNet does."""
        params = self._collect_params_with_prefix()
        if deduplicate:
            seen = {}
            params = {k: v for k, v in params.items() if seen.setdefault(id(v), k) == k}
        ndarray.save(filename, {key: val._reduce() for key, val in params.items()})

    def load_parameters(self, filename, ctx=None, allow_missing=False, ignore_extra=False, cast_dtype=False,
                        dtype_source="current"):
        """Load what ``save_parameters`` wrote (or, for full names, ``ParameterDict.save``)."""
        loaded = ndarray.load(filename)
        if isinstance(loaded, list):
            loaded = {}
        params = self._collect_params_with_prefix()
        if not loaded and not params:
            return
        if not any("." in key for key in loaded):
            # Full parameter names (the legacy `save_params` layout).
            self.collect_params().load(filename, ctx, allow_missing, ignore_extra, self.prefix,
                                       cast_dtype=cast_dtype, dtype_source=dtype_source)
            return
        if not allow_missing:
            # A parameter shared by several children is saved once (deduplicate=True): any of
            # its structural names in the file loads it.
            names_of = {}
            for name, param in params.items():
                names_of.setdefault(id(param), []).append(name)
            for name, param in params.items():
                if not any(alias in loaded for alias in names_of[id(param)]):
                    raise AssertionError("Parameter '%s' is missing in file '%s', which contains parameters: %s. "
                                         "Set allow_missing=True to ignore missing parameters."
                                         % (name, filename, ", ".join(sorted(loaded))))
        for name, value in loaded.items():
            if name not in params:
                if ignore_extra:
                    continue
                raise AssertionError("Parameter '%s' loaded from file '%s' is not present in this block. Set "
                                     "ignore_extra=True to ignore." % (name, filename))
            params[name]._load_init(value, ctx, cast_dtype=cast_dtype, dtype_source=dtype_source)

    def save_params(self, filename):
        """Deprecated layout: full parameter names less this block's prefix (what a SymbolBlock
        built from this block's symbol loads with ``load_params``)."""
        warnings.warn("save_params is deprecated. Please use save_parameters. Note that if you want load from "
                      "SymbolBlock later, please use export instead.", stacklevel=2)
        try:
            self.collect_params().save(filename, strip_prefix=self.prefix)
        except ValueError as e:
            raise ValueError("%s\nsave_params is deprecated. Using save_parameters may resolve this error." % e) from e

    def load_params(self, filename, ctx=None, allow_missing=False, ignore_extra=False):
        """Deprecated name of ``load_parameters``."""
        warnings.warn("load_params is deprecated. Please use load_parameters.", stacklevel=2)
        self.load_parameters(filename, ctx, allow_missing, ignore_extra)

    def save(self, prefix):
        """Save the block tree and its parameters to ``prefix-model.json`` and ``prefix-model.params``.

        Each block is recorded under its class name and its position in a depth-first walk of the
        children, with its name and the names its parent uses for its children; a hybridized
        block also records its traced graph. ``load`` needs a model built the same way, in the
        same order."""
        def describe(block, counter, parent):
            entry = {"orig_name": block.name}
            parent[type(block).__name__.lower() + str(counter[0])] = entry
            if isinstance(block, HybridBlock):
                entry["hybridized"] = bool(block._cached_graph)
                if block._cached_graph:
                    inputs, out = block._cached_graph
                    entry["in_format"] = block._in_format
                    entry["out_format"] = block._out_format
                    entry["inputs"] = [sym.tojson() for sym in inputs]
                    entry["symbol"] = out.tojson(remove_amp_cast=False)
            entry["children"] = {}
            for child_key, child in block._children.items():
                counter[0] += 1
                entry["children"][child.name] = child_key
                describe(child, counter, entry)

        model = {}
        describe(self, [0], model)
        _core.write_file(prefix + "-model.json", json.dumps(model).encode("utf-8"))
        self.save_parameters(prefix + "-model.params")

    def load(self, prefix):
        """Load what ``save`` wrote into a block tree built the same way: blocks, their parameters
        and their child keys get back the names they had when saved, hybridized blocks get back
        their traced graphs, then the parameters are loaded."""
        with open(prefix + "-model.json") as f:
            model = json.load(f)

        def restore(block, counter, parent):
            entry = parent[type(block).__name__.lower() + str(counter[0])]
            block._name = entry["orig_name"]
            if isinstance(block, HybridBlock) and entry.get("hybridized"):
                block._in_format = entry["in_format"]
                block._out_format = entry["out_format"]
                block._cached_graph = ([symbol.load_json(js) for js in entry["inputs"]],
                                       symbol.load_json(entry["symbol"]))
                block._cached_op = None
                block._active = True
            # The traced graph names parameters after the saved block name: rekey them to match.
            own = block.params
            for key in list(own.keys()):
                param = own._params.pop(key)
                own._params[block.name + "_" + key[len(own.prefix):]] = param
            for child in block._children.values():
                counter[0] += 1
                restore(child, counter, entry)
            saved_keys = entry["children"]
            block._children = OrderedDict((saved_keys[child.name], child) for child in block._children.values())

        restore(self, [0], model)
        self.load_parameters(prefix + "-model.params")

    def register_child(self, block, name=None):
        if name is None:
            name = str(len(self._children))
        self._children[name] = block

    def register_forward_pre_hook(self, hook):
        self._hook_count += 1
        self._forward_pre_hooks[self._hook_count] = hook
        return _HookHandle(self._forward_pre_hooks, self._hook_count)

    def register_forward_hook(self, hook):
        self._hook_count += 1
        self._forward_hooks[self._hook_count] = hook
        return _HookHandle(self._forward_hooks, self._hook_count)

    def apply(self, fn):
        for child in self._children.values():
            child.apply(fn)
        fn(self)
        return self

    def register_op_hook(self, callback, monitor_all=False):
        """Call ``callback(name, op_name, array)`` for every operator output (and input, with
        ``monitor_all``) that the hybridized descendants' graphs compute (MXNet's op hooks).
        Outputs are named ``<node>_output``, inputs ``<node>_<input name>`` (``<node>_input<i>``
        for operators that declare no input names)."""
        for child in self._children.values():
            child.register_op_hook(callback, monitor_all)

    def initialize(self, init=initializer.Uniform(), ctx=None, verbose=False, force_reinit=False):
        self.collect_params().initialize(init, ctx, verbose, force_reinit)

    def hybridize(self, active=True, **kwargs):
        for child in self._children.values():
            child.hybridize(active, **kwargs)

    def cast(self, dtype):
        for child in self._children.values():
            child.cast(dtype)
        for param in self.params.values():
            param.cast(dtype)

    def zero_grad(self):
        self.collect_params().zero_grad()

    def __call__(self, *args):
        for hook in list(self._forward_pre_hooks.values()):
            hook(self, args)
        out = self.forward(*args)
        for hook in list(self._forward_hooks.values()):
            hook(self, args, out)
        return out

    def forward(self, *args):
        raise NotImplementedError

    def summary(self, *inputs):
        """Print each block's output shape and parameter count for one forward pass."""
        rows = []
        seen = set()

        def hook(block, _, outputs):
            shapes = [o.shape for o in _flatten(outputs, "output")[0] if o is not None]
            params = 0
            for p in block.params.values():
                if id(p) not in seen:
                    seen.add(id(p))
                    params += int(np.prod(p.shape))
            rows.append(("%s-%d" % (block.__class__.__name__, len(rows) + 1),
                         str(shapes[0] if len(shapes) == 1 else shapes), params))

        handles = []
        self.apply(lambda b: handles.append(b.register_forward_hook(hook)))
        try:
            self(*inputs)
        finally:
            for h in handles:
                h.detach()
        line = "-" * 80
        print(line)
        print("{:>20}  {:>42} {:>15}".format("Layer (type)", "Output Shape", "Param #"))
        print("=" * 80)
        print("{:>20}  {:>42} {:>15}".format("Input", str([i.shape for i in inputs][0]), 0))
        for name, shape, params in rows:
            print("{:>20}  {:>42} {:>15}".format(name, shape, params))
        total = sum(int(np.prod(p.shape)) for p in self.collect_params().values())
        trainable = sum(int(np.prod(p.shape)) for p in self.collect_params().values() if p.grad_req != "null")
        print("=" * 80)
        print("Parameters in forward computation graph, duplicate included")
        print("   Total params: %d" % sum(r[2] for r in rows))
        print("   Trainable params: %d" % trainable)
        print("   Non-trainable params: %d" % (total - trainable))
        print("Shared params in forward computation graph: 0")
        print("Unique parameters in model: %d" % total)
        print(line)


class HybridBlock(Block):
    """A block written once for both NDArray (``F=mx.nd``) and Symbol (``F=mx.sym``).
    ``hybridize()`` traces it into a graph that runs as one cached operator (one autograd node)."""

    def __init__(self, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        self._cached_graph = ()
        self._cached_op = None
        self._cached_op_args = None
        self._out_format = None
        self._in_format = None
        self._active = False
        self._flags = {}
        # (traced graph, its number of operators), for the inlining decision.
        self._operator_count = (None, 0)
        # (callback, monitor_all) of register_op_hook.
        self._op_hook = None

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if isinstance(value, HybridBlock):
            self._clear_cached_op()

    def register_child(self, block, name=None):
        if not isinstance(block, HybridBlock):
            raise ValueError("Children of HybridBlock must also be HybridBlock, but %s has type %s. If you are "
                             "using Sequential, please try HybridSequential instead." % (str(block), str(type(block))))
        super().register_child(block, name)
        self._clear_cached_op()

    def hybridize(self, active=True, static_alloc=False, static_shape=False, inline_limit=2, mirror=False, **kwargs):
        """Run this block (and its hybrid children) as one compiled graph, with a static memory
        plan over its forward and backward as an executor has. Under autograd, a graph of at
        most ``inline_limit`` operators is recorded operator by operator instead, as MXNet's
        CachedOp inlines it (unless ``static_alloc``). ``static_alloc`` keeps the planned
        storage across calls instead of allocating it per call; plans are compiled once per
        input shape either way, so ``static_shape`` needs no extra work. ``mirror`` (an oxnet
        addition; ``MXNET_BACKWARD_DO_MIRROR=1`` turns it on for every graph) recomputes cheap
        forward values during backward instead of keeping them, trading compute for memory."""
        self._active = active
        self._flags = {"static_alloc": static_alloc, "static_shape": static_shape, "inline_limit": inline_limit,
                       "mirror": mirror}
        self._clear_cached_op()
        if active and (self._forward_hooks or self._forward_pre_hooks):
            warnings.warn("\"{block}\" is being hybridized while still having forward hook/pre-hook. If \"{block}\" "
                          "is a child of HybridBlock, the hooks will not take effect.".format(block=self))
        super().hybridize(active, static_alloc=static_alloc, static_shape=static_shape, inline_limit=inline_limit,
                          mirror=mirror, **kwargs)

    def _clear_cached_op(self):
        self._cached_graph = ()
        self._cached_op = None

    def register_op_hook(self, callback, monitor_all=False):
        """Call ``callback(name, op_name, array)`` for every operator output (and input, with
        ``monitor_all``) of this block's cached graph as it runs (MXNet's op hooks): outputs are
        named ``<node>_output``, inputs ``<node>_<input name>`` (``<node>_input<i>`` for
        operators that declare no input names). The graph then runs unfused and uninlined, so
        that every operator reports."""
        self._op_hook = (callback, monitor_all)
        super().register_op_hook(callback, monitor_all)

    def _inlined(self, *args):
        """Whether this recorded call runs operator by operator: a small graph, not statically
        allocated (MXNet's CachedOp inlining, visible in ``autograd.get_symbol``)."""
        if self._flags.get("static_alloc") or self._op_hook is not None or not autograd.is_recording():
            return False
        out = self._get_graph(*args)[1]
        if self._operator_count[0] is not out:
            nodes = json.loads(out.tojson(remove_amp_cast=False))["nodes"]
            self._operator_count = (out, sum(node["op"] != "null" for node in nodes))
        return self._operator_count[1] <= self._flags.get("inline_limit", 2)

    def _run_inlined(self, *args):
        """The traced computation run imperatively (every hybrid descendant un-hybridized for the
        call), so that autograd records each operator."""
        hybridized = []
        self.apply(lambda b: hybridized.append(b) if isinstance(b, HybridBlock) and b._active else None)
        for block in hybridized:
            block._active = False
        try:
            return self.forward(*args)
        finally:
            for block in hybridized:
                block._active = True

    def _get_graph(self, *args):
        if not self._cached_graph:
            flat_args, self._in_format = _flatten(args, "input")
            given = sum(arg is not None for arg in flat_args)
            if given == 0:
                raise ValueError("All arguments of the HybridBlock are None; at least one must be an NDArray "
                                 "or Symbol. Received args=%s" % str(args))
            # Arguments passed as None stay None in the traced call and are no graph inputs.
            inputs, flat_inputs = [], []
            for arg in flat_args:
                if arg is None:
                    flat_inputs.append(None)
                    continue
                var = symbol.var("data%d" % len(inputs) if given > 1 else "data")
                inputs.append(var)
                flat_inputs.append(var)
            grouped = _regroup(flat_inputs, self._in_format)[0]
            params = {i: j.var() for i, j in self._reg_params.items()}
            with self.name_scope():
                out = self.hybrid_forward(symbol, *(grouped if isinstance(grouped, list) else [grouped]), **params)
            out, self._out_format = _flatten(out, "output")
            self._cached_graph = inputs, (symbol.Group(out) if len(out) > 1 else out[0])
        return self._cached_graph

    def _infer_attrs(self, infer_fn, attr, *args):
        inputs, out = self._get_graph(*args)
        args = [a for a in _flatten(args, "input")[0] if a is not None]
        known = {i.name: getattr(j, attr) for i, j in zip(inputs, args)}
        arg_attrs, _, aux_attrs = getattr(out, infer_fn)(**known)
        if arg_attrs is None:
            partial, _, _ = out.infer_shape_partial(**known)
            unknown = [n for n, s in zip(out.list_arguments(), partial) if s == ()]
            raise ValueError("cannot infer the shapes of %s from the inputs %s" % (", ".join(unknown), known))
        sdict = dict(zip(out.list_arguments(), arg_attrs))
        sdict.update(zip(out.list_auxiliary_states(), aux_attrs))
        for param in self.collect_params().values():
            if param.name in sdict:
                setattr(param, attr, sdict[param.name])

    def infer_shape(self, *args):
        self._infer_attrs("infer_shape", "shape", *args)

    def infer_type(self, *args):
        self._infer_attrs("infer_type", "dtype", *args)

    def _deferred_infer_shape(self, *args):
        try:
            self.infer_shape(*args)
        except Exception as e:
            if not self._initialize_by_running(*args):
                raise ValueError("Deferred initialization failed because shape cannot be inferred. {}"
                                 .format(e)) from e

    def _initialize_by_running(self, *args):
        """Some parameter shapes are not a graph's to infer (a fused RNN layer's input weights reach
        its operator through a concatenation): run the block once imperatively, untraced and
        unrecorded, so that each child completes its own parameters. False when that cannot help."""
        if getattr(self, "_running_to_initialize", False) or not all(
                a is None or isinstance(a, NDArray) for a in _flatten(args, "input")[0]):
            return False
        hybridized = []
        self.apply(lambda b: hybridized.append(b) if isinstance(b, HybridBlock) and b._active else None)
        self._running_to_initialize = True
        for block in hybridized:
            block._active = False
        try:
            with autograd.pause():
                self.forward(*args)
        finally:
            for block in hybridized:
                block._active = True
            self._running_to_initialize = False
        return True

    def _build_cache(self, *args):
        data, out = self._get_graph(*args)
        data_indices = {d.name: i for i, d in enumerate(data)}
        params = self.collect_params()
        cached_args = []
        for name in out.list_inputs():
            if name in data_indices:
                cached_args.append((True, data_indices[name]))
            elif name in params:
                cached_args.append((False, params[name]))
            else:
                raise AssertionError("Unknown input to HybridBlock: %s" % name)
        self._cached_op_args = cached_args
        self._cached_op = _core.CachedOpHandle(out.handle, static_alloc=bool(self._flags.get("static_alloc")),
                                               mirror=bool(self._flags.get("mirror")))

    def planned_memory(self):
        """Bytes of the memory plan of this hybridized block's last call: forward and, when that
        call was recorded, backward together (an executor's ``planned_bytes`` for the same graph);
        0 before the first call. An oxnet addition."""
        return self._cached_op.planned_bytes() if self._cached_op is not None else 0

    def _call_cached_op(self, *args):
        if self._cached_op is None:
            self._build_cache(*args)
        args, fmt = _flatten(args, "input")
        if fmt != self._in_format and not _formats_differ_by_trailing_none(fmt, self._in_format):
            raise ValueError("The argument structure of the HybridBlock does not match the one it was "
                             "hybridized with: traced with %s, called with %s" % (self._in_format, fmt))
        args = [a for a in args if a is not None]
        try:
            cargs = [args[i] if is_arg else i.data() for is_arg, i in self._cached_op_args]
        except DeferredInitializationError:
            self._deferred_infer_shape(*args)
            cargs = []
            for is_arg, i in self._cached_op_args:
                if is_arg:
                    cargs.append(args[i])
                else:
                    i._finish_deferred_init()
                    cargs.append(i.data())
        if self._op_hook is None:
            out = [NDArray(h) for h in self._cached_op([c.handle for c in cargs])]
        else:
            callback, monitor_all = self._op_hook
            handles, report = self._cached_op.call_monitored([c.handle for c in cargs], monitor_all)
            out = [NDArray(h) for h in handles]
            for name, op_name, handle in report:
                callback(name, op_name, NDArray(handle))
        return _regroup(out, self._out_format)[0]

    def forward(self, x, *args):
        if isinstance(x, NDArray) and self._active:
            # The usual hybridized call, arrays on one device: no walk over the arguments.
            device = x.handle.context
            if all(isinstance(a, NDArray) and a.handle.context == device for a in args):
                with x.context:
                    if self._inlined(x, *args):
                        return self._run_inlined(x, *args)
                    return self._call_cached_op(x, *args)
        has_symbol, has_ndarray, contexts, ctx = _gather_type_ctx_info([x] + list(args))
        if has_symbol and has_ndarray:
            raise ValueError("A HybridBlock takes either NDArrays or Symbols, not a mix of both.")
        if not has_symbol and not has_ndarray:
            raise ValueError("A HybridBlock needs at least one NDArray or Symbol among its inputs.")
        if has_ndarray:
            with ctx:
                if self._active:
                    if len(contexts) > 1:
                        raise ValueError("A hybridized HybridBlock takes inputs on one context, but got inputs on "
                                         "%s" % sorted(str(c) for c in contexts))
                    if self._inlined(x, *args):
                        return self._run_inlined(x, *args)
                    return self._call_cached_op(x, *args)
                try:
                    params = {k: v.data(ctx) for k, v in self._reg_params.items()}
                except DeferredInitializationError:
                    self._deferred_infer_shape(x, *args)
                    for param in self.params.values():
                        param._finish_deferred_init()
                    params = {k: v.data(ctx) for k, v in self._reg_params.items()}
                return self.hybrid_forward(ndarray, x, *args, **params)
        params = {i: j.var() for i, j in self._reg_params.items()}
        with self.name_scope():
            return self.hybrid_forward(symbol, x, *args, **params)

    def hybrid_forward(self, F, x, *args, **kwargs):
        raise NotImplementedError

    def export(self, path, epoch=0, remove_amp_cast=True):
        """Write ``path-symbol.json`` and ``path-NNNN.params`` (``arg:``/``aux:`` keys), the files
        ``SymbolBlock.imports`` and MXNet's ``Module`` load."""
        if not self._cached_graph:
            raise RuntimeError("Please first call block.hybridize() and then run forward with this block at least "
                               "once before calling export.")
        sym = self._cached_graph[1]
        sym_file = "%s-symbol.json" % path
        sym.save(sym_file, remove_amp_cast=remove_amp_cast)
        arg_names = set(sym.list_arguments())
        aux_names = set(sym.list_auxiliary_states())
        arg_dict = {}
        for name, param in self.collect_params().items():
            if name in arg_names:
                arg_dict["arg:%s" % name] = param._reduce()
            elif name in aux_names:
                arg_dict["aux:%s" % name] = param._reduce()
        params_file = "%s-%04d.params" % (path, epoch)
        ndarray.save(params_file, arg_dict)
        return sym_file, params_file


def _formats_differ_by_trailing_none(fmt, traced_fmt):
    """Whether two top-level argument formats agree except for trailing arguments passed as None
    (left to their defaults) in one of them."""
    shorter, longer = (fmt, traced_fmt) if len(fmt) < len(traced_fmt) else (traced_fmt, fmt)
    return (len(shorter) != len(longer) and longer[:len(shorter)] == shorter
            and all(f == -1 for f in longer[len(shorter):]))


def _common_prefix(names):
    if not names:
        return ""
    prefix = names[0]
    for name in names:
        i = 0
        while i < len(prefix) and i < len(name) and prefix[i] == name[i]:
            i += 1
        prefix = prefix[:i]
    return prefix


class SymbolBlock(HybridBlock):
    """A block running a given symbol (a graph loaded from MXNet files, or traced)."""

    @staticmethod
    def imports(symbol_file, input_names, param_file=None, ctx=None, allow_missing=False, ignore_extra=False):
        """Load ``export``'s files: the graph, with ``input_names`` as inputs, and its parameters."""
        sym = symbol.load(symbol_file)
        if isinstance(input_names, str):
            input_names = [input_names]
        inputs = [symbol.var(i) for i in input_names]
        block = SymbolBlock(sym, inputs)
        if param_file is not None:
            block.collect_params().load(param_file, ctx=ctx, allow_missing=allow_missing, ignore_extra=ignore_extra,
                                        cast_dtype=True, dtype_source="saved")
        return block

    def __init__(self, outputs, inputs, params=None):
        super().__init__(prefix=None, params=None)
        self._prefix = ""
        self._params = ParameterDict("", params)
        if isinstance(inputs, Symbol) and len(inputs.list_outputs()) == 1:
            inputs = [inputs]
        if isinstance(outputs, (list, tuple)) and len(outputs) == 1:
            outputs = outputs[0]
        syms, self._in_format = _flatten(inputs, "input")
        out, self._out_format = _flatten(outputs, "output")
        out = symbol.Group(out) if len(out) > 1 else out[0]
        input_names = set()
        for sym in syms:
            if len(sym.get_internals().list_outputs()) != 1:
                raise AssertionError("Input symbols must be variable, but %s is an output of operators" % str(sym))
            input_names.add(sym.name)
        for name in out.list_arguments():
            if name not in input_names:
                self.params.get(name, allow_deferred_init=True)
        for name in out.list_auxiliary_states():
            if name not in input_names:
                self.params.get(name, grad_req="null", allow_deferred_init=True)
        self._cached_graph = syms, out
        prefix_len = len(_common_prefix(list(self._params.keys())))
        self._reg_params = {key[prefix_len:]: val for key, val in self._params.items()}

    def forward(self, x, *args):
        if isinstance(x, NDArray):
            with x.context:
                return self._call_cached_op(x, *args)
        args, in_fmt = _flatten([x] + list(args), "input")
        if in_fmt != self._in_format:
            raise AssertionError("Invalid input format")
        ret = copy.copy(self._cached_graph[1])
        ret._compose(**{k.name: v for k, v in zip(self._cached_graph[0], args)})
        return _regroup(list(ret), self._out_format)[0]

    def _clear_cached_op(self):
        graph = self._cached_graph
        super()._clear_cached_op()
        self._cached_graph = graph

    def hybrid_forward(self, F, x, *args, **kwargs):
        raise NotImplementedError
