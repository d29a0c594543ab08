"""Weight initializers (MXNet's ``mxnet.initializer``, ``mx.init``)."""

import json
import logging
import re
import warnings
from math import sqrt

import numpy as np

from . import ndarray as nd
from .base import string_types
from .ndarray import NDArray

_REGISTRY = {}


def register(klass):
    """Make an initializer class creatable by its lower-case name (``'xavier'``)."""
    if not (isinstance(klass, type) and issubclass(klass, Initializer)):
        raise TypeError("Can only register subclass of Initializer, got %r" % (klass,))
    name = klass.__name__.lower()
    if name in _REGISTRY and _REGISTRY[name] is not klass:
        warnings.warn("New initializer %s.%s is overriding existing initializer %s.%s"
                      % (klass.__module__, klass.__name__, _REGISTRY[name].__module__, _REGISTRY[name].__name__))
    _REGISTRY[name] = klass
    return klass


def alias(*aliases):
    """Class decorator: further names an initializer can be created by (``'zeros'``)."""
    def decorate(klass):
        for name in aliases:
            _REGISTRY[name.lower()] = klass
        return klass
    return decorate


def create(init, /, **kwargs):
    """An initializer from an instance, a registered name, or MXNet's JSON ``["name", {...}]``
    (what ``Initializer.dumps()`` writes)."""
    if isinstance(init, Initializer):
        return init
    if isinstance(init, string_types):
        if init.startswith("["):
            name, params = json.loads(init)
            return create(name, **params)
        if init.lower() not in _REGISTRY:
            raise ValueError("Unknown initializer '%s'; known: %s" % (init, ", ".join(sorted(_REGISTRY))))
        return _REGISTRY[init.lower()](**kwargs)
    raise TypeError("initializer must be an Initializer or a name, got %r" % (init,))


class InitDesc(str):
    """A parameter name with its attributes (``__init__`` names a specific initializer, as
    ``mx.sym.var(name, init=...)`` sets it) and the global initializer in use."""

    def __new__(cls, name, attrs=None, global_init=None):
        desc = super().__new__(cls, name)
        desc.attrs = attrs or {}
        desc.global_init = global_init
        return desc


class Initializer:
    """Fills a parameter by the role its name ends with: ``weight`` by this initializer's rule
    (``_init_weight``), ``bias``/``beta`` with zeros, ``gamma`` with ones (each an overridable
    ``_init_*`` method), unless its ``__init__`` attribute names another initializer."""

    def __init__(self, **kwargs):
        self._kwargs = kwargs
        self._verbose = False
        self._print_func = None

    def set_verbosity(self, verbose=False, print_func=None):
        """Log a statistic of every initialized array (by default its mean absolute value,
        ||x|| / sqrt(size))."""
        self._verbose = verbose
        if print_func is None:
            def print_func(x):
                return str((nd.norm(x) / sqrt(x.size)).asscalar())
        self._print_func = print_func
        return self

    def _verbose_print(self, desc, init, arr):
        if self._verbose and self._print_func:
            logging.info("Initialized %s as %s: %s", desc, init, self._print_func(arr))

    def dumps(self):
        """The initializer as MXNet's JSON ``["name", {kwargs}]`` (``create`` reads it back)."""
        return json.dumps([self.__class__.__name__.lower(), self._kwargs])

    # Name suffixes and the method that fills them, in MXNet's order of precedence.
    _ROLES = (("weight", "_init_weight"), ("bias", "_init_bias"), ("gamma", "_init_gamma"), ("beta", "_init_beta"),
              ("min", "_init_zero"), ("max", "_init_one"), ("weight_quantize", "_init_quantized_weight"),
              ("bias_quantize", "_init_quantized_bias"))
    # Running statistics of normalization layers: MXNet's symbols name their initializer in the
    # variable's __init__ attribute; these cover variables created without one.
    _RUNNING_STATS = (("moving_mean", "_init_zero"), ("running_mean", "_init_zero"), ("moving_var", "_init_one"),
                      ("running_var", "_init_one"), ("moving_inv_var", "_init_zero"), ("moving_avg", "_init_zero"))

    def __call__(self, desc, arr):
        if not isinstance(desc, InitDesc):
            self._legacy_init(desc, arr)
            return
        if desc.global_init is None:
            desc.global_init = self
        specific = desc.attrs.get("__init__", "")
        if specific:
            create(specific)._init_weight(desc, arr)
            self._verbose_print(desc, specific, arr)
            return
        for suffix, method in self._ROLES + self._RUNNING_STATS:
            if desc.endswith(suffix):
                getattr(self, method)(desc, arr)
                self._verbose_print(desc, suffix, arr)
                return
        self._init_default(desc, arr)

    def _legacy_init(self, name, arr):
        """MXNet 0.x's ``init(name, arr)``: the role comes from the name alone."""
        warnings.warn("Calling initializer with init(str, NDArray) has been deprecated. "
                      "please use init(mx.init.InitDesc(...), NDArray) instead.", DeprecationWarning, stacklevel=3)
        if not isinstance(name, string_types):
            raise TypeError("name must be string")
        if not isinstance(arr, NDArray):
            raise TypeError("arr must be NDArray")
        if name.startswith("upsampling"):
            self._init_bilinear(name, arr)
        elif name.startswith("stn_loc") and name.endswith("weight"):
            self._init_zero(name, arr)
        elif name.startswith("stn_loc") and name.endswith("bias"):
            self._init_loc_bias(name, arr)
        else:
            for suffix, method in (("bias", "_init_bias"), ("gamma", "_init_gamma"), ("beta", "_init_beta"),
                                   ("weight", "_init_weight")) + self._RUNNING_STATS + (
                                       ("min", "_init_zero"), ("max", "_init_one")):
                if name.endswith(suffix):
                    getattr(self, method)(name, arr)
                    return
            self._init_default(name, arr)

    def _init_bilinear(self, _, arr):
        arr[:] = _bilinear_kernel(arr.shape)

    def _init_loc_bias(self, _, arr):
        # The identity affine transform of a spatial transformer's localisation net.
        if arr.shape[0] != 6:
            raise ValueError("stn_loc bias must hold 6 values, got shape %s" % (arr.shape,))
        arr[:] = np.array([1.0, 0, 0, 0, 1.0, 0])

    def _init_zero(self, _, arr):
        arr[:] = 0.0

    def _init_one(self, _, arr):
        arr[:] = 1.0

    def _init_bias(self, _, arr):
        arr[:] = 0.0

    def _init_quantized_bias(self, _, arr):
        arr[:] = 0

    def _init_gamma(self, _, arr):
        arr[:] = 1.0

    def _init_beta(self, _, arr):
        arr[:] = 0.0

    def _init_weight(self, desc, arr):
        raise NotImplementedError("%s must implement _init_weight" % self.__class__.__name__)

    def _init_quantized_weight(self, _, arr):
        arr[:] = np.random.randint(-127, 127, size=arr.shape).astype(np.int8)

    def _init_default(self, desc, arr):
        raise ValueError("Unknown initialization pattern for %s. Default initialization is now limited to "
                         "\"weight\", \"bias\", \"gamma\" (1.0), and \"beta\" (0.0). Please use "
                         "mx.sym.Variable(init=mx.init.*) to set initialization pattern" % desc)

    def __eq__(self, other):
        if not isinstance(other, Initializer):
            return NotImplemented
        return type(self) is type(other) and self._kwargs == other._kwargs

    __hash__ = object.__hash__

    def __repr__(self):
        return "%s(%s)" % (self.__class__.__name__, ", ".join("%s=%r" % kv for kv in self._kwargs.items()))


def _bilinear_kernel(shape):
    """Bilinear upsampling weights of a (..., height, width) kernel."""
    weight = np.zeros(int(np.prod(shape)), dtype="float32")
    f = np.ceil(shape[3] / 2.0)
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    for i in range(weight.size):
        x = i % shape[3]
        y = (i // shape[3]) % shape[2]
        weight[i] = (1 - abs(x / f - c)) * (1 - abs(y / f - c))
    return weight.reshape(shape)


def _draw(arr, sampler, **kwargs):
    """Fill ``arr`` from ``mx.nd.random`` (so that ``mx.random.seed`` makes it reproducible)."""
    sampler(shape=arr.shape, dtype=arr.dtype if arr.dtype in (np.float32, np.float64, np.float16) else np.float32,
            ctx=arr.context, out=arr, **kwargs)


@register
@alias("zeros")
class Zero(Initializer):
    """Fills with zeros (whatever the parameter's name)."""

    def _init_weight(self, desc, arr):
        arr[:] = 0

    _init_default = _init_weight


@register
@alias("ones")
class One(Initializer):
    """Fills with ones (whatever the parameter's name)."""

    def _init_weight(self, desc, arr):
        arr[:] = 1

    _init_default = _init_weight


@register
class Constant(Initializer):
    """Fills with `value`: a scalar, or an array (NDArray or NumPy) that broadcasts to the
    parameter's shape."""

    def __init__(self, value):
        super().__init__(value=value)
        self.value = value

    def _init_weight(self, desc, arr):
        arr[:] = self.value

    _init_default = _init_weight

    def dumps(self):
        # JSON holds arrays as nested lists.
        value = self._kwargs["value"]
        if not np.isscalar(value):
            self._kwargs["value"] = value.tolist() if isinstance(value, np.ndarray) else value.asnumpy().tolist()
        return json.dumps([self.__class__.__name__.lower(), self._kwargs])


@register
class Uniform(Initializer):
    """Uniform on [-scale, scale]."""

    def __init__(self, scale=0.07):
        super().__init__(scale=scale)
        self.scale = scale

    def _init_weight(self, desc, arr):
        _draw(arr, nd.random.uniform, low=-self.scale, high=self.scale)


@register
class Normal(Initializer):
    """Normal with mean 0 and standard deviation sigma."""

    def __init__(self, sigma=0.01):
        super().__init__(sigma=sigma)
        self.sigma = sigma

    def _init_weight(self, desc, arr):
        _draw(arr, nd.random.normal, loc=0.0, scale=self.sigma)


@register
class Xavier(Initializer):
    """Glorot's scaling: variance from fan-in/fan-out (``factor_type``) times ``magnitude``."""

    def __init__(self, rnd_type="uniform", factor_type="avg", magnitude=3):
        super().__init__(rnd_type=rnd_type, factor_type=factor_type, magnitude=magnitude)
        self.rnd_type, self.factor_type, self.magnitude = rnd_type, factor_type, float(magnitude)

    def _init_weight(self, desc, arr):
        shape = arr.shape
        if len(shape) < 2:
            raise ValueError("Xavier initializer cannot be applied to vector %s. It requires at least 2D." % desc)
        hw_scale = float(np.prod(shape[2:])) if len(shape) > 2 else 1.0
        fan_in, fan_out = shape[1] * hw_scale, shape[0] * hw_scale
        factor = {"avg": (fan_in + fan_out) / 2.0, "in": fan_in, "out": fan_out}.get(self.factor_type)
        if factor is None:
            raise ValueError("Incorrect factor type")
        scale = np.sqrt(self.magnitude / factor)
        if self.rnd_type == "uniform":
            _draw(arr, nd.random.uniform, low=-scale, high=scale)
        elif self.rnd_type == "gaussian":
            _draw(arr, nd.random.normal, loc=0.0, scale=scale)
        else:
            raise ValueError("Unknown random type")


@register
class MSRAPrelu(Xavier):
    """He et al.'s initialization for PReLU networks."""

    def __init__(self, factor_type="avg", slope=0.25):
        super().__init__("gaussian", factor_type, 2.0 / (1 + slope ** 2))
        self._kwargs = {"factor_type": factor_type, "slope": slope}


@register
class Orthogonal(Initializer):
    """An orthogonal matrix (from the SVD of a random one), times ``scale``."""

    def __init__(self, scale=1.414, rand_type="uniform"):
        super().__init__(scale=scale, rand_type=rand_type)
        self.scale, self.rand_type = scale, rand_type

    def _init_weight(self, desc, arr):
        rows = arr.shape[0]
        cols = int(np.prod(arr.shape[1:]))
        sampler = nd.random.uniform if self.rand_type == "uniform" else nd.random.normal
        draw = sampler(shape=(rows, cols)).asnumpy()
        u, _, v = np.linalg.svd(draw, full_matrices=False)
        q = u if u.shape == draw.shape else v
        arr[:] = (self.scale * q).reshape(arr.shape)


@register
class Bilinear(Initializer):
    """Bilinear upsampling kernels (for Deconvolution weights)."""

    def _init_weight(self, desc, arr):
        arr[:] = _bilinear_kernel(arr.shape)


@register
class LSTMBias(Initializer):
    """LSTM biases: zeros, except the forget gate's (the second quarter), set to forget_bias."""

    def __init__(self, forget_bias=1.0):
        super().__init__(forget_bias=forget_bias)
        self.forget_bias = forget_bias

    def _init_weight(self, desc, arr):
        arr[:] = 0.0
        num_hidden = arr.shape[0] // 4
        arr[num_hidden:2 * num_hidden] = self.forget_bias


@register
class FusedRNN(Initializer):
    """The packed parameter vector of a fused ``RNN`` operator (``mx.rnn.FusedRNNCell``),
    initialized one gate weight at a time: by ``init`` (the global initializer when None), LSTM
    forget-gate biases set to ``forget_bias``."""

    def __init__(self, init, num_hidden, num_layers, mode, bidirectional=False, forget_bias=1.0):
        if isinstance(init, string_types):
            init = create(init)
        super().__init__(init=None if init is None else init.dumps(), num_hidden=num_hidden, num_layers=num_layers,
                         mode=mode, bidirectional=bidirectional, forget_bias=forget_bias)
        self._init = init
        self._num_hidden = num_hidden
        self._num_layers = num_layers
        self._mode = mode
        self._bidirectional = bidirectional
        self._forget_bias = forget_bias

    def _init_weight(self, desc, arr):
        from .rnn import rnn_cell
        cell = rnn_cell.FusedRNNCell(self._num_hidden, self._num_layers, self._mode, self._bidirectional,
                                     forget_bias=self._forget_bias, prefix="")
        weights = cell.unpack_weights({"parameters": arr})
        global_init = getattr(desc, "global_init", None)
        for name, weight in weights.items():
            if self._mode == "lstm" and name.endswith("_f_bias"):
                weight[:] = self._forget_bias
            elif self._init is not None:
                self._init(InitDesc(name, global_init=global_init), weight)
            elif global_init is not None:
                global_init(InitDesc(name, global_init=global_init), weight)
            else:
                raise ValueError("FusedRNN: no initializer for %s (pass init, or initialize through a global "
                                 "initializer)" % name)
        arr[:] = cell.pack_weights(weights)["parameters"]


class Load:
    """Initializes parameters from a dict of arrays or a ``.params`` file (``arg:``/``aux:``
    prefixes dropped); parameters it lacks go to `default_init`."""

    def __init__(self, param, default_init=None, verbose=False):
        if isinstance(param, string_types):
            param = nd.load(param)
        if not isinstance(param, dict):
            raise TypeError("Load expects a dict of name -> NDArray or a .params file name, got %r" % type(param))
        self.param = {}
        for name, arr in param.items():
            self.param[name[4:] if name.startswith(("arg:", "aux:")) else name] = arr
        self.default_init = default_init
        self.verbose = verbose

    def __call__(self, name, arr):
        if name in self.param:
            if arr.shape != self.param[name].shape:
                raise ValueError("Parameter %s cannot be initialized from loading. Shape mismatch, target %s vs "
                                 "loaded %s" % (name, arr.shape, self.param[name].shape))
            arr[:] = self.param[name]
            if self.verbose:
                logging.info("Initialized %s by loading", name)
            return
        if self.default_init is None:
            raise ValueError("Cannot Initialize %s. Not found in loaded param and no default Initializer is "
                             "provided." % name)
        self.default_init(name, arr)
        if self.verbose:
            logging.info("Initialized %s by default", name)


class Mixed:
    """The first initializer whose regular expression matches the parameter name."""

    def __init__(self, patterns, initializers):
        if len(patterns) != len(initializers):
            raise ValueError("patterns and initializers must have the same length")
        self.map = list(zip([re.compile(p) for p in patterns], initializers))

    def __call__(self, name, arr):
        for pattern, init in self.map:
            if pattern.match(name):
                init(name, arr)
                return
        raise ValueError("Parameter name %s did not match any pattern. Consider adding a \".*\" pattern at the "
                         "and with default Initializer." % name)
