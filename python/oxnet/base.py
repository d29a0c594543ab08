"""Shared definitions: the error type and the dtype vocabulary (MXNet's ``mxnet.base``)."""

import numpy as np

from . import _core

MXNetError = _core.MXNetError
"""Raised for errors in operators, the engine, files and devices (a ``RuntimeError``)."""

numeric_types = (float, int, np.generic)
integer_types = (int, np.integer)
string_types = (str,)

#: MXNet's NumPy stand-in for bfloat16 (NumPy has no such type): 16-bit words.
bfloat16 = np.dtype([("bfloat16", np.uint16)])

mx_real_t = np.float32

_DTYPE_NAMES = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float64): "float64",
    np.dtype(np.float16): "float16",
    np.dtype(np.uint8): "uint8",
    np.dtype(np.int8): "int8",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
    np.dtype(np.bool_): "bool",
    bfloat16: "bfloat16",
}
_NP_TYPES = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "uint8": np.uint8,
    "int8": np.int8,
    "int32": np.int32,
    "int64": np.int64,
    "bool": np.bool_,
    "bfloat16": bfloat16,
}


def dtype_name(dtype):
    """Canonical oxnet name of a dtype given as a name, a NumPy type or a NumPy dtype."""
    if isinstance(dtype, str):
        if dtype in _NP_TYPES:
            return dtype
        if dtype == "bfloat16":
            return dtype
    try:
        return _DTYPE_NAMES[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise TypeError(
            "unsupported dtype %r; expected one of %s" % (dtype, ", ".join(sorted(_NP_TYPES)))
        ) from None


def np_dtype(name):
    """The NumPy type MXNet reports for a dtype name (``np.float32`` for 'float32')."""
    return _NP_TYPES[name]
