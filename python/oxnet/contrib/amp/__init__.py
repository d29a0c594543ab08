"""Automatic mixed precision (MXNet's ``mxnet.contrib.amp``): float16/bfloat16 training with
dynamic loss scaling, and conversion of float32 models for mixed-precision inference."""

from . import lists
from .amp import *  # noqa: F401,F403
from .amp import __all__  # noqa: F401
