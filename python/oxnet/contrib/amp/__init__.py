"""Automatic mixed precision (MXNet's ``mxnet.contrib.amp``): not supported by oxnet yet."""

from .amp import *  # noqa: F401,F403
from .amp import __all__  # noqa: F401
