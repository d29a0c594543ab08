"""Shared definitions: the error type and the dtype vocabulary (MXNet's ``mxnet.base``)."""

import ctypes
import os

import numpy as np

from . import _core

MXNetError = _core.MXNetError
"""Raised for errors in operators, the engine, files and devices (a ``RuntimeError``)."""

numeric_types = (float, int, np.generic)
integer_types = (int, np.integer)
string_types = (str,)
py_bytes = bytes

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


class NotImplementedForSymbol(MXNetError):
    """Raised when a Symbol is asked for an NDArray-only operation (e.g. ``len(sym)``, ``sym.asnumpy``)."""

    def __init__(self, function, alias, *args):
        super().__init__()
        self.function = function.__name__ if callable(function) else str(function)
        self.alias = alias
        self.args = [str(type(a)) for a in args]

    def __str__(self):
        msg = "Function %s" % self.function
        if self.alias:
            msg += " (namely operator \"%s\")" % self.alias
        if self.args:
            msg += " with arguments (%s)" % ", ".join(self.args)
        return msg + " is not implemented for Symbol and only available in NDArray."


class NotSupportedForSparseNDArray(MXNetError):
    """Raised when a sparse-only storage operation is requested (oxnet stores every array densely)."""

    def __init__(self, function, alias, *args):
        super().__init__()
        self.function = function.__name__ if callable(function) else str(function)
        self.alias = alias
        self.args = [str(type(a)) for a in args]

    def __str__(self):
        msg = "Function %s" % self.function
        if self.alias:
            msg += " (namely operator \"%s\")" % self.alias
        if self.args:
            msg += " with arguments (%s)" % ", ".join(self.args)
        return msg + " is not supported for SparseNDArray and only available in NDArray."


def py_str(x):
    """Bytes from the core (or a str) as a Python str."""
    return x.decode("utf-8") if isinstance(x, bytes) else x


def c_str(string):
    """A str as the UTF-8 bytes a C API takes (kept for programs that build ctypes arguments)."""
    return string.encode("utf-8")


#: The library itself through ctypes, for programs that call MXNet's C API by name. It exports the
#: entry points that mean something in oxnet (``MXGetLastError``, ``MXNDArrayFromDLPack[Ex]``,
#: ``MXNDArrayFree``); see rust/python/src/c_api.rs.
_LIB = ctypes.CDLL(_core.__file__)
_LIB.MXGetLastError.restype = ctypes.c_char_p

# As MXNet's base module: the real result types of CPython's capsule functions, which programs
# passing DLPack capsules through ctypes rely on (ctypes' default int result truncates pointers).
ctypes.pythonapi.PyCapsule_New.restype = ctypes.py_object
ctypes.pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p

#: A C array handle (``NDArray(handle=...)`` takes one over).
NDArrayHandle = ctypes.c_void_p


def check_call(ret):
    """Raise the library's last error when a C call returned nonzero (MXNet's ``check_call``)."""
    if ret != 0:
        raise MXNetError(py_str(_LIB.MXGetLastError()))


def _as_list(obj):
    """``obj`` if it is a list or tuple (as a list), else ``[obj]``."""
    if isinstance(obj, (list, tuple)):
        return list(obj)
    return [obj]


class classproperty:
    """A read-only property of the class itself."""

    def __init__(self, getter):
        self.getter = getter

    def __get__(self, _instance, owner):
        return self.getter(owner)


def data_dir_default():
    """Where datasets and model files are kept when MXNET_HOME is unset: ``~/.mxnet``
    (``%APPDATA%\\mxnet`` on Windows), as in MXNet."""
    if os.name == "nt" and os.environ.get("APPDATA"):
        return os.path.join(os.environ["APPDATA"], "mxnet")
    return os.path.join(os.path.expanduser("~"), ".mxnet")


def data_dir():
    """MXNET_HOME if set, else :func:`data_dir_default`."""
    return os.getenv("MXNET_HOME", data_dir_default())
