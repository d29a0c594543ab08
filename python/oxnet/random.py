"""Random number generation (MXNet's ``mxnet.random``): seeding and the samplers of ``mx.nd.random``."""

from . import _core
from .ndarray.random import (uniform, normal, randn, gamma, exponential, poisson, negative_binomial,  # noqa: F401
                             generalized_negative_binomial, randint, multinomial, shuffle)


def seed(seed_state, ctx="all"):
    """Seed the generator. Seeds are drawn per operator in program order, so a seeded program
    produces the same numbers however the engine schedules it."""
    if not isinstance(seed_state, int):
        raise ValueError("seed_state must be an int")
    _core.seed(seed_state & 0xFFFFFFFFFFFFFFFF)
