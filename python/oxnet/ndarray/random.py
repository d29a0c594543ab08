"""Random sampling (MXNet's ``mxnet.ndarray.random``).

Scalar parameters draw ``shape`` samples (``_random_<dist>``); NDArray parameters draw ``shape``
samples per parameter element (``_sample_<dist>``), as MXNet does.
"""

from ..base import dtype_name
from ..context import current_context
from . import _internal
from .ndarray import NDArray


def _draw(scalar_op, sample_op, params, shape, dtype, ctx, out, kwargs):
    if isinstance(shape, int):
        shape = (shape,)
    if any(isinstance(p, NDArray) for p in params.values()):
        if not all(isinstance(p, NDArray) for p in params.values()):
            raise ValueError("Distribution parameters must all be NDArrays or all be scalars, got %s"
                             % {k: type(v).__name__ for k, v in params.items()})
        extra = {} if dtype is None else {"dtype": dtype_name(dtype)}
        return getattr(_internal, sample_op)(*params.values(), shape=tuple(shape or ()), out=out, **extra, **kwargs)
    args = dict(params, **kwargs)
    args["shape"] = tuple(out.shape) if out is not None else tuple(shape or (1,))
    args["ctx"] = str(ctx if ctx is not None else (out.context if out is not None else current_context()))
    if dtype is not None or out is not None:
        args["dtype"] = dtype_name(dtype if dtype is not None else out.dtype)
    return getattr(_internal, scalar_op)(out=out, **args)


def uniform(low=0, high=1, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Samples from a uniform distribution on [low, high)."""
    return _draw("_random_uniform", "_sample_uniform", {"low": low, "high": high}, shape, dtype, ctx, out, kwargs)


def normal(loc=0, scale=1, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Samples from a normal distribution with mean ``loc`` and standard deviation ``scale``."""
    return _draw("_random_normal", "_sample_normal", {"loc": loc, "scale": scale}, shape, dtype, ctx, out, kwargs)


def randn(*shape, loc=0, scale=1, dtype=None, ctx=None, out=None, **kwargs):
    """Normal samples of the given shape (positional dimensions)."""
    return normal(loc, scale, shape, dtype, ctx, out, **kwargs)


def gamma(alpha=1, beta=1, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Samples from a gamma distribution with shape ``alpha`` and scale ``beta``."""
    return _draw("_random_gamma", "_sample_gamma", {"alpha": alpha, "beta": beta}, shape, dtype, ctx, out, kwargs)


def exponential(scale=1, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Samples from an exponential distribution with the given scale (1 / rate)."""
    lam = 1.0 / scale
    return _draw("_random_exponential", "_sample_exponential", {"lam": lam}, shape, dtype, ctx, out, kwargs)


def poisson(lam=1, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Samples from a Poisson distribution with mean ``lam``."""
    return _draw("_random_poisson", "_sample_poisson", {"lam": lam}, shape, dtype, ctx, out, kwargs)


def negative_binomial(k=1, p=1, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Samples the number of failures before ``k`` successes with success probability ``p``."""
    return _draw("_random_negative_binomial", "_sample_negative_binomial", {"k": k, "p": p}, shape, dtype, ctx, out,
                 kwargs)


def generalized_negative_binomial(mu=1, alpha=1, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Samples from a negative binomial with mean ``mu`` and dispersion ``alpha``."""
    if isinstance(mu, NDArray):
        return _draw(None, "_sample_generalized_negative_binomial", {"mu": mu, "alpha": alpha}, shape, dtype, ctx, out,
                     kwargs)
    # Scalar parameters: draw from one-element parameter arrays and drop that axis.
    ctx = str(ctx if ctx is not None else current_context())
    shape = (shape,) if isinstance(shape, int) else tuple(shape or (1,))
    params = [_internal._full(shape=(1,), value=float(v), ctx=ctx) for v in (mu, alpha)]
    drawn = _internal._sample_generalized_negative_binomial(*params, shape=shape).reshape(shape)
    drawn = drawn if dtype is None else drawn.astype(dtype)
    return drawn if out is None else drawn.copyto(out)


def randint(low, high, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Samples integers uniformly from [low, high)."""
    return _draw("_random_randint", None, {"low": low, "high": high}, shape, dtype, ctx, out, kwargs)


def multinomial(data, shape=None, get_prob=False, out=None, dtype="int32", **kwargs):
    """Samples category indices from the probability distributions in the last axis of ``data``."""
    if isinstance(shape, int):
        shape = (shape,)
    return _internal._sample_multinomial(data, shape=tuple(shape or ()), get_prob=get_prob, out=out,
                                         dtype=dtype_name(dtype), **kwargs)


def shuffle(data, **kwargs):
    """A random permutation of ``data`` along its first axis."""
    return _internal._shuffle(data, **kwargs)
