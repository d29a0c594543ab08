"""Utilities with MXNet's names (``mxnet.util``): NumPy-semantics switches, environment access.

oxnet implements MXNet's legacy NDArray interface; the ``mx.np`` array interface is not built yet.
The NumPy-shape switch is honoured where it changes what a user sees: shapes given to and
returned by shape inference use -1 (unknown dimension) and None (unknown rank) instead of the
legacy 0 and (), and symbol JSON records ``is_np_shape``.
"""

import functools
import inspect
import os
import threading

_np_state = threading.local()


def _state():
    if not hasattr(_np_state, "shape"):
        _np_state.shape = False
    return _np_state


def is_np_shape():
    """Whether NumPy shape semantics are on in this thread (0 is a zero-size dimension, -1 is unknown)."""
    return _state().shape


def set_np_shape(active):
    """Turn NumPy shape semantics on or off for this thread; returns the previous state."""
    state = _state()
    previous, state.shape = state.shape, bool(active)
    return previous


class _NumpyShapeScope:
    """``with np_shape(True):`` sets the NumPy-shape switch for a block and restores it after."""

    def __init__(self, is_np_shape):  # pylint: disable=redefined-outer-name
        self._enter_is_np_shape = is_np_shape
        self._prev_is_np_shape = None

    def __enter__(self):
        if self._enter_is_np_shape is not None:
            self._prev_is_np_shape = set_np_shape(self._enter_is_np_shape)

    def __exit__(self, *exc):
        if self._enter_is_np_shape is not None and self._prev_is_np_shape != self._enter_is_np_shape:
            set_np_shape(self._prev_is_np_shape)


def np_shape(active=True):
    """A scope (``with np_shape():``) in which NumPy shape semantics are on (or off)."""
    return _NumpyShapeScope(active)


class _NumpyArrayScope:
    """The NumPy-array switch, kept per thread as MXNet keeps it (``_NumpyArrayScope._current``)."""

    _current = threading.local()

    def __init__(self, is_np_array):  # pylint: disable=redefined-outer-name
        self._old_scope = None
        self._is_np_array = is_np_array

    def __enter__(self):
        if not hasattr(_NumpyArrayScope._current, "value"):
            _NumpyArrayScope._current.value = _NumpyArrayScope(False)
        self._old_scope = _NumpyArrayScope._current.value
        _NumpyArrayScope._current.value = self
        return self

    def __exit__(self, *exc):
        assert self._old_scope is not None
        _NumpyArrayScope._current.value = self._old_scope


def is_np_array():
    """Whether the NumPy-array interface is on in this thread. oxnet's arrays are MXNet's
    legacy NDArrays; the switch is recorded for code that branches on it."""
    current = getattr(_NumpyArrayScope._current, "value", None)
    return bool(current._is_np_array) if current is not None else False


def np_array(active=True):
    """A scope in which :func:`is_np_array` is ``active``."""
    return _NumpyArrayScope(active)


def _wrap_in_scopes(func, shape, array):
    """``func`` (a function or a class, whose methods are wrapped) run with the switches set."""
    if inspect.isclass(func):
        for name, method in list(vars(func).items()):
            if inspect.isfunction(method) and not name.startswith("__") or name in ("__init__", "__call__"):
                if inspect.isfunction(method):
                    setattr(func, name, _wrap_in_scopes(method, shape, array))
        return func

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        with np_shape(shape), np_array(array):
            return func(*args, **kwargs)

    return wrapped


def use_np_shape(func):
    """Decorator: ``func`` (or every method of a class) runs with NumPy shape semantics."""
    return _wrap_in_scopes(func, True, is_np_array())


def use_np_array(func):
    """Decorator: ``func`` (or every method of a class) runs with the NumPy-array switch on."""
    return _wrap_in_scopes(func, is_np_shape(), True)


def use_np(func):
    """Decorator: both NumPy switches on while ``func`` (or a class's methods) run."""
    return _wrap_in_scopes(func, True, True)


def set_np(shape=True, array=True):
    """Set both NumPy switches for this thread (``array`` requires ``shape``, as in MXNet)."""
    if not shape and array:
        raise ValueError("NumPy shape semantics are required for NumPy array semantics")
    set_np_shape(shape)
    _NumpyArrayScope._current.value = _NumpyArrayScope(array)


def reset_np():
    """Both NumPy switches off."""
    set_np(shape=False, array=False)


def set_module(module):
    """Decorator overriding ``__module__`` (for documentation of re-exported functions)."""
    def decorator(func):
        if module is not None:
            func.__module__ = module
        return func
    return decorator


def getenv(name):
    """The environment variable ``name`` as the process sees it (None when unset)."""
    return os.environ.get(name)


def setenv(name, value):
    """Set (or with None, unset) an environment variable for this process."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = str(value)


def get_gpu_count():
    """Number of CUDA devices visible to oxnet."""
    from .context import num_gpus
    return num_gpus()


def makedirs(d):
    """Create a directory and its parents; an existing directory is fine."""
    os.makedirs(os.path.expanduser(d), exist_ok=True)
