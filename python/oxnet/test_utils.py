"""Helpers for testing code written against oxnet (MXNet's ``mxnet.test_utils``).

Comparison with dtype-aware tolerances (``assert_almost_equal``), random inputs, gradient checks
of symbols by finite differences (``check_numeric_gradient``), forward/backward checks against
expected values, consistency of a symbol across contexts and dtypes (``check_consistency``),
statistical checks of random generators, and small utilities for environment variables,
stderr and downloads.

The sparse helpers (``rand_sparse_ndarray``, ``create_sparse_array``...) build oxnet's CSR and
row-sparse arrays; gradient and optimizer checks with sparse storage raise ``NotImplementedError``.
"""

import bz2
from contextlib import contextmanager
import errno
import functools
import gzip
import json
import logging
import numbers
import os
import platform
import struct
import sys
import time
import traceback
import zipfile
from collections import OrderedDict

import numpy as np
import numpy.random as rnd
import numpy.testing as npt

import oxnet as mx
from .base import bfloat16
from .context import Context, current_context
from .ndarray import NDArray, array
from .symbol import Symbol

try:  # without a usable oxnet.util these names resolve on first use (module __getattr__)
    from .util import use_np, getenv, setenv
except Exception:  # pylint: disable=broad-except
    pass


# --------------------------------------------------------------------------------------------
# Contexts, dtypes and tolerances
# --------------------------------------------------------------------------------------------

def default_context():
    """The context tests run on: the current context of this thread (see set_default_context)."""
    return current_context()


def set_default_context(ctx):
    """Make ``ctx`` this thread's current context (``None``: back to ``cpu(0)``)."""
    from . import _core
    ctx = Context("cpu", 0) if ctx is None else Context(ctx)
    _core.set_current_context(ctx._as_tuple())


def default_dtype():
    """The dtype test data is created with unless a test asks for another."""
    return np.float32


def default_rtols():
    """Default relative tolerance per dtype."""
    return {np.dtype(np.float16): 1e-2, np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-5,
            np.dtype(np.bool_): 0, np.dtype(np.int8): 0, np.dtype(np.uint8): 0,
            np.dtype(np.int32): 0, np.dtype(np.uint32): 0, np.dtype(np.int64): 0,
            np.dtype(np.uint64): 0}


def default_atols():
    """Default absolute tolerance per dtype."""
    return {np.dtype(np.float16): 1e-1, np.dtype(np.float32): 1e-3, np.dtype(np.float64): 1e-20,
            np.dtype(np.bool_): 0, np.dtype(np.int8): 0, np.dtype(np.uint8): 0,
            np.dtype(np.int32): 0, np.dtype(np.uint32): 0, np.dtype(np.int64): 0,
            np.dtype(np.uint64): 0}


def default_numeric_eps():
    """Default finite-difference step per dtype (powers of two: exact as input deltas)."""
    return {np.dtype(np.float16): 2.0 ** -6, np.dtype(np.float32): 2.0 ** -9,
            np.dtype(np.float64): 2.0 ** -14}


def _dtype_of(dat):
    if isinstance(dat, (NDArray, np.ndarray, np.generic)):
        return np.dtype(dat.dtype)
    if hasattr(dat, "dtype"):
        try:
            return np.dtype(dat.dtype)
        except TypeError:
            pass
    return np.asarray(dat).dtype


def effective_dtype(dat):
    """The dtype whose tolerances apply to comparisons of ``dat``: its own dtype, except
    bfloat16, which is compared at float16 tolerances."""
    dtype = _dtype_of(dat)
    return np.dtype(np.float16) if dtype == bfloat16 else dtype


def _lookup_tol(table, dtype):
    if dtype in table:
        return table[dtype]
    if dtype.kind in "biu":
        return 0
    if dtype.kind == "f" and dtype.itemsize <= 2:
        return table[np.dtype(np.float16)]
    if dtype.kind == "f" and dtype.itemsize <= 4:
        return table[np.dtype(np.float32)]
    return table[np.dtype(np.float64)]


def get_tolerance(dat, tol, default_tol):
    """The tolerance for comparing ``dat``: ``tol`` if it is a number, else the entry of the dict
    ``tol`` (or of ``default_tol``) for ``dat``'s effective dtype."""
    if isinstance(tol, numbers.Number):
        return tol
    dtype = effective_dtype(dat)
    if tol is not None and dtype in tol:
        return tol[dtype]
    return _lookup_tol(default_tol, dtype)


def get_tols(x, y, rtol, atol):
    """(rtol, atol) for comparing ``x`` with ``y``: the looser of the two sides' tolerances."""
    return (max(get_tolerance(x, rtol, default_rtols()), get_tolerance(y, rtol, default_rtols())),
            max(get_tolerance(x, atol, default_atols()), get_tolerance(y, atol, default_atols())))


def get_atol(atol=None, dtype=np.dtype(np.float64)):
    """``atol``, or the default absolute tolerance of ``dtype``."""
    return _lookup_tol(default_atols(), np.dtype(dtype)) if atol is None else atol


def get_rtol(rtol=None, dtype=np.dtype(np.float64)):
    """``rtol``, or the default relative tolerance of ``dtype``."""
    return _lookup_tol(default_rtols(), np.dtype(dtype)) if rtol is None else rtol


def get_etol(etol=None):
    """``etol`` (the fraction of elements allowed to mismatch), 0 by default."""
    return 0 if etol is None else etol


# --------------------------------------------------------------------------------------------
# Random data and shapes
# --------------------------------------------------------------------------------------------

def random_arrays(*shapes):
    """Standard-normal NumPy arrays of default_dtype(), one per shape (a single array for one)."""
    arrays = [np.asarray(np.random.randn(*s), dtype=default_dtype()) for s in shapes]
    return arrays[0] if len(arrays) == 1 else arrays


def random_uniform_arrays(*shapes, **kwargs):
    """A list of uniform NumPy arrays, one per shape; keywords ``low`` (0), ``high`` (1), ``dtype``."""
    low = kwargs.pop("low", 0.0)
    high = kwargs.pop("high", 1.0)
    dtype = kwargs.pop("dtype", default_dtype())
    if kwargs:
        raise TypeError("Got unexpected argument/s : " + str(list(kwargs)))
    return [np.random.uniform(low, high, size=s).astype(dtype) for s in shapes]


def random_sample(population, k):
    """``k`` distinct elements of ``population`` in random order (drawn with np.random)."""
    assert 0 <= k <= len(population)
    items = list(population)
    np.random.shuffle(items)
    return items[:k]


def rand_shape_2d(dim0=10, dim1=10, allow_zero_size=False):
    low = 0 if allow_zero_size else 1
    return rnd.randint(low, dim0 + 1), rnd.randint(low, dim1 + 1)


def rand_shape_3d(dim0=10, dim1=10, dim2=10, allow_zero_size=False):
    low = 0 if allow_zero_size else 1
    return rnd.randint(low, dim0 + 1), rnd.randint(low, dim1 + 1), rnd.randint(low, dim2 + 1)


def rand_shape_nd(num_dim, dim=10, allow_zero_size=False):
    """A random shape of ``num_dim`` dims, each in [1, dim] ([0, dim] with allow_zero_size)."""
    low = 0 if allow_zero_size else 1
    return tuple(int(d) for d in rnd.randint(low, dim + 1, size=num_dim))


def rand_coord_2d(x_low, x_high, y_low, y_high):
    return (np.random.randint(x_low, x_high, dtype=np.int64),
            np.random.randint(y_low, y_high, dtype=np.int64))


def _no_sparse(stype):
    return NotImplementedError(
        "storage type %r is not supported here: oxnet's sparse arrays have no gradients or optimizer "
        "updates yet" % (stype,))


def rand_ndarray(shape, stype="default", density=None, dtype=None, modifier_func=None,
                 shuffle_csr_indices=False, distribution=None, ctx=None):
    """A random array of storage type ``stype``: dense standard-normal values (float32 unless
    ``dtype``), or a sparse array from ``rand_sparse_ndarray``, on ``ctx`` (default context)."""
    if stype == "default":
        return array(random_arrays(shape), ctx=ctx or default_context(), dtype=dtype)
    return rand_sparse_ndarray(shape, stype, density=density, dtype=dtype, distribution=distribution,
                               modifier_func=modifier_func, shuffle_csr_indices=shuffle_csr_indices, ctx=ctx)[0]


def _sparse_values(values, data_init, modifier_func):
    if data_init is not None:
        values[:] = data_init
    if modifier_func is not None:
        values = assign_each(values, modifier_func).astype(values.dtype)
    return values


def _powerlaw_csr(rows, cols, density, dtype):
    """A CSR matrix whose row ``i`` holds about twice the nonzeros of row ``i - 1`` (capped by the
    columns), until ``density`` of the matrix is filled: a power-law distribution over rows."""
    budget = max(1, int(round(density * rows * cols)))
    counts = np.zeros(rows, dtype=np.int64)
    per_row = 1
    for r in range(rows):
        take = min(per_row, cols, budget)
        counts[r], budget, per_row = take, budget - take, per_row * 2
        if budget == 0:
            break
    indices = np.concatenate([np.sort(np.random.choice(cols, n, replace=False)) for n in counts] or [[]])
    indptr = np.concatenate([[0], np.cumsum(counts)])
    return np.random.uniform(size=len(indices)).astype(dtype), indices.astype(np.int64), indptr


def rand_sparse_ndarray(shape, stype, density=None, dtype=None, distribution=None, data_init=None,
                        rsp_indices=None, modifier_func=None, shuffle_csr_indices=False, ctx=None):
    """A random sparse array and its components as NumPy arrays: ``(csr, (data, indices,
    indptr))`` or ``(row_sparse, (data, indices))``. ``density`` (random when None) is the share
    of nonzero values (csr) or stored rows (row_sparse); ``rsp_indices`` fixes the stored rows;
    ``data_init`` fills every stored value; ``modifier_func`` maps each one;
    ``distribution`` 'uniform' (default) or 'powerlaw' (csr); ``shuffle_csr_indices`` leaves each
    row's column indices unsorted."""
    from .ndarray import sparse
    density = rnd.rand() if density is None else density
    dtype = np.dtype(default_dtype() if dtype is None else dtype)
    ctx = ctx or default_context()
    if stype == "row_sparse":
        if distribution not in (None, "uniform"):
            raise ValueError("rand_sparse_ndarray: row_sparse arrays have the uniform distribution only, got %r"
                             % (distribution,))
        if rsp_indices is not None:
            indices = np.sort(np.asarray(rsp_indices, dtype=np.int64))
        else:
            indices = np.nonzero(np.random.rand(shape[0]) < density)[0].astype(np.int64)
        values = np.random.uniform(size=(len(indices),) + tuple(shape[1:])).astype(dtype)
        values = _sparse_values(values, data_init, modifier_func)
        return sparse.row_sparse_array((values, indices), shape=shape, ctx=ctx, dtype=dtype), (values, indices)
    if stype == "csr":
        if len(shape) != 2:
            raise ValueError("rand_sparse_ndarray: csr arrays are 2-D, got shape %s" % (shape,))
        if distribution in (None, "uniform"):
            mask = np.random.rand(*shape) < density
            rows, cols = np.nonzero(mask)
            values = np.random.uniform(size=len(rows)).astype(dtype)
            indices = cols.astype(np.int64)
            indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=shape[0]))]).astype(np.int64)
        elif distribution == "powerlaw":
            values, indices, indptr = _powerlaw_csr(shape[0], shape[1], density, dtype)
        else:
            raise ValueError("rand_sparse_ndarray: unknown distribution %r" % (distribution,))
        values = _sparse_values(values, data_init, modifier_func)
        if shuffle_csr_indices:
            for r in range(shape[0]):
                np.random.shuffle(indices[indptr[r]:indptr[r + 1]])
        result = sparse.csr_matrix((values, indices, indptr), shape=shape, ctx=ctx, dtype=dtype)
        return result, (values, indices, indptr)
    raise ValueError("rand_sparse_ndarray: unknown storage type %r" % (stype,))


def create_sparse_array(shape, stype, data_init=None, rsp_indices=None, dtype=None,
                        modifier_func=None, density=.5, shuffle_csr_indices=False):
    """A random sparse array (``rand_sparse_ndarray`` without its components)."""
    return rand_sparse_ndarray(shape, stype, density=density, dtype=dtype, data_init=data_init,
                               rsp_indices=rsp_indices, modifier_func=modifier_func,
                               shuffle_csr_indices=shuffle_csr_indices)[0]


def create_sparse_array_zd(shape, stype, density, data_init=None, rsp_indices=None, dtype=None,
                           modifier_func=None, shuffle_csr_indices=False):
    """``create_sparse_array`` where density 0 is allowed (row_sparse: no stored rows)."""
    if stype == "row_sparse" and density == 0:
        rsp_indices = []
    return create_sparse_array(shape, stype, data_init=data_init, rsp_indices=rsp_indices, dtype=dtype,
                               modifier_func=modifier_func, density=density,
                               shuffle_csr_indices=shuffle_csr_indices)


def shuffle_csr_column_indices(csr):
    """Shuffle the column indices within each row of a SciPy CSR matrix, in place."""
    for r in range(len(csr.indptr) - 1):
        np.random.shuffle(csr.indices[csr.indptr[r]:csr.indptr[r + 1]])


def assign_each(the_input, function):
    """``function`` applied to every element of ``the_input`` (a float64 array; a copy if None)."""
    if function is None:
        return np.array(the_input)
    the_input = np.asarray(the_input)
    return np.array([function(v) for v in the_input.reshape(-1)], dtype=np.float64).reshape(the_input.shape)


def assign_each2(input1, input2, function):
    """``function`` applied to matching elements of two same-shaped arrays (a float64 array)."""
    if function is None:
        return np.array(input1)
    input1, input2 = np.asarray(input1), np.asarray(input2)
    assert input1.shape == input2.shape
    out = [function(x, y) for x, y in zip(input1.reshape(-1), input2.reshape(-1))]
    return np.array(out, dtype=np.float64).reshape(input1.shape)


def create_2d_tensor(rows, columns, dtype=np.int64):
    """A (rows, columns) NDArray whose row i holds the value i."""
    column = mx.nd.arange(0, rows, dtype=dtype).reshape(rows, 1)
    return mx.nd.broadcast_to(column, shape=(rows, columns))


def create_vector(size, dtype=np.int64):
    """The NDArray [0, 1, ..., size - 1]."""
    return mx.nd.arange(0, size, dtype=dtype)


def get_identity_mat(size):
    """A (size, size) float32 identity NDArray."""
    return array(np.eye(size, dtype=np.float32))


def get_identity_mat_batch(size):
    """Two (size, size) identity matrices stacked: shape (2, size, size)."""
    return array(np.stack([np.eye(size, dtype=np.float32)] * 2))


def new_matrix_with_real_eigvals_2d(n):
    """A well-conditioned (n, n) matrix whose eigenvalues are real, drawn from (-10, 10)."""
    while True:
        q, _ = np.linalg.qr(np.random.randn(n, n))
        # an orthogonal matrix scaled per column: condition number at most 2.5
        basis = q * np.random.uniform(1.0, 2.5, size=n) * np.random.choice([-1.0, 1.0], size=n)
        if np.linalg.cond(basis, 2) < 3:
            break
    eigvals = np.diag(np.random.uniform(-10.0, 10.0, n))
    return np.linalg.inv(basis) @ eigvals @ basis


def new_matrix_with_real_eigvals_nd(shape):
    """A batch of matrices (last two dims square) as new_matrix_with_real_eigvals_2d makes."""
    count = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    return np.array([new_matrix_with_real_eigvals_2d(shape[-1]) for _ in range(count)]).reshape(shape)


def new_orthonormal_matrix_2d(n):
    """A random (n, n) orthonormal matrix."""
    q, _ = np.linalg.qr(np.random.randn(n, n))
    return q


def new_sym_matrix_with_real_eigvals_2d(n):
    """A random symmetric (n, n) matrix with eigenvalues drawn from (-10, 10)."""
    q = new_orthonormal_matrix_2d(n)
    return q.T @ np.diag(np.random.uniform(-10.0, 10.0, n)) @ q


def new_sym_matrix_with_real_eigvals_nd(shape):
    """A batch of symmetric matrices as new_sym_matrix_with_real_eigvals_2d makes."""
    count = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    return np.array([new_sym_matrix_with_real_eigvals_2d(shape[-1]) for _ in range(count)]).reshape(shape)


# --------------------------------------------------------------------------------------------
# NumPy helpers
# --------------------------------------------------------------------------------------------

def np_reduce(dat, axis, keepdims, numpy_reduce_func):
    """Reduce ``dat`` with ``numpy_reduce_func`` (e.g. np.sum) over ``axis`` (int, sequence or
    None for all), one axis at a time, optionally keeping reduced dims as size 1."""
    if axis is None:
        axes = list(range(dat.ndim))
    elif isinstance(axis, numbers.Integral):
        axes = [int(axis)]
    else:
        axes = list(axis)
    axes = sorted(a % dat.ndim if dat.ndim else a for a in axes)
    ret = dat
    for a in reversed(axes):
        ret = numpy_reduce_func(ret, axis=a)
    if keepdims:
        ret = np.asarray(ret).reshape(tuple(1 if i in axes else d for i, d in enumerate(dat.shape)))
    return ret


def collapse_sum_like(a, shape):
    """Sum ``a`` down to ``shape`` (which must broadcast to a.shape): the reduction a broadcast's
    gradient performs."""
    assert a.ndim >= len(shape)
    if np.prod(shape) == 0 or a.size == 0:
        return np.zeros(shape, dtype=a.dtype)
    lead = a.ndim - len(shape)
    axes = list(range(lead))
    for i, s in enumerate(shape):
        if s != a.shape[lead + i]:
            assert s == 1, "shape %s does not broadcast to %s" % (shape, a.shape)
            axes.append(lead + i)
    return np.sum(a, axis=tuple(axes)).reshape(shape)


# --------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------

def _to_numpy(x):
    """A NumPy array for an NDArray, a NumPy value, a Python number or a list (bfloat16 as float32)."""
    if isinstance(x, NDArray):
        if x.dtype == bfloat16:
            x = x.astype(np.float32)
        return x.asnumpy()
    if not isinstance(x, np.ndarray) and hasattr(x, "asnumpy"):
        x = x.asnumpy()
    x = np.asarray(x)
    if x.dtype == bfloat16:
        x = (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return x


def same(a, b):
    """Whether ``a`` and ``b`` (NumPy arrays or NDArrays) have equal shapes and values."""
    return np.array_equal(_to_numpy(a), _to_numpy(b))


def checkShapes(a, b):
    """Raise AssertionError unless ``a`` and ``b`` have the same shape."""
    if np.shape(a) != np.shape(b):
        raise AssertionError("shape mismatch: a.shape = %s and b.shape = %s are not equal"
                             % (np.shape(a), np.shape(b)))


def _broadcast_or_fail(a, b, names):
    try:
        return np.broadcast_arrays(a, b)
    except ValueError:
        raise AssertionError("shape mismatch: %s %s vs %s %s cannot be compared"
                             % (names[0], a.shape, names[1], b.shape)) from None


def almost_equal(a, b, rtol=None, atol=None, equal_nan=False, use_broadcast=True):
    """Whether |a - b| <= atol + rtol * |b| everywhere (NumPy's allclose); unset tolerances take
    the float64 defaults. Shapes that do not broadcast compare unequal."""
    a, b = _to_numpy(a), _to_numpy(b)
    if not use_broadcast:
        checkShapes(a, b)
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        return False
    if isinstance(rtol, dict) or isinstance(atol, dict):  # per-dtype tolerances
        rtol, atol = get_tols(a, b, rtol, atol)
    return bool(np.allclose(a, b, rtol=get_rtol(rtol), atol=get_atol(atol), equal_nan=equal_nan))


def _violation(a, b, rtol, atol, equal_nan=False):
    """|a - b| in units of the tolerance atol + rtol*|b| (same-shaped float64 result; equal
    values, infinities included, give 0; a NaN mismatch gives inf)."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(a == b, 0.0, np.abs(a - b))
        viol = diff / (atol + rtol * np.abs(b) + 1e-20)
    nan = np.isnan(viol)
    if equal_nan:
        nan &= ~(np.isnan(a) & np.isnan(b))
        viol = np.where(np.isnan(a) & np.isnan(b), 0.0, viol)
    return np.where(nan, np.inf, viol)


def find_max_violation(a, b, rtol=None, atol=None):
    """(index, violation) of the element of ``a`` farthest from ``b`` in units of the tolerance
    atol + rtol*|b|; a violation above 1 is a mismatch."""
    a, b = _to_numpy(a), _to_numpy(b)
    rtol, atol = get_tols(a, b, rtol, atol)
    viol = _violation(a, b, rtol, atol)
    if viol.size == 0:
        return (), 0.0
    idx = np.unravel_index(int(np.argmax(viol)), viol.shape)
    return idx, float(viol[idx])


_find_max_violation = find_max_violation


def _fmt(value):
    value = value.item() if hasattr(value, "item") else value
    return "%.8g" % value if isinstance(value, float) else repr(value)


def locationError(a, b, index, names, maxError=False):
    """One line naming the location ``index`` and the two values there."""
    return "Location of %serror: %s, %s=%s, %s=%s" % (
        "maximum " if maxError else "", tuple(int(i) for i in index), names[0], _fmt(a[index]),
        names[1], _fmt(b[index]))


def _mismatch_message(a, b, rtol, atol, names, equal_nan, mismatches, header=None):
    a, b = np.broadcast_arrays(a, b)
    viol = _violation(a, b, rtol, atol, equal_nan)
    bad = viol > 1
    n_bad = int(bad.sum())
    flat = viol.reshape(-1)
    worst = np.argsort(-flat, kind="stable")[:max(int(mismatches[0]), 1)]
    worst = [i for i in worst if flat[i] > 1] or [int(np.argmax(flat))]
    locs = [np.unravel_index(int(i), viol.shape) for i in worst]
    lines = [header or "Arrays are not almost equal",
             "Error %s exceeds tolerance rtol=%g, atol=%g (%d of %d elements mismatch, %.4g%%)."
             % (_fmt(flat[worst[0]]), rtol, atol, n_bad, a.size, 100.0 * n_bad / max(a.size, 1)),
             locationError(a, b, locs[0], names, maxError=True)]
    if len(locs) > 1:
        lines.append("Largest errors (error: location):")
        lines += ["  %3d: %s  %s" % (k + 1, _fmt(flat[i]), locationError(a, b, loc, names))
                  for k, (i, loc) in enumerate(zip(worst, locs))]
    for name, arr in zip(names, (a, b)):
        lines.append(" %s: %s" % (name, np.array2string(arr, threshold=24, edgeitems=3)))
    return "\n".join(lines)


def assert_almost_equal(a, b, rtol=None, atol=None, names=("a", "b"), equal_nan=False,
                        use_broadcast=True, mismatches=(10, 10)):
    """Assert |a - b| <= atol + rtol * |b| element-wise (NDArrays, NumPy arrays or numbers).

    Unset tolerances (or dicts of dtype -> tolerance lacking an entry) take the defaults of the
    less precise of the two dtypes. On failure the AssertionError names the largest violation's
    index and values and lists up to ``mismatches[0]`` of the worst elements.
    ``use_broadcast=False`` requires equal shapes; boolean arrays must match exactly.
    """
    rtol, atol = get_tols(a, b, rtol, atol)
    if _compared_in_place(a, b) and mx.nd.contrib.allclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan).asscalar() == 1:
        return
    a, b = _to_numpy(a), _to_numpy(b)
    if not use_broadcast:
        checkShapes(a, b)
    _broadcast_or_fail(a, b, names)
    if a.dtype == np.bool_ and b.dtype == np.bool_:  # exact, and NumPy cannot subtract bools
        rtol = atol = 0
        a, b = a.astype(np.int8), b.astype(np.int8)
    if np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan):
        return
    raise AssertionError(_mismatch_message(a, b, rtol, atol, names, equal_nan, mismatches))


def _compared_in_place(a, b):
    """Whether two arrays are compared where they live, by the allclose operator, as MXNet does:
    dense NDArrays of one shape, dtype and context. Copying large arrays out to compare them
    in NumPy costs more than most computations under test (float16 most of all); only a
    failing comparison is repeated in NumPy, for its message."""
    return (isinstance(a, NDArray) and isinstance(b, NDArray) and a.stype == "default" == b.stype
            and a.shape == b.shape and a.dtype == b.dtype and a.dtype != np.bool_ and a.context == b.context)


def assert_allclose(a, b, rtol=1e-07, atol=0, equal_nan=True):
    """assert_almost_equal with NumPy's assert_allclose defaults."""
    assert_almost_equal(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)


def assert_almost_equal_with_err(a, b, rtol=None, atol=None, etol=None, names=("a", "b"),
                                 equal_nan=False, mismatches=(10, 10)):
    """assert_almost_equal that tolerates a fraction ``etol`` of mismatching elements."""
    etol = get_etol(etol)
    if etol <= 0:
        assert_almost_equal(a, b, rtol=rtol, atol=atol, names=names, equal_nan=equal_nan,
                            mismatches=mismatches)
        return
    rtol, atol = get_tols(a, b, rtol, atol)
    a, b = _to_numpy(a), _to_numpy(b)
    a, b = _broadcast_or_fail(a, b, names)
    close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
    err = 1 - np.count_nonzero(close) / max(close.size, 1)
    if err > etol:
        raise AssertionError(_mismatch_message(
            a, b, rtol, atol, names, equal_nan, mismatches,
            header="Mismatch rate %.4g exceeds etol=%g" % (err, etol)))


def assert_almost_equal_ignore_nan(a, b, rtol=None, atol=None, names=("a", "b")):
    """assert_almost_equal after zeroing every position where either side is NaN."""
    a, b = np.array(_to_numpy(a)), np.array(_to_numpy(b))
    a, b = (np.array(x) for x in np.broadcast_arrays(a, b))
    nan = np.isnan(a) | np.isnan(b)
    a[nan] = 0
    b[nan] = 0
    assert_almost_equal(a, b, rtol, atol, names)


def assert_exception(f, exception_type, *args, **kwargs):
    """Assert that ``f(*args, **kwargs)`` raises ``exception_type``."""
    try:
        f(*args, **kwargs)
    except exception_type:
        return
    raise AssertionError("%s did not raise %s" % (getattr(f, "__name__", f), exception_type.__name__))


def retry(n):
    """Decorator: run a stochastic test up to ``n`` times, failing only if every run fails an
    assertion."""
    assert n > 0

    def decorate(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            for attempt in range(n):
                try:
                    return f(*args, **kwargs)
                except AssertionError:
                    if attempt == n - 1:
                        raise
                    mx.nd.waitall()
        return wrapper
    return decorate


def same_array(array1, array2):
    """Whether two NDArrays share memory: writes through ``array1``, reads ``array2``, then
    restores ``array1``."""
    saved = array1.copy()
    array1[:] = saved + 1
    shared = same(array1, array2)
    array1[:] = saved
    return shared and same(array1, array2)


def compare_ndarray_tuple(t1, t2, rtol=None, atol=None):
    """assert_almost_equal over matching leaves of two (nested) tuples; None on either side skips."""
    if t1 is None or t2 is None:
        return
    if isinstance(t1, tuple):
        for s1, s2 in zip(t1, t2):
            compare_ndarray_tuple(s1, s2, rtol, atol)
    else:
        assert_almost_equal(t1, t2, rtol=rtol, atol=atol)


def same_symbol_structure(sym1, sym2):
    """Whether two symbols' graphs have the same operator at every node position both have (as
    in MXNet, a graph with extra nodes at the end, an output amp_cast say, still matches)."""
    nodes1 = json.loads(sym1.tojson())["nodes"]
    nodes2 = json.loads(sym2.tojson())["nodes"]
    return all(n1["op"] == n2["op"] for n1, n2 in zip(nodes1, nodes2))


# --------------------------------------------------------------------------------------------
# Symbols: forward, backward and gradient checks
# --------------------------------------------------------------------------------------------

def _set(arr, value):
    """Write ``value`` (NumPy, NDArray or number) into NDArray ``arr``."""
    if isinstance(value, np.ndarray) and value.dtype != arr.dtype and arr.dtype != bfloat16:
        value = value.astype(arr.dtype)
    arr[:] = value


def _nd(value, ctx, dtype):
    """An NDArray for ``value`` on ``ctx``: NDArrays pass through; ``dtype='asnumpy'`` keeps the
    NumPy dtype."""
    if isinstance(value, NDArray):
        return value
    value = np.asarray(value)
    return array(value, ctx=ctx, dtype=value.dtype if _is_asnumpy(dtype) else dtype)


def _is_asnumpy(dtype):
    return isinstance(dtype, str) and dtype == "asnumpy"


def _check_dtype(dtype, allow_asnumpy=True):
    if allow_asnumpy and _is_asnumpy(dtype):
        return dtype
    if np.dtype(dtype) not in (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError("dtype must be float16, float32 or float64%s, got %r"
                         % (" or 'asnumpy'" if allow_asnumpy else "", dtype))
    return np.dtype(dtype)


def _sorted_items(d):
    return sorted(d.items(), key=lambda t: t[0])


def _sorted_dict(d):
    return OrderedDict(_sorted_items(d))


def _parse_location(sym, location, ctx, dtype=default_dtype()):
    """The argument values of ``sym`` as a name-sorted dict of NDArrays on ``ctx``. ``location``
    is a dict by argument name (all arguments) or a list in ``sym.list_arguments()`` order."""
    names = sym.list_arguments()
    if isinstance(location, dict):
        if set(location) != set(names):
            raise ValueError("Symbol arguments and keys of the given location do not match: "
                             "symbol args %s, location keys %s" % (sorted(names), sorted(location)))
    elif isinstance(location, (list, tuple)):
        location = dict(zip(names, location))
    else:
        raise TypeError("location must be a dict or a list, got %s" % type(location).__name__)
    return _sorted_dict({k: _nd(v, ctx, dtype) for k, v in location.items()})


def _parse_aux_states(sym, aux_states, ctx, dtype=default_dtype()):
    """The auxiliary states of ``sym`` as a dict of NDArrays (None stays None)."""
    if aux_states is None:
        return None
    names = sym.list_auxiliary_states()
    if isinstance(aux_states, dict):
        if set(aux_states) != set(names):
            raise ValueError("Symbol aux_states names and given aux_states do not match: "
                             "symbol aux names %s, given %s" % (sorted(names), sorted(aux_states)))
    else:
        aux_states = dict(zip(names, aux_states))
    return {k: _nd(v, ctx, dtype) for k, v in aux_states.items()}


def simple_forward(sym, ctx=None, is_train=False, **inputs):
    """Run ``sym`` once on NumPy ``inputs`` (by argument name); NumPy outputs (one array when
    the symbol has one output)."""
    ctx = ctx or default_context()
    exe = sym.bind(ctx, args={k: array(v, ctx=ctx) for k, v in inputs.items()})
    exe.forward(is_train=is_train)
    outputs = [x.asnumpy() for x in exe.outputs]
    return outputs[0] if len(outputs) == 1 else outputs


def numeric_grad(executor, location, aux_states=None, eps=1e-4, use_forward_train=True,
                 dtype=default_dtype()):
    """Central finite differences of sum(executor.outputs[0]) with respect to every floating
    argument in ``location`` (dict of name -> NumPy array), moving one element at a time by
    +-eps/2. Returns a dict of name -> NumPy gradient; the executor's arguments are restored."""
    dtype = _check_dtype(dtype, allow_asnumpy=False)
    for name, value in location.items():
        _set(executor.arg_dict[name], np.asarray(value, dtype=dtype))

    def run():
        if aux_states is not None:
            for key, val in aux_states.items():
                _set(executor.aux_dict[key], np.asarray(_to_numpy(val), dtype=dtype))
        executor.forward(is_train=use_forward_train)
        return _to_numpy(executor.outputs[0]).astype(np.float64).sum()

    grads = {}
    for name, value in location.items():
        grads[name] = np.zeros(np.shape(value), dtype=dtype)
        if np.asarray(value).dtype.kind != "f":  # integer inputs (indices, labels) stay fixed
            continue
        value = np.array(value, dtype=dtype, order="C")
        flat = value.reshape(-1)
        target = executor.arg_dict[name]
        for i in range(flat.size):
            orig = flat[i]
            flat[i] = orig + eps / 2.0
            _set(target, value)
            f_plus = run()
            flat[i] = orig - eps / 2.0
            _set(target, value)
            f_minus = run()
            grads[name].reshape(-1)[i] = (f_plus - f_minus) / eps
            flat[i] = orig
        _set(target, value)
    return grads


def check_numeric_gradient(sym, location, aux_states=None, numeric_eps=None, rtol=None,
                           atol=None, grad_nodes=None, use_forward_train=True, ctx=None,
                           grad_stype_dict=None, dtype=default_dtype()):
    """Check the gradients ``sym`` computes against finite differences.

    The (single) output is multiplied by a fixed random projection so that every output element
    matters; the backward pass of sum(output * projection) is then compared, for each node of
    ``grad_nodes`` (all arguments by default; a list, or a dict name -> 'write'/'add'/'null'),
    with numeric_grad's estimate (names 'NUMERICAL_<arg>' and 'BACKWARD_<arg>' in failures).
    """
    dtype = _check_dtype(dtype, allow_asnumpy=False)
    ctx = ctx or default_context()
    if grad_stype_dict and any(v not in (None, "default") for v in grad_stype_dict.values()):
        raise _no_sparse([v for v in grad_stype_dict.values() if v != "default"][0])
    location = _parse_location(sym, location, ctx, dtype)
    location_npy = {k: v.asnumpy() for k, v in location.items()}
    aux_states = _parse_aux_states(sym, aux_states, ctx, dtype)
    aux_states_npy = None if aux_states is None else {k: v.asnumpy() for k, v in aux_states.items()}
    if grad_nodes is None:
        grad_req = {k: "write" for k in sym.list_arguments()}
    elif isinstance(grad_nodes, (list, tuple)):
        grad_req = {k: "write" for k in grad_nodes}
    elif isinstance(grad_nodes, dict):
        grad_req = dict(grad_nodes)
    else:
        raise ValueError("grad_nodes must be None, a list or a dict, got %r" % (grad_nodes,))

    _, out_shapes, _ = sym.infer_shape(**{k: v.shape for k, v in location.items()})
    if out_shapes is None or len(out_shapes) != 1:
        raise ValueError("check_numeric_gradient needs a symbol with one output of inferable shape")
    proj_name = "__random_proj"
    loss = mx.sym.make_loss(sym * mx.sym.Variable(proj_name))
    # not too small, or too much precision is lost in the finite differences
    proj = np.random.rand(*out_shapes[0]) + 0.1
    location[proj_name] = array(proj, ctx=ctx, dtype=dtype)

    args_grad_npy = {k: np.random.normal(0, 0.01, size=location[k].shape) for k in grad_req}
    args_grad = {k: array(v, ctx=ctx, dtype=dtype) for k, v in args_grad_npy.items()}
    executor = loss.bind(ctx, args=location, args_grad=args_grad, grad_req=grad_req,
                         aux_states=aux_states)
    if len(executor.outputs) != 1:
        raise ValueError("check_numeric_gradient needs a symbol with one output")
    executor.forward(is_train=True)
    eps = get_tolerance(executor.outputs[0], numeric_eps, default_numeric_eps())
    if dtype in (np.dtype(np.float16), np.dtype(np.float32)) and eps < 1e-5:
        raise ValueError("numeric_eps %g is too small for finite differences in %s" % (eps, dtype))
    executor.backward()
    symbolic = {k: executor.grad_dict[k].asnumpy() for k in grad_req}

    location_npy[proj_name] = proj.astype(dtype)
    numeric = numeric_grad(executor, location_npy, aux_states_npy, eps=eps,
                           use_forward_train=use_forward_train, dtype=dtype)
    for name, req in grad_req.items():
        names = ("NUMERICAL_%s" % name, "BACKWARD_%s" % name)
        if req == "write":
            assert_almost_equal(numeric[name], symbolic[name], rtol, atol, names)
        elif req == "add":
            assert_almost_equal(numeric[name], symbolic[name] - args_grad_npy[name], rtol, atol, names)
        elif req == "null":
            assert_almost_equal(args_grad_npy[name].astype(dtype), symbolic[name], rtol, atol, names)
        else:
            raise ValueError("Invalid grad_req %s for argument %s" % (req, name))


def check_symbolic_forward(sym, location, expected, rtol=None, atol=None, aux_states=None,
                           ctx=None, equal_nan=False, dtype=default_dtype()):
    """Run ``sym`` forward (inference mode) at ``location`` and compare every output with
    ``expected`` (a list in output order or a dict by output name). Returns the outputs."""
    dtype = _check_dtype(dtype)
    ctx = ctx or default_context()
    location = _parse_location(sym, location, ctx, dtype)
    aux_states = _parse_aux_states(sym, aux_states, ctx, dtype)
    output_names = sym.list_outputs()
    if isinstance(expected, dict):
        expected = [expected[k] for k in output_names]
    executor = sym.bind(ctx, args=location, aux_states=aux_states, grad_req="null")
    executor.forward(is_train=False)
    for name, expect, output in zip(output_names, expected, executor.outputs):
        assert_almost_equal(expect, output, rtol, atol, ("EXPECTED_%s" % name, "FORWARD_%s" % name),
                            equal_nan=equal_nan)
    return executor.outputs


def check_symbolic_backward(sym, location, out_grads, expected, rtol=None, atol=None,
                            aux_states=None, grad_req="write", ctx=None, grad_stypes=None,
                            equal_nan=False, dtype=default_dtype()):
    """Run ``sym`` forward and backward at ``location`` with head gradients ``out_grads`` (list in
    output order, dict by output name, or None for ones) and compare the argument gradients with
    ``expected`` (list in argument order or dict by name).

    ``grad_req`` is 'write', 'add' or 'null', or a list/dict of them. Gradient buffers start
    with random values, so 'add' is checked as (result - initial) and 'null' as unchanged.
    Returns the gradient arrays by name.
    """
    dtype = _check_dtype(dtype)
    ctx = ctx or default_context()
    if grad_stypes and any(v not in (None, "default") for v in grad_stypes.values()):
        raise _no_sparse([v for v in grad_stypes.values() if v not in (None, "default")][0])
    arg_names = sym.list_arguments()
    location = _parse_location(sym, location, ctx, dtype)
    aux_states = _parse_aux_states(sym, aux_states, ctx, dtype)
    if isinstance(expected, (list, tuple)):
        expected = dict(zip(arg_names, expected))
    expected = {k: _to_numpy(v) for k, v in expected.items()}

    # dirty gradient buffers (deterministically ordered) so that 'add' and 'null' are visible
    args_grad_npy = {k: np.random.normal(size=v.shape) for k, v in _sorted_items(expected)}
    args_grad = {k: array(v, ctx=ctx, dtype=expected[k].dtype if _is_asnumpy(dtype) else dtype)
                 for k, v in args_grad_npy.items()}
    initial = {k: v.asnumpy() for k, v in args_grad.items()}
    if isinstance(grad_req, str):
        grad_req = {k: grad_req for k in arg_names}
    elif isinstance(grad_req, (list, tuple)):
        grad_req = dict(zip(arg_names, grad_req))
    executor = sym.bind(ctx, args=location, args_grad=args_grad, aux_states=aux_states,
                        grad_req=grad_req)
    executor.forward(is_train=True)

    output_names = sym.list_outputs()
    if isinstance(out_grads, dict):
        out_grads = [out_grads.get(k) for k in output_names]
    if out_grads is not None:
        out_grads = [None if g is None else _nd(g, ctx, dtype) for g in out_grads]
    executor.backward(out_grads)

    for name in expected:
        req = grad_req.get(name, "null")
        names = ("EXPECTED_%s" % name, "BACKWARD_%s" % name)
        grad = args_grad[name].asnumpy()
        if req == "write":
            assert_almost_equal(expected[name], grad, rtol, atol, names, equal_nan=equal_nan)
        elif req == "add":
            assert_almost_equal(expected[name], grad - initial[name], rtol, atol, names,
                                equal_nan=equal_nan)
        elif req == "null":
            assert_almost_equal(initial[name], grad, rtol, atol, names, equal_nan=equal_nan)
        else:
            raise ValueError("Invalid grad_req %s for argument %s" % (req, name))
    return args_grad


def check_speed(sym, location=None, ctx=None, N=20, grad_req=None, typ="whole", **kwargs):
    """Mean seconds per run of ``sym``: forward and backward (typ='whole') or forward only
    (typ='forward'). Inputs come from ``location`` (dict of NumPy arrays) or are random with the
    shapes given as keyword arguments."""
    ctx = ctx or default_context()
    grad_req = grad_req or "write"
    if location is None:
        exe = sym.simple_bind(ctx=ctx, grad_req=grad_req, **kwargs)
        location = {k: np.random.normal(size=arr.shape) for k, arr in exe.arg_dict.items()}
    else:
        if not isinstance(location, dict):
            raise TypeError('Expect dict, get "location"=%s' % (location,))
        exe = sym.simple_bind(ctx=ctx, grad_req=grad_req, **{k: v.shape for k, v in location.items()})
    for name, value in location.items():
        _set(exe.arg_dict[name], np.asarray(value))
    if typ not in ("whole", "forward"):
        raise ValueError('typ can only be "whole" or "forward".')

    def step():
        if typ == "whole":
            exe.forward(is_train=True)
            exe.backward(out_grads=exe.outputs)
        else:
            exe.forward(is_train=False)

    step()  # warm up
    mx.nd.waitall()
    tic = time.time()
    for _ in range(N):
        step()
    mx.nd.waitall()
    return (time.time() - tic) / N


def check_consistency(sym, ctx_list, scale=1.0, grad_req="write", arg_params=None, aux_params=None,
                      rtol=None, atol=None, raise_on_err=True, ground_truth=None, equal_nan=False,
                      use_uniform=False, rand_type=np.float64):
    """Check that ``sym`` (or one symbol per entry) computes the same outputs and gradients for
    every entry of ``ctx_list``.

    Each entry is a dict of simple_bind keywords: 'ctx', input shapes by name and optionally
    'type_dict'. All executors get the same random inputs (normal with std ``scale``, or uniform
    in +-0.92*scale; ``arg_params``/``aux_params`` fix some) and, for the backward pass, the same
    head gradients (the first executor's outputs in the least precise dtype). Results are
    compared with those of the most precise executor (or ``ground_truth``) at the tolerances of
    the less precise dtype. Returns the reference results: a dict name -> NDArray of outputs and
    (unless grad_req is 'null') argument gradients.
    """
    assert len(ctx_list) > 1
    syms = [sym] * len(ctx_list) if isinstance(sym, Symbol) else list(sym)
    assert len(syms) == len(ctx_list)
    output_names = syms[0].list_outputs()
    arg_names = syms[0].list_arguments()
    exe_list = []
    for s, spec in zip(syms, ctx_list):
        assert s.list_arguments() == arg_names and s.list_outputs() == output_names
        spec = dict(spec)
        ctx = spec.pop("ctx", None) or default_context()
        exe_list.append(s.simple_bind(ctx, grad_req=grad_req, **spec))

    arg_params = {} if arg_params is None else arg_params
    aux_params = {} if aux_params is None else aux_params
    for name, arr in _sorted_items(exe_list[0].arg_dict):  # fixed order: reproducible draws
        if name not in arg_params:
            if use_uniform:
                value = np.random.uniform(-0.92 * scale, 0.92 * scale, size=arr.shape)
            else:
                value = np.random.normal(size=arr.shape, scale=scale)
            arg_params[name] = value.astype(rand_type)
    for name in exe_list[0].aux_dict:
        aux_params.setdefault(name, 0)
    for exe in exe_list:
        for name, arr in exe.arg_dict.items():
            _set(arr, arg_params[name])
        for name, arr in exe.aux_dict.items():
            _set(arr, aux_params[name])
        if grad_req == "add":
            for arr in exe.grad_arrays:
                if arr is not None:
                    arr[:] = 0

    def least_precise(*dtypes):
        return min((np.dtype(d) for d in dtypes), key=lambda d: d.itemsize)

    out_dtypes = [np.dtype(exe.outputs[0].dtype) for exe in exe_list]
    gt_idx = max(range(len(exe_list)), key=lambda i: (out_dtypes[i].itemsize, -i))
    gt_exe = exe_list[gt_idx]

    def compare(i, name, arr, gtarr, phase):
        if gtarr is None or arr is None:
            assert gtarr is None and arr is None, "%s: gradient present on one side only" % name
            return
        # tolerances of the least precise float involved: a float16 executor's float32 side
        # arrays (e.g. BatchNorm's gamma gradient) are held to float16 tolerances
        floats = [d for d in (_dtype_of(arr), out_dtypes[i], _dtype_of(gtarr), out_dtypes[gt_idx])
                  if d.kind == "f"]
        probe = np.zeros((), dtype=least_precise(*floats)) if floats else arr
        rt, at = get_tols(probe, probe if floats else gtarr, rtol, atol)
        try:
            assert_almost_equal(arr, gtarr, rtol=rt, atol=at, equal_nan=equal_nan,
                                names=("ctx%d_%s" % (i, name), "ctx%d_%s" % (gt_idx, name)))
        except AssertionError as err:
            print("%s error: %s %s ctx %d vs %s %s ctx %d at %s" % (
                phase, _dtype_of(arr).name, exe_list[i]._ctx, i, _dtype_of(gtarr).name,
                gt_exe._ctx, gt_idx, name))
            traceback.print_exc()
            if raise_on_err:
                raise
            print(str(err))

    # inference
    for exe in exe_list:
        exe.forward(is_train=False)
    gt = dict(ground_truth) if ground_truth is not None else None
    reference = gt_exe.output_dict if gt is None else gt
    for i, exe in enumerate(exe_list):
        if i != gt_idx:
            for name, arr in zip(output_names, exe.outputs):
                compare(i, name, arr, reference[name], "Predict")

    result = {k: v.copy() for k, v in gt_exe.output_dict.items()}
    if grad_req != "null":
        for exe in exe_list:
            exe.forward(is_train=True)
        head_dtypes = [least_precise(*(exe.outputs[j].dtype for exe in exe_list))
                       for j in range(len(output_names))]
        heads = [out.astype(dt).asnumpy() for out, dt in zip(exe_list[0].outputs, head_dtypes)]
        for exe in exe_list:
            exe.backward([array(h, ctx=exe._ctx, dtype=out.dtype) for h, out in zip(heads, exe.outputs)])
        result = dict(gt_exe.output_dict)
        result.update(gt_exe.grad_dict)
        reference = result if gt is None else gt
        for i, exe in enumerate(exe_list):
            if i == gt_idx:
                continue
            for name, arr in zip(output_names + arg_names, exe.outputs + exe.grad_arrays):
                if name in reference:
                    compare(i, name, arr, reference[name], "Train")
    return result if gt is None else gt


# --------------------------------------------------------------------------------------------
# Optimizers
# --------------------------------------------------------------------------------------------

def _weight_and_grad_pair(shape, dtype, w_stype, g_stype):
    for stype in (w_stype, g_stype):
        if stype != "default":
            raise _no_sparse(stype)
    ctx = default_context()
    w2 = mx.random.uniform(shape=shape, ctx=ctx, dtype=dtype)
    g2 = mx.random.uniform(shape=shape, ctx=ctx, dtype=dtype)
    return w2.copyto(ctx), w2, g2.copyto(ctx), g2


def compare_optimizer(opt1, opt2, shape, dtype, w_stype="default", g_stype="default",
                      rtol=1e-4, atol=1e-5, compare_states=True, ntensors=1):
    """Apply one update of ``opt1`` and ``opt2`` to the same random weight and gradient and
    compare states and weights. With a list of shapes, ``opt2`` updates all ``ntensors`` tensors
    in one multi-tensor call and ``opt1`` (the reference) one tensor at a time."""
    if not isinstance(shape, list):
        assert ntensors == 1
        w1, w2, g1, g2 = _weight_and_grad_pair(shape, dtype, w_stype, g_stype)
        state1 = opt1.create_state_multi_precision(0, w1)
        state2 = opt2.create_state_multi_precision(0, w2)
        if compare_states:
            compare_ndarray_tuple(state1, state2)
        opt1.update_multi_precision(0, w1, g1, state1)
        opt2.update_multi_precision(0, w2, g2, state2)
        if compare_states:
            compare_ndarray_tuple(state1, state2, rtol=rtol, atol=atol)
        assert_almost_equal(w1, w2, rtol=rtol, atol=atol)
        return
    pairs = [_weight_and_grad_pair(s, dtype, w_stype, g_stype) for s in shape[:ntensors]]
    w2 = [p[1] for p in pairs]
    g2 = [p[3] for p in pairs]
    state2 = [opt2.create_state_multi_precision(i, w) for i, w in enumerate(w2)]
    opt2.update_multi_precision(list(range(ntensors)), w2, g2, state2)
    for i, (w1, _, g1, _) in enumerate(pairs):
        state1 = opt1.create_state_multi_precision(i, w1)
        opt1.update_multi_precision(i, w1, g1, state1)
        if compare_states:
            compare_ndarray_tuple(state1, state2[i], rtol, atol)
        compare_ndarray_tuple(w1, w2[i], rtol, atol)


def compare_optimizer_noise_seeded(opt1, opt2, shape, dtype, noise_seed, w_stype="default",
                                   g_stype="default", rtol=1e-4, atol=1e-5, compare_states=True):
    """compare_optimizer for optimizers that add random noise (e.g. SGLD): ``mx.random`` is
    seeded with ``noise_seed`` before each optimizer's update so both draw the same noise.
    ``shape`` is one shape or a list of shapes (updated in one multi-tensor call each)."""
    shapes = shape if isinstance(shape, list) else [shape]
    pairs = [_weight_and_grad_pair(s, dtype, w_stype, g_stype) for s in shapes]
    w1, w2 = [p[0] for p in pairs], [p[1] for p in pairs]
    g1, g2 = [p[2] for p in pairs], [p[3] for p in pairs]
    s1 = [opt1.create_state_multi_precision(i, w) for i, w in enumerate(w1)]
    s2 = [opt2.create_state_multi_precision(i, w) for i, w in enumerate(w2)]
    if compare_states:
        compare_ndarray_tuple(tuple(s1), tuple(s2))
    for opt, w, g, s in ((opt1, w1, g1, s1), (opt2, w2, g2, s2)):
        mx.random.seed(noise_seed)
        if isinstance(shape, list):
            opt.update_multi_precision(list(range(len(w))), w, g, s)
        else:
            opt.update_multi_precision(0, w[0], g[0], s[0])
    if compare_states:
        compare_ndarray_tuple(tuple(s1), tuple(s2), rtol=rtol, atol=atol)
    compare_ndarray_tuple(tuple(w1), tuple(w2), rtol=rtol, atol=atol)


# --------------------------------------------------------------------------------------------
# Random generators: statistical checks
# --------------------------------------------------------------------------------------------

def gen_buckets_probs_with_ppf(ppf, nbuckets):
    """``nbuckets`` equally likely buckets [ppf(i/n), ppf((i+1)/n)) of a distribution given by its
    quantile function, with their probabilities (each 1/n)."""
    assert nbuckets > 0
    probs = [1.0 / nbuckets] * nbuckets
    buckets = [(ppf(i / float(nbuckets)), ppf((i + 1) / float(nbuckets))) for i in range(nbuckets)]
    return buckets, probs


def mean_check(generator, mu, sigma, nsamples=1000000):
    """Whether the mean of ``generator(nsamples)`` lies within mu +- 3 sigma / sqrt(n)."""
    mean = _to_numpy(generator(nsamples)).mean()
    bound = 3 * sigma / np.sqrt(nsamples)
    return bool(mu - bound < mean < mu + bound)


def var_check(generator, sigma, nsamples=1000000):
    """Whether the sample variance of ``generator(nsamples)`` lies within
    sigma^2 +- 3 sqrt(2 sigma^4 / (n - 1))."""
    var = _to_numpy(generator(nsamples)).var(ddof=1)
    bound = 3 * np.sqrt(2 * sigma ** 4 / (nsamples - 1))
    return bool(sigma ** 2 - bound < var < sigma ** 2 + bound)


def chi_square_check(generator, buckets, probs, nsamples=1000000):
    """Pearson's chi-square test of ``generator(nsamples)`` against bucket probabilities.

    ``buckets`` is a list of (low, high) ranges (ascending, disjoint) for a continuous
    distribution, or a list of the values of a discrete one. Returns (p value, observed
    counts, expected counts); samples outside every bucket count against the fit.
    """
    try:
        # Imported here, not with the module: `import oxnet` imports test_utils (as MXNet does)
        # and scipy.stats alone took 0.4 s and 60 MB of every program's start.
        import scipy.stats as ss
    except ImportError:  # scipy is optional: only this check needs it
        raise ImportError("chi_square_check needs scipy, which is not installed") from None
    assert isinstance(buckets, list) and len(probs) == len(buckets)
    samples = _to_numpy(generator(nsamples)).reshape(-1)
    obs = np.zeros(len(buckets), dtype=np.int64)
    if isinstance(buckets[0], (list, tuple)):
        edges = np.array([e for b in buckets for e in b], dtype=np.float64)
        for i, (low, high) in enumerate(buckets):
            assert low <= high and (i + 1 == len(buckets) or high <= buckets[i + 1][0])
        ids = np.searchsorted(edges, samples, side="right")
        inside = ids % 2 == 1  # between a bucket's low (inclusive) and high edge
        obs += np.bincount(ids[inside] // 2, minlength=len(buckets))[:len(buckets)]
    else:
        for i, value in enumerate(buckets):
            obs[i] = np.count_nonzero(samples == value)
    expected = nsamples * np.asarray(probs, dtype=np.float64)
    stat = np.sum((obs - expected) ** 2 / expected)
    p = float(ss.chi2.sf(stat, len(buckets) - 1))
    return p, obs, expected


def verify_generator(generator, buckets, probs, nsamples=1000000, nrepeat=5, success_rate=0.2,
                     alpha=0.05):
    """Run chi_square_check ``nrepeat`` times; raise AssertionError unless at least
    ``success_rate`` of the runs have p > ``alpha``. Returns the p values."""
    results = [chi_square_check(generator, buckets, probs, nsamples) for _ in range(nrepeat)]
    pvalues = [r[0] for r in results]
    if np.count_nonzero(np.array(pvalues) > alpha) < nrepeat * success_rate:
        raise AssertionError(
            "Generator test fails, chi-square p=%s, obs_freq=%s, expected_freq=%s.\nbuckets=%s, probs=%s"
            % (pvalues, [r[1].tolist() for r in results], [r[2].tolist() for r in results], buckets, probs))
    return pvalues


# --------------------------------------------------------------------------------------------
# Environment, devices, files
# --------------------------------------------------------------------------------------------

def list_gpus():
    """range over the GPU ids (empty without GPUs)."""
    return range(mx.context.num_gpus())


def is_cd_run():
    """Whether this runs as part of a continuous-delivery job (CD_JOB=1)."""
    return os.environ.get("CD_JOB", "0") == "1"


def is_aarch64_run():
    return platform.machine() == "aarch64"


def has_tvm_ops():
    """oxnet has no TVM-generated operators."""
    return False


def is_op_runnable():
    """Every oxnet operator can run on the current context (no TVM compute-capability limits)."""
    return True


def set_env_var(key, val, default_val=""):
    """Set environment variable ``key`` to ``val``; return its previous value (or ``default_val``)."""
    previous = os.environ.get(key, default_val)
    os.environ[key] = val
    return previous


@contextmanager
def environment(*args):
    """Set environment variables for a block: ``environment('K', 'v')`` or ``environment({'K': 'v'})``;
    a value of None unsets the variable. The previous values come back afterwards."""
    if len(args) == 2:
        settings = {args[0]: args[1]}
    elif len(args) == 1 and isinstance(args[0], dict):
        settings = args[0]
    else:
        raise ValueError("environment takes (name, value) or a dict")

    def apply(values):
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)

    saved = {k: os.environ.get(k) for k in settings}
    apply(settings)
    try:
        yield
    finally:
        mx.nd.waitall()  # work pushed inside the block may still read the variables
        apply(saved)


@contextmanager
def discard_stderr():
    """Discard everything written to standard error within the block: file descriptor 2 (C and
    Rust code) is pointed at /dev/null, and so is ``sys.stderr`` when it writes elsewhere."""
    try:
        py_fd = sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):  # not a real file (e.g. an io.StringIO)
        py_fd = None
    for stream in (sys.stderr, sys.__stderr__):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    saved_fd = os.dup(2)
    saved_stream = sys.stderr
    with open(os.devnull, "w") as sink:
        os.dup2(sink.fileno(), 2)
        if py_fd != 2:
            sys.stderr = sink
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (ValueError, OSError):
                pass
            sys.stderr = saved_stream
            os.dup2(saved_fd, 2)
            os.close(saved_fd)


def download(url, fname=None, dirname=None, overwrite=False, retries=5):
    """Download ``url`` to ``fname`` (default: the URL's last component, inside ``dirname`` if
    given) unless it exists and ``overwrite`` is False; ``retries`` further attempts after a
    failure. Returns the file name; raises OSError naming the URL when every attempt fails."""
    import urllib.request
    assert retries >= 0, "Number of retries should be at least 0"
    fname = fname or url.split("/")[-1]
    if dirname is None:
        dirname = os.path.dirname(fname)
    else:
        fname = os.path.join(dirname, fname)
    if dirname:
        os.makedirs(dirname, exist_ok=True)
    if not overwrite and os.path.exists(fname):
        logging.info("%s exists, skipping download", fname)
        return fname
    last_error = None
    for attempt in range(retries + 1):
        try:
            tmp = fname + ".part"
            with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
                while True:
                    chunk = response.read(1 << 20)
                    if not chunk:
                        break
                    out.write(chunk)
            os.replace(tmp, fname)
            logging.info("downloaded %s into %s successfully", url, fname)
            return fname
        except Exception as err:  # pylint: disable=broad-except
            last_error = err
            if attempt < retries:
                print("download of %s failed (%s), retrying, %d attempt%s left"
                      % (url, err, retries - attempt, "s" if retries - attempt > 1 else ""))
    raise OSError(errno.ENETUNREACH if isinstance(last_error, OSError) else errno.EIO,
                  "failed to download %s after %d attempt%s: %s (is the network reachable?)"
                  % (url, retries + 1, "s" if retries else "", last_error))


_MODEL_URL = "http://data.mxnet.io/models/"
# model name -> (path prefix on the model server, epoch of its parameter file)
_DEFAULT_MODELS = {
    "imagenet1k-inception-bn": ("imagenet/inception-bn/Inception-BN", 126),
    "imagenet1k-resnet-18": ("imagenet/resnet/18-layers/resnet-18", 0),
    "imagenet1k-resnet-34": ("imagenet/resnet/34-layers/resnet-34", 0),
    "imagenet1k-resnet-50": ("imagenet/resnet/50-layers/resnet-50", 0),
    "imagenet1k-resnet-101": ("imagenet/resnet/101-layers/resnet-101", 0),
    "imagenet1k-resnet-152": ("imagenet/resnet/152-layers/resnet-152", 0),
    "imagenet1k-resnext-50": ("imagenet/resnext/50-layers/resnext-50", 0),
    "imagenet1k-resnext-101": ("imagenet/resnext/101-layers/resnext-101", 0),
    "imagenet1k-resnext-101-64x4d": ("imagenet/resnext/101-layers/resnext-101-64x4d", 0),
    "imagenet11k-resnet-152": ("imagenet-11k/resnet-152/resnet-152", 0),
    "imagenet11k-place365ch-resnet-152": ("imagenet-11k-place365-ch/resnet-152", 0),
    "imagenet11k-place365ch-resnet-50": ("imagenet-11k-place365-ch/resnet-50", 0),
}


def _default_model_info():
    return {name: {"symbol": "%s%s-symbol.json" % (_MODEL_URL, prefix),
                   "params": "%s%s-%04d.params" % (_MODEL_URL, prefix, epoch)}
            for name, (prefix, epoch) in _DEFAULT_MODELS.items()}


def download_model(model_name, dst_dir="./", meta_info=None):
    """Download a model's symbol and parameters (``meta_info``: name -> {'symbol': url,
    'params': url}; MXNet's model server by default). Returns (path prefix, epoch 0), or
    (None, 0) for an unknown model."""
    meta_info = dict(_default_model_info() if meta_info is None else meta_info)
    if model_name not in meta_info:
        return (None, 0)
    os.makedirs(dst_dir, exist_ok=True)
    meta = meta_info[model_name]
    prefix = os.path.join(dst_dir, model_name)
    download(meta["symbol"], prefix + "-symbol.json")
    download(meta["params"], prefix + "-0000.params")
    return (prefix, 0)


def get_mnist():
    """MNIST as a dict of NumPy arrays: train_data/test_data (N, 1, 28, 28) float32 in [0, 1],
    train_label/test_label int8 (downloaded into the current directory)."""
    def read(label_url, image_url):
        with gzip.open(download(label_url)) as f:
            struct.unpack(">II", f.read(8))
            label = np.frombuffer(f.read(), dtype=np.int8)
        with gzip.open(download(image_url)) as f:
            _, _, rows, cols = struct.unpack(">IIII", f.read(16))
            image = np.frombuffer(f.read(), dtype=np.uint8).reshape(len(label), 1, rows, cols)
        return label, image.astype(np.float32) / 255

    path = "http://data.mxnet.io/data/mnist/"
    train_lbl, train_img = read(path + "train-labels-idx1-ubyte.gz", path + "train-images-idx3-ubyte.gz")
    test_lbl, test_img = read(path + "t10k-labels-idx1-ubyte.gz", path + "t10k-images-idx3-ubyte.gz")
    return {"train_data": train_img, "train_label": train_lbl, "test_data": test_img, "test_label": test_lbl}


def _fetch_zip(url, needed, into="data"):
    os.makedirs(into, exist_ok=True)
    if not all(os.path.exists(os.path.join(into, n)) for n in needed):
        with zipfile.ZipFile(download(url, dirname=into)) as zf:
            zf.extractall(into)


def get_mnist_pkl():
    """Download mnist.pkl.gz into ./data."""
    os.makedirs("data", exist_ok=True)
    if not os.path.exists("data/mnist.pkl.gz"):
        download("http://deeplearning.net/data/mnist/mnist.pkl.gz", dirname="data")


def get_mnist_ubyte():
    """Download and unpack the ubyte MNIST files into ./data."""
    _fetch_zip("http://data.mxnet.io/mxnet/data/mnist.zip",
               ["train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"])


def get_cifar10():
    """Download and unpack CIFAR-10 (.rec/.lst) into ./data/cifar."""
    _fetch_zip("http://data.mxnet.io/mxnet/data/cifar10.zip",
               ["cifar/train.rec", "cifar/test.rec", "cifar/train.lst", "cifar/test.lst"])


def get_mnist_iterator(batch_size, input_shape, num_parts=1, part_index=0):
    """(train, validation) MNISTIter over ./data (downloaded if missing)."""
    get_mnist_ubyte()
    flat = len(input_shape) != 3
    common = dict(input_shape=input_shape, batch_size=batch_size, flat=flat,
                  num_parts=num_parts, part_index=part_index)
    train = mx.io.MNISTIter(image="data/train-images-idx3-ubyte", label="data/train-labels-idx1-ubyte",
                            shuffle=True, **common)
    val = mx.io.MNISTIter(image="data/t10k-images-idx3-ubyte", label="data/t10k-labels-idx1-ubyte",
                          **common)
    return train, val


def get_zip_data(data_dir, url, data_origin_name):
    """Download the zip ``url`` into ``data_dir`` as ``data_origin_name`` and extract it there
    (skipped when the zip is already present)."""
    data_origin_name = os.path.join(data_dir, data_origin_name)
    if not os.path.exists(data_origin_name):
        download(url, dirname=data_dir, overwrite=False)
        with zipfile.ZipFile(data_origin_name) as zf:
            zf.extractall(path=data_dir)


def get_bz2_data(data_dir, data_name, url, data_origin_name):
    """Download the bz2 ``url`` into ``data_dir`` and decompress it to ``data_name`` (skipped when
    ``data_name`` exists); the compressed file is removed."""
    data_name = os.path.join(data_dir, data_name)
    data_origin_name = os.path.join(data_dir, data_origin_name)
    if not os.path.exists(data_name):
        download(url, fname=data_origin_name, dirname=data_dir, overwrite=False)
        with bz2.BZ2File(data_origin_name, "rb") as src, open(data_name, "wb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                dst.write(block)
        os.remove(data_origin_name)


def get_im2rec_path(home_env="MXNET_HOME"):
    """Path of the im2rec.py tool (under $MXNET_HOME or the package); IOError if absent."""
    root = os.environ.get(home_env) or os.path.dirname(mx.__file__)
    for candidate in (os.path.join(root, "tools", "im2rec.py"),
                      os.path.join(root, "..", "..", "tools", "im2rec.py")):
        if os.path.isfile(candidate):
            return candidate
    raise IOError("Could not find path to tools/im2rec.py")


# --------------------------------------------------------------------------------------------
# Gluon
# --------------------------------------------------------------------------------------------

def check_gluon_hybridize_consistency(net_builder, data_l, numpy_func=None, test_grad=True,
                                      rtol=1E-4, atol=1E-4):
    """Check that a HybridBlock built by ``net_builder(prefix=...)`` gives the same outputs (and
    input gradients with ``test_grad``) with and without hybridize, with the same parameters,
    and optionally the same outputs as ``numpy_func``. The network must not draw random numbers."""
    saved_out = None
    saved_grads = None
    params = None
    for hybridize in (False, True):
        for use_autograd in ((False, True) if test_grad else (False,)):
            net = net_builder(prefix="net_")
            net.initialize()
            if params is not None:
                for name, p in net.collect_params().items():
                    p.set_data(array(params[name], ctx=p.list_ctx()[0], dtype=params[name].dtype))
            if hybridize:
                net.hybridize()
            inputs = [x.copy() for x in data_l]
            if use_autograd:
                for x in inputs:
                    x.attach_grad()
                with mx.autograd.record():
                    out = net(*inputs)
                out.backward(out)
            else:
                out = net(*inputs)
            if params is None:
                params = {k: v.data().asnumpy() for k, v in net.collect_params().items()}
            if saved_out is None:
                saved_out = out.asnumpy()
            else:
                assert_almost_equal(out.asnumpy(), saved_out, rtol=rtol, atol=atol)
            if use_autograd:
                grads = [x.grad.asnumpy() for x in inputs]
                if saved_grads is None:
                    saved_grads = grads
                else:
                    for grad, saved in zip(grads, saved_grads):
                        assert_almost_equal(grad, saved, rtol=rtol, atol=atol)
    if numpy_func is not None:
        expected = numpy_func(*[x.asnumpy() for x in data_l])
        assert_almost_equal(saved_out, expected, rtol=rtol, atol=atol)


# --------------------------------------------------------------------------------------------
# Names resolved on first use: oxnet.util (use_np, getenv, setenv) and DummyIter (mx.io)
# --------------------------------------------------------------------------------------------

def _make_dummy_iter(data_iter_base):
    class DummyIter(data_iter_base):
        """An iterator that returns the first batch of ``real_iter`` forever (for speed tests)."""

        def __init__(self, real_iter):
            super().__init__()
            self.real_iter = real_iter
            self.provide_data = real_iter.provide_data
            self.provide_label = real_iter.provide_label
            self.batch_size = real_iter.batch_size
            self.the_batch = next(real_iter)

        def __iter__(self):
            return self

        def __next__(self):
            return self.the_batch

        def next(self):
            """The first batch of the real iterator; never raises StopIteration."""
            return self.the_batch

    DummyIter.__module__ = __name__
    return DummyIter


try:
    from . import io as _io
    DummyIter = _make_dummy_iter(_io.DataIter)
except Exception:  # pylint: disable=broad-except
    pass


def _fallback_use_np(func):
    """Stand-in for oxnet.util.use_np where oxnet.util is unavailable: returns ``func`` unchanged."""
    return func


_UTIL_FALLBACKS = {
    "use_np": _fallback_use_np,
    "getenv": os.environ.get,
    "setenv": os.environ.__setitem__,
}


def __getattr__(name):
    if name in _UTIL_FALLBACKS:
        try:
            from . import util
            value = getattr(util, name)
        except (ImportError, AttributeError):
            return _UTIL_FALLBACKS[name]
        globals()[name] = value
        return value
    if name == "DummyIter":
        from . import io as io_module  # raises the real reason while mx.io is missing
        value = _make_dummy_iter(io_module.DataIter)
        globals()[name] = value
        return value
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
