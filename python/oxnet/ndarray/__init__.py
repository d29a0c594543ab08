"""Imperative NDArray API (MXNet's ``mxnet.ndarray``); operator functions come from the registry."""

import os
import sys
import types

from .. import _core
from .ndarray import NDArray, array, empty, zeros, ones, full, arange, eye, linspace, waitall
from . import register as _register
from .utils import save, load, load_frombuffer, save_tobuffer

_internal = types.ModuleType(__name__ + "._internal", "Internal operators (names with a leading underscore).")
contrib = types.ModuleType(__name__ + ".contrib", "Contributed operators (MXNet's _contrib_ names).")
for _module in (_internal, contrib):
    sys.modules[_module.__name__] = _module
_register.generate(globals(), _internal.__dict__, contrib.__dict__)
from . import ndarray as _ndarray_module  # noqa: E402
globals().update({name: getattr(_ndarray_module, name) for name in _ndarray_module._HELPERS})
_core._register_python(NDArray, os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)
from . import random  # noqa: E402 (uses the generated operators)
from . import sparse  # noqa: E402


def concatenate(arrays, axis=0, always_copy=True):
    """Join arrays along an existing axis (MXNet's legacy helper)."""
    if not always_copy and len(arrays) == 1:
        return arrays[0]
    return Concat(*arrays, dim=axis)  # noqa: F821 (generated)
