"""Imperative NDArray API (MXNet's ``mxnet.ndarray``); operator functions come from the registry."""

import os

from .. import _core
from .ndarray import NDArray, array, empty, zeros, ones, full, arange, eye, linspace, waitall
from .ndarray import moveaxis, split_v2, onehot_encode, fill_element_0index, from_numpy
from .cached_op import CachedOp
from . import register as _register
from .utils import save, load, load_frombuffer, save_tobuffer
from .dlpack import to_dlpack_for_read, to_dlpack_for_write, from_dlpack

_namespaces = _register.namespace_modules(__name__)
globals().update(_namespaces)  # _internal, contrib, linalg, image
_register.generate(globals(), _namespaces)
from . import ndarray as _ndarray_module  # noqa: E402
globals().update({name: getattr(_ndarray_module, name) for name in _ndarray_module._HELPERS})
true_divide = divide  # noqa: F821 (a helper installed above)
_core._register_python(NDArray, os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)
# MXNet keeps its element classification helpers in ``contrib`` (0/1 in the data's dtype).
contrib.isinf, contrib.isfinite, contrib.isnan = isinf, isfinite, isnan  # noqa: F821 (generated)
from . import control_flow as _control_flow  # noqa: E402
contrib.foreach, contrib.while_loop, contrib.cond = _control_flow.foreach, _control_flow.while_loop, _control_flow.cond  # noqa: F821
from . import random  # noqa: E402 (uses the generated operators)
from . import sparse  # noqa: E402
from .sparse import cast_storage  # noqa: E402
contrib.getnnz = sparse.getnnz  # noqa: F821 (generated)
from .updates import multi_adamw_update as _multi_adamw, multi_mp_adamw_update as _multi_mp_adamw  # noqa: E402
contrib.multi_adamw_update, contrib.multi_mp_adamw_update = _multi_adamw, _multi_mp_adamw  # noqa: F821


def concatenate(arrays, axis=0, always_copy=True):
    """Join arrays along an existing axis (MXNet's legacy helper)."""
    if not always_copy and len(arrays) == 1:
        return arrays[0]
    return Concat(*arrays, dim=axis)  # noqa: F821 (generated)
