"""Optimizers (MXNet's ``mxnet.optimizer``)."""

from . import optimizer, contrib
from .optimizer import *  # noqa: F401,F403  (MXNet exports every optimizer at this level)
from .optimizer import __all__ as _optimizer_all

__all__ = _optimizer_all + ["contrib"]
