"""Weight initializers (MXNet's ``mxnet.initializer``, ``mx.init``)."""

import json
import re

import numpy as np

from . import ndarray as nd
from .base import string_types

_REGISTRY = {}


def register(klass):
    """Make an initializer class creatable by its lower-case name (``'xavier'``)."""
    _REGISTRY[klass.__name__.lower()] = klass
    return klass


def create(init, **kwargs):
    """An initializer from an instance, a registered name, or MXNet's JSON ``["name", {...}]``."""
    if isinstance(init, Initializer):
        return init
    if isinstance(init, string_types):
        if init.startswith("["):
            name, params = json.loads(init)
            return _REGISTRY[name.lower()](**params)
        if init.lower() not in _REGISTRY:
            raise ValueError("Unknown initializer '%s'; known: %s" % (init, ", ".join(sorted(_REGISTRY))))
        return _REGISTRY[init.lower()](**kwargs)
    raise TypeError("initializer must be an Initializer or a name, got %r" % (init,))


class InitDesc(str):
    """A parameter name with its attributes (``__init__`` names a specific initializer)."""

    def __new__(cls, name, attrs=None, global_init=None):
        desc = super().__new__(cls, name)
        desc.attrs = attrs or {}
        desc.global_init = global_init
        return desc


class Initializer:
    """Fills parameters by the role their name ends with: weights by this initializer's rule,
    biases and betas with zeros, gammas with ones, running statistics with zeros/ones."""

    def __init__(self, **kwargs):
        self._kwargs = kwargs

    def dumps(self):
        return json.dumps([self.__class__.__name__.lower(), self._kwargs])

    def __call__(self, desc, arr):
        if not isinstance(desc, InitDesc):
            desc = InitDesc(desc)
        specific = desc.attrs.get("__init__", "")
        if specific:
            create(specific)._init_weight(desc, arr)
            return
        name = str(desc)
        if name.endswith("weight"):
            self._init_weight(desc, arr)
        elif name.endswith(("bias", "beta", "moving_mean", "running_mean", "min")):
            self._fill(arr, 0.0)
        elif name.endswith(("gamma", "moving_var", "running_var", "moving_inv_var", "max")):
            self._fill(arr, 1.0)
        else:
            self._init_default(desc, arr)

    @staticmethod
    def _fill(arr, value):
        arr[:] = value

    def _init_weight(self, desc, arr):
        raise NotImplementedError("%s must implement _init_weight" % self.__class__.__name__)

    def _init_default(self, desc, arr):
        raise ValueError("Unknown initialization pattern for %s. Default initialization is now limited to "
                         "\"weight\", \"bias\", \"gamma\" (1.0), and \"beta\" (0.0). Please use "
                         "mx.sym.Variable(init=mx.init.*) to set initialization pattern" % desc)

    def __repr__(self):
        return "%s(%s)" % (self.__class__.__name__, ", ".join("%s=%r" % kv for kv in self._kwargs.items()))


def _draw(arr, sampler, **kwargs):
    """Fill ``arr`` from ``mx.nd.random`` (so that ``mx.random.seed`` makes it reproducible)."""
    sampler(shape=arr.shape, dtype=arr.dtype if arr.dtype in (np.float32, np.float64, np.float16) else np.float32,
            ctx=arr.context, out=arr, **kwargs)


@register
class Zero(Initializer):
    def _init_weight(self, desc, arr):
        self._fill(arr, 0.0)

    _init_default = _init_weight


@register
class One(Initializer):
    def _init_weight(self, desc, arr):
        self._fill(arr, 1.0)

    _init_default = _init_weight


_REGISTRY["zeros"] = Zero
_REGISTRY["ones"] = One


@register
class Constant(Initializer):
    def __init__(self, value):
        super().__init__(value=value)
        self.value = value

    def _init_weight(self, desc, arr):
        arr[:] = self.value

    _init_default = _init_weight


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
        shape = arr.shape
        weight = np.zeros(int(np.prod(shape)), dtype="float32")
        f = np.ceil(shape[3] / 2.0)
        c = (2 * f - 1 - f % 2) / (2.0 * f)
        for i in range(weight.size):
            x = i % shape[3]
            y = (i // shape[3]) % shape[2]
            weight[i] = (1 - abs(x / f - c)) * (1 - abs(y / f - c))
        arr[:] = weight.reshape(shape)


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
