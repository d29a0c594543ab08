"""Testing helpers with MXNet's names (``mxnet.test_utils``)."""

import contextlib
import os

import numpy as np

from .context import Context, current_context
from .ndarray import NDArray, array

_default_ctx = None

_DEFAULT_RTOL = {np.dtype(np.float16): 1e-2, np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-7}
_DEFAULT_ATOL = {np.dtype(np.float16): 1e-2, np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-9}


def default_context():
    """The context tests run on: set_default_context's, else MXNET_TEST_DEVICE's, else the current one."""
    if _default_ctx is not None:
        return _default_ctx
    device = os.environ.get("MXNET_TEST_DEVICE") or os.environ.get("OXNET_TEST_DEVICE")
    if device:
        kind, _, idx = device.partition(":")
        return Context(kind, int(idx or 0))
    return current_context()


def set_default_context(ctx):
    global _default_ctx
    _default_ctx = ctx


def _as_numpy(a):
    if isinstance(a, NDArray):
        return a.asnumpy()
    return np.asarray(a)


def _tolerances(a, b, rtol, atol):
    dtypes = [x.dtype for x in (a, b) if x.dtype.kind == "f"]
    loosest = max(dtypes, key=lambda d: _DEFAULT_RTOL.get(d, 0), default=np.dtype(np.float64))
    return (_DEFAULT_RTOL.get(loosest, 1e-7) if rtol is None else rtol,
            _DEFAULT_ATOL.get(loosest, 1e-9) if atol is None else atol)


def almost_equal(a, b, rtol=None, atol=None, equal_nan=False):
    a, b = _as_numpy(a), _as_numpy(b)
    rtol, atol = _tolerances(a, b, rtol, atol)
    return a.shape == b.shape and np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)


def assert_almost_equal(a, b, rtol=None, atol=None, names=("a", "b"), equal_nan=False):
    """Assert |a - b| <= atol + rtol * |b| element-wise, reporting the worst element."""
    a, b = _as_numpy(a), _as_numpy(b)
    if a.shape != b.shape:
        raise AssertionError("shape mismatch: %s %s vs %s %s" % (names[0], a.shape, names[1], b.shape))
    rtol, atol = _tolerances(a, b, rtol, atol)
    if np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan):
        return
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    err = np.abs(a64 - b64) - (atol + rtol * np.abs(b64))
    err = np.where(np.isnan(err), np.inf, err)
    idx = np.unravel_index(np.argmax(err), err.shape) if err.ndim else ()
    raise AssertionError(
        "Items are not equal (rtol=%g, atol=%g): worst at index %s: %s=%r, %s=%r\n %s: %s\n %s: %s"
        % (rtol, atol, idx, names[0], a[idx], names[1], b[idx], names[0], a, names[1], b))


def same(a, b):
    """Exact equality of shape and values."""
    return np.array_equal(_as_numpy(a), _as_numpy(b))


def rand_shape_nd(num_dim, dim=10):
    """A random shape of ``num_dim`` dims, each in [1, dim]."""
    return tuple(np.random.randint(1, dim + 1, size=num_dim).tolist())


def rand_shape_2d(dim0=10, dim1=10):
    return (np.random.randint(1, dim0 + 1), np.random.randint(1, dim1 + 1))


def rand_ndarray(shape, stype="default", density=None, dtype=None, ctx=None):
    """A dense NDArray of uniform values in [0, 1) (only the default storage type exists)."""
    if stype != "default":
        raise ValueError("only stype='default' is supported, got %r" % stype)
    data = np.random.uniform(size=shape)
    return array(data, ctx=ctx or default_context(), dtype=dtype or np.float32)


@contextlib.contextmanager
def environment(*args):
    """Set environment variables for a block: ``environment('K', 'v')`` or ``environment({'K': 'v'})``;
    a value of None unsets the variable."""
    if len(args) == 2:
        settings = {args[0]: args[1]}
    elif len(args) == 1 and isinstance(args[0], dict):
        settings = args[0]
    else:
        raise ValueError("environment takes (name, value) or a dict")
    saved = {k: os.environ.get(k) for k in settings}
    try:
        for k, v in settings.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def assert_exception(f, exception_type, *args, **kwargs):
    """Assert that ``f(*args, **kwargs)`` raises ``exception_type``."""
    try:
        f(*args, **kwargs)
    except exception_type:
        return
    raise AssertionError("%s did not raise %s" % (getattr(f, "__name__", f), exception_type.__name__))
