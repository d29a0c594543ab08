"""Random number generation (MXNet's ``mxnet.random``)."""

from . import _core
from .ndarray import random as _nd_random


def seed(seed_state, ctx="all"):
    """Seed the generator. Seeds are drawn per operator in program order, so a seeded program
    produces the same numbers however the engine schedules it."""
    if not isinstance(seed_state, int):
        raise ValueError("seed_state must be an int")
    _core.seed(seed_state & 0xFFFFFFFFFFFFFFFF)


def uniform(low=0, high=1, shape=(1,), dtype=None, ctx=None, out=None, **kwargs):
    return _sample(_nd_random.uniform, dict(low=low, high=high), shape, dtype, ctx, out, kwargs)


def normal(loc=0, scale=1, shape=(1,), dtype=None, ctx=None, out=None, **kwargs):
    return _sample(_nd_random.normal, dict(loc=loc, scale=scale), shape, dtype, ctx, out, kwargs)


def _sample(fn, params, shape, dtype, ctx, out, kwargs):
    from .context import current_context
    from .base import dtype_name
    if isinstance(shape, int):
        shape = (shape,)
    params.update(kwargs)
    params["shape"] = tuple(shape) if out is None else tuple(out.shape)
    params["ctx"] = str(ctx if ctx is not None else (out.context if out is not None else current_context()))
    if dtype is not None or out is not None:
        params["dtype"] = dtype_name(dtype if dtype is not None else out.dtype)
    return fn(out=out, **params)
