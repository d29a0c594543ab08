"""Sparse storage (MXNet's ``mxnet.ndarray.sparse``): compressed-sparse-row (``CSRNDArray``,
``stype='csr'``) and row-sparse (``RowSparseNDArray``, ``stype='row_sparse'``) arrays.

A sparse array holds its nonzeros and their positions as dense arrays on its context: a CSR
matrix its ``data`` (nnz,), column ``indices`` (nnz,) and row pointers ``indptr`` (rows + 1,);
a row-sparse array the rows it stores (``data``, shape ``(k,) + shape[1:]``) and their sorted
row ``indices`` (k,). Creation, conversion (``tostype``, ``cast_storage``), copies between
contexts, row slicing of CSR matrices and the component accessors keep the compressed form. An
operator given a sparse input computes on its dense equivalent, made once per array and kept
(MXNet's "storage fallback"), and returns dense arrays; no operator has a sparse kernel yet.
An ``out=`` sparse array receives the dense result converted to its storage type; ``x[:] = y``
replaces the contents.
"""

import math

import numpy as np

from ..base import MXNetError, dtype_name, integer_types, mx_real_t, np_dtype
from ..context import Context, current_context
from .ndarray import NDArray, _binary, array as _dense_array, zeros as _dense_zeros

__all__ = ["BaseSparseNDArray", "CSRNDArray", "RowSparseNDArray", "csr_matrix", "row_sparse_array", "zeros",
           "empty", "array", "cast_storage", "getnnz", "retain"]

_INDEX_DTYPE = np.int64


def _scipy_sparse():
    try:
        import scipy.sparse as sps
    except ImportError:
        return None
    return sps


class BaseSparseNDArray(NDArray):
    """What CSR and row-sparse arrays share: a shape, dense component arrays on one context, and
    a dense equivalent for operators, made on first use.

    Once an operator has had the dense equivalent it is the array's contents (the operator may
    have updated it in place, as optimizer updates do with their states), and the components are
    derived from it again when next asked for."""

    __slots__ = ("_shape", "_stored", "_dense", "_stale")

    def __init__(self, shape, components):
        # The base class's `handle` slot stays unset: `handle` below is the dense equivalent.
        self._shape = tuple(int(s) for s in shape)
        self._stored = list(components)
        self._dense = None
        self._stale = False
        self.writable = True

    # ---- the dense equivalent, for operators ------------------------------------------------
    @property
    def handle(self):
        if self._dense is None:
            self._dense = _dense_array(self._to_numpy(), ctx=self.context, dtype=self.dtype)
        self._stale = True
        return self._dense.handle

    def _current(self):
        """The components, derived again from the dense equivalent if an operator had it."""
        if self._stale:
            self._stale = False
            self._stored = _CONVERTERS[self.stype](self._dense.asnumpy(), self.context, self.dtype)._stored
        return self._stored

    @handle.setter
    def handle(self, _value):
        raise MXNetError("%s: operators cannot write into a sparse array (out=...); write into a dense "
                         "array and convert it with tostype(%r)" % (type(self).__name__, self.stype))

    # ---- properties -------------------------------------------------------------------------
    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return self._stored[0].dtype

    @property
    def context(self):
        return self._stored[0].context

    ctx = context

    @property
    def size(self):
        return math.prod(self._shape)

    @property
    def ndim(self):
        return len(self._shape)

    @property
    def data(self):
        """A copy of the stored values (a dense NDArray), as in MXNet."""
        return self._current()[0].copy()

    @property
    def indices(self):
        """A copy of each value's column (CSR) or each stored row's index (row-sparse), int64."""
        return self._current()[1].copy()

    @property
    def _num_aux(self):
        """Number of auxiliary arrays: CSR 2 (indptr, indices), row-sparse 1 (indices)."""
        return len(self._stored) - 1

    def _data(self):
        return self.data

    def _aux_data(self, i):
        """MXNet's auxiliary arrays: CSR (0) indptr, (1) indices; row-sparse (0) indices."""
        return self._current()[1:][::-1][i].copy()

    def _aux_type(self, i):
        return self._aux_data(i).dtype

    def __repr__(self):
        return "\n<%s %s @%s>" % (type(self).__name__, "x".join(str(s) for s in self._shape), self.context)

    __str__ = __repr__

    def __reduce__(self):
        return _rebuild, (type(self), self._shape, [c.asnumpy() for c in self._current()], self.context)

    def __bool__(self):
        raise ValueError("The truth value of a %s is ambiguous; use a.asnumpy().any() or .all()" % type(self).__name__)

    # ---- synchronization and conversion -----------------------------------------------------
    def wait_to_read(self):
        for c in self._stored + ([self._dense] if self._dense is not None else []):
            c.wait_to_read()

    def wait_to_write(self):
        for c in self._stored + ([self._dense] if self._dense is not None else []):
            c.wait_to_write()

    def asnumpy(self):
        """The dense contents as a NumPy array."""
        return self._dense.asnumpy() if self._dense is not None else self._to_numpy()

    def tostype(self, stype):
        """A copy in storage type ``stype`` ('default', 'csr' or 'row_sparse')."""
        return cast_storage(self, stype)

    def astype(self, dtype, copy=True):
        if not copy and np_dtype(dtype_name(dtype)) == self.dtype:
            return self
        current = self._current()
        values = [current[0].astype(dtype)] + [c.copy() for c in current[1:]]
        return type(self)(self._shape, values)

    def copy(self):
        return self.copyto(self.context)

    def copyto(self, other):
        """Onto a Context (a new array of this storage type) or into an array of the same shape:
        a sparse one of this storage type takes these contents, a dense one their dense form."""
        if isinstance(other, Context):
            return type(self)(self._shape, [c.copyto(other) for c in self._current()])
        if isinstance(other, BaseSparseNDArray):
            if other.stype != self.stype or other.shape != self.shape:
                raise MXNetError("copyto: cannot copy a %s %s into a %s %s" % (self.stype, self.shape, other.stype,
                                                                              other.shape))
            other._replace([c.copyto(other.context) for c in self._current()])
            return other
        if isinstance(other, NDArray):
            return _dense_array(self._to_numpy(), ctx=self.context, dtype=self.dtype).copyto(other)
        raise TypeError("copyto does not support type %s" % type(other))

    def as_in_context(self, context):
        return self if self.context == context else self.copyto(context)

    as_in_ctx = as_in_context

    def _replace(self, components):
        self._stored = list(components)
        self._dense = None
        self._stale = False

    def __setitem__(self, key, value):
        """``x[:] = value``: replace the whole contents with ``value`` (an array of this storage
        type, or dense data converted to it)."""
        if not (isinstance(key, slice) and key == slice(None)):
            raise MXNetError("%s only supports assignment to the whole array (x[:] = value), got key %r"
                             % (type(self).__name__, key))
        if not isinstance(value, NDArray):
            value = _dense_array(np.broadcast_to(np.asarray(value, dtype=self.dtype), self._shape),
                                 ctx=self.context, dtype=self.dtype)
        if value.shape != self._shape:
            raise MXNetError("%s assignment: value has shape %s, the array %s" % (type(self).__name__, value.shape,
                                                                                  self._shape))
        converted = cast_storage(value, self.stype).as_in_context(self.context)
        stored = converted._current()
        self._replace([stored[0].astype(self.dtype, copy=False)] + stored[1:])

    def _inplace(self, other, array_op, scalar_op):
        """``x += y`` and the like: computed densely, stored back in this storage type."""
        result = _binary(self, other, array_op, scalar_op)
        if result is NotImplemented:
            raise TypeError("type %s not supported" % type(other))
        self[:] = result
        return self

    def attach_grad(self, grad_req="write", stype=None):
        raise MXNetError("attach_grad: gradients of sparse arrays are not supported; differentiate a dense array "
                         "(tostype('default'))")

    def check_format(self, full_check=True):
        """Raise an MXNetError if the components do not describe a valid array of this storage
        type (with ``full_check``, also index ranges and order)."""
        self._check(full_check)


class CSRNDArray(BaseSparseNDArray):
    """A 2-D matrix in compressed-sparse-row form: row ``i``'s values are
    ``data[indptr[i]:indptr[i+1]]`` in the columns ``indices[indptr[i]:indptr[i+1]]``."""

    __slots__ = ()

    @property
    def stype(self):
        return "csr"

    @property
    def indptr(self):
        """Row pointers: row ``i`` holds the values ``indptr[i]`` up to ``indptr[i+1]``."""
        return self._current()[2].copy()

    def _parts(self):
        return (c.asnumpy() for c in self._current())

    def _to_numpy(self):
        self._check(full_check=False)
        data, indices, indptr = self._parts()
        if len(indices) and (indices.min() < 0 or indices.max() >= self._shape[1]):
            raise MXNetError("CSRNDArray: column indices must lie in [0, %d)" % self._shape[1])
        dense = np.zeros(self._shape, dtype=data.dtype)
        rows = np.repeat(np.arange(self._shape[0]), np.diff(indptr))
        dense[rows, indices] = data
        return dense

    def asscipy(self):
        """The matrix as a ``scipy.sparse.csr_matrix``."""
        sps = _scipy_sparse()
        if sps is None:
            raise ImportError("asscipy needs SciPy (pip install scipy)")
        data, indices, indptr = self._parts()
        return sps.csr_matrix((data, indices, indptr), shape=self._shape)

    def __getitem__(self, key):
        """Rows ``key`` (an int or a slice with step 1) as a CSR matrix."""
        rows = self._shape[0]
        if isinstance(key, integer_types):
            if not -rows <= key < rows:
                raise IndexError("index %d is out of bounds for a CSR matrix with %d rows" % (key, rows))
            key = slice(key % rows, key % rows + 1)
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise MXNetError("CSRNDArray supports indexing by an int or a slice with step 1 along the rows, got %r"
                             % (key,))
        begin, end, _ = key.indices(rows)
        end = max(begin, end)
        data, indices, indptr = self._parts()
        first, last = indptr[begin], indptr[end]
        return _csr(data[first:last], indices[first:last], indptr[begin:end + 1] - first, (end - begin,) + self._shape[1:],
                    self.context)

    def _check(self, full_check):
        data, indices, indptr = self._parts()
        rows, cols = self._shape
        if indptr.shape != (rows + 1,) or indptr[0] != 0 or indptr[-1] != len(data) or len(indices) != len(data):
            raise MXNetError("CSRNDArray: indptr must have %d entries from 0 to nnz=%d and indices nnz entries"
                             % (rows + 1, len(data)))
        if full_check:
            if (np.diff(indptr) < 0).any():
                raise MXNetError("CSRNDArray: indptr must not decrease")
            if len(indices) and (indices.min() < 0 or indices.max() >= cols):
                raise MXNetError("CSRNDArray: column indices must lie in [0, %d)" % cols)
            for r in range(rows):
                row = indices[indptr[r]:indptr[r + 1]]
                if (np.diff(row) <= 0).any():
                    raise MXNetError("CSRNDArray: the column indices of row %d are not sorted and unique" % r)


class RowSparseNDArray(BaseSparseNDArray):
    """An array whose rows are all zero except the rows ``indices`` (sorted), stored in ``data``."""

    __slots__ = ()

    @property
    def stype(self):
        return "row_sparse"

    def _to_numpy(self):
        self._check(full_check=False)
        data, indices = (c.asnumpy() for c in self._current())
        if len(indices) and (indices.min() < 0 or indices.max() >= self._shape[0]):
            raise MXNetError("RowSparseNDArray: row indices must lie in [0, %d)" % self._shape[0])
        dense = np.zeros(self._shape, dtype=data.dtype)
        dense[indices] = data
        return dense

    def __getitem__(self, key):
        if isinstance(key, slice) and key == slice(None):
            return self
        raise MXNetError("RowSparseNDArray supports only the whole-array index [:], got %r" % (key,))

    def retain(self, indices):
        """The stored rows among ``indices`` (others dropped), as a row-sparse array."""
        data, rows = (c.asnumpy() for c in self._current())
        wanted = np.isin(rows, np.asarray(indices.asnumpy() if isinstance(indices, NDArray) else indices))
        return _row_sparse(data[wanted], rows[wanted], self._shape, self.context)

    def _check(self, full_check):
        data, indices = (c.asnumpy() for c in self._current())
        if data.shape != (len(indices),) + self._shape[1:]:
            raise MXNetError("RowSparseNDArray: data has shape %s, expected %s" % (data.shape,
                                                                                  (len(indices),) + self._shape[1:]))
        if full_check and len(indices):
            if indices.min() < 0 or indices.max() >= self._shape[0]:
                raise MXNetError("RowSparseNDArray: row indices must lie in [0, %d)" % self._shape[0])
            if (np.diff(indices) <= 0).any():
                raise MXNetError("RowSparseNDArray: row indices must be sorted and unique")


# ---- construction ---------------------------------------------------------------------------

def _rebuild(cls, shape, values, ctx):
    """Unpickling: a sparse array from its components' values."""
    return cls(shape, [_dense_array(v, ctx=ctx, dtype=v.dtype) for v in values])


def _context(ctx):
    return current_context() if ctx is None else ctx


def _csr(data, indices, indptr, shape, ctx, dtype=None):
    dtype = np_dtype(dtype_name(dtype)) if dtype is not None else np.asarray(data).dtype
    parts = [(data, dtype), (indices, _INDEX_DTYPE), (indptr, _INDEX_DTYPE)]
    return CSRNDArray(shape, [_dense_array(np.asarray(v, dtype=t).reshape(-1), ctx=ctx, dtype=t) for v, t in parts])


def _row_sparse(data, indices, shape, ctx, dtype=None):
    dtype = np_dtype(dtype_name(dtype)) if dtype is not None else np.asarray(data).dtype
    data = np.asarray(data, dtype=dtype).reshape((len(indices),) + tuple(shape[1:]))
    return RowSparseNDArray(shape, [_dense_array(data, ctx=ctx, dtype=dtype),
                                    _dense_array(np.asarray(indices, dtype=_INDEX_DTYPE), ctx=ctx,
                                                 dtype=_INDEX_DTYPE)])


def _as_numpy(value):
    return value.asnumpy() if isinstance(value, NDArray) else np.asarray(value)


def _dense_to_csr(dense, ctx, dtype=None):
    if dense.ndim != 2:
        raise MXNetError("csr_matrix: CSR storage holds 2-D matrices, got shape %s" % (dense.shape,))
    rows, cols = np.nonzero(dense)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=dense.shape[0]))])
    return _csr(dense[rows, cols], cols, indptr, dense.shape, ctx, dtype or dense.dtype)


def _dense_to_row_sparse(dense, ctx, dtype=None):
    if dense.ndim == 0:
        raise MXNetError("row_sparse_array: row-sparse storage needs at least one axis")
    flat = dense.reshape(dense.shape[0], -1)
    rows = np.nonzero((flat != 0).any(axis=1))[0]
    return _row_sparse(dense[rows], rows, dense.shape, ctx, dtype or dense.dtype)


def _from_dense(what, arg1, shape, ctx, dtype, convert):
    """``convert(dense, ctx, dtype)`` of dense data (an NDArray, a NumPy array or nested lists,
    which default to float32), checked against ``shape`` when given."""
    dense = _as_numpy(arg1)
    if shape is not None and dense.shape != tuple(shape):
        raise MXNetError("%s: data of shape %s given with shape %s" % (what, dense.shape, tuple(shape)))
    if not isinstance(arg1, (NDArray, np.ndarray)) and dtype is None:
        dtype = mx_real_t
    return convert(dense, ctx, dtype)


def _is_shape(value):
    return isinstance(value, tuple) and all(isinstance(v, integer_types) for v in value)


def csr_matrix(arg1, shape=None, ctx=None, dtype=None):
    """A ``CSRNDArray`` from ``(data, indices, indptr)``, ``(data, (row, col))`` (coordinates),
    a shape ``(M, N)`` (all zeros), a dense 2-D array (NDArray or NumPy), a SciPy sparse matrix
    or another CSR array. ``dtype`` defaults to the values' (float32 for shapes and Python data)."""
    ctx = _context(ctx)
    sps = _scipy_sparse()
    if isinstance(arg1, CSRNDArray):
        result = arg1.copyto(ctx)
        return result.astype(dtype) if dtype is not None else result
    if isinstance(arg1, BaseSparseNDArray):
        return _dense_to_csr(arg1.asnumpy(), ctx, dtype)
    if sps is not None and sps.issparse(arg1):
        # Canonical form, as MXNet stores it: duplicates summed, each row's columns sorted.
        matrix = sps.csr_matrix(arg1, copy=True)
        matrix.sum_duplicates()
        return _csr(matrix.data, matrix.indices, matrix.indptr, matrix.shape, ctx, dtype or matrix.dtype)
    if _is_shape(arg1):
        if len(arg1) != 2:
            raise MXNetError("csr_matrix: CSR storage holds 2-D matrices, got shape %s" % (arg1,))
        return _csr([], [], np.zeros(arg1[0] + 1), arg1, ctx, dtype or mx_real_t)
    if isinstance(arg1, tuple) and len(arg1) == 3:
        data, indices, indptr = (_as_numpy(a) for a in arg1)
        if shape is None:
            shape = (len(indptr) - 1, int(indices.max()) + 1 if len(indices) else 0)
        default = data.dtype if isinstance(arg1[0], (NDArray, np.ndarray)) else mx_real_t
        # Checked when used (or by check_format), as MXNet does.
        return _csr(data, indices, indptr, shape, ctx, dtype or default)
    if isinstance(arg1, tuple) and len(arg1) == 2:
        data, (row, col) = _as_numpy(arg1[0]), (_as_numpy(v).astype(_INDEX_DTYPE) for v in arg1[1])
        if shape is None:
            shape = (int(row.max()) + 1 if len(row) else 0, int(col.max()) + 1 if len(col) else 0)
        dense = np.zeros(shape, dtype=np_dtype(dtype_name(dtype)) if dtype is not None else data.dtype)
        np.add.at(dense, (row, col), data)
        return _dense_to_csr(dense, ctx)
    return _from_dense("csr_matrix", arg1, shape, ctx, dtype, _dense_to_csr)


def row_sparse_array(arg1, shape=None, ctx=None, dtype=None):
    """A ``RowSparseNDArray`` from ``(data, indices)`` (the stored rows and their sorted row
    indices; ``shape`` defaults to ``(max index + 1,) + data.shape[1:]``), a shape (all zeros), a
    dense array (NDArray or NumPy) or another row-sparse array."""
    ctx = _context(ctx)
    if isinstance(arg1, RowSparseNDArray):
        result = arg1.copyto(ctx)
        return result.astype(dtype) if dtype is not None else result
    if isinstance(arg1, BaseSparseNDArray):
        return _dense_to_row_sparse(arg1.asnumpy(), ctx, dtype)
    if _is_shape(arg1):
        if shape is not None and tuple(shape) != arg1:
            raise ValueError("row_sparse_array: shape %s given for an array of shape %s" % (tuple(shape), arg1))
        return _row_sparse(np.zeros((0,) + tuple(arg1[1:])), [], tuple(int(v) for v in arg1), ctx, dtype or mx_real_t)
    if isinstance(arg1, tuple) and len(arg1) == 2:
        data, indices = _as_numpy(arg1[0]), _as_numpy(arg1[1])
        if shape is None:
            shape = (int(indices.max()) + 1 if len(indices) else 0,) + data.shape[1:]
        default = data.dtype if isinstance(arg1[0], (NDArray, np.ndarray)) else mx_real_t
        if data.shape[:1] != indices.shape or data.shape[1:] != tuple(shape)[1:]:
            raise MXNetError("row_sparse_array: data of shape %s does not hold %d rows of shape %s"
                             % (data.shape, len(indices), tuple(shape)[1:]))
        return _row_sparse(data, indices, tuple(shape), ctx, dtype or default)
    return _from_dense("row_sparse_array", arg1, shape, ctx, dtype, _dense_to_row_sparse)


def zeros(stype, shape, ctx=None, dtype=None, **kwargs):
    """An all-zero array of storage type ``stype`` ('csr', 'row_sparse' or 'default')."""
    shape = (shape,) if isinstance(shape, integer_types) else tuple(int(s) for s in shape)
    if stype == "csr":
        return csr_matrix(shape, ctx=ctx, dtype=dtype)
    if stype == "row_sparse":
        return row_sparse_array(shape, ctx=ctx, dtype=dtype)
    if stype in (None, "default"):
        return _dense_zeros(shape, ctx=ctx, dtype=dtype, **kwargs)
    raise MXNetError("zeros: unknown storage type %r (use 'default', 'csr' or 'row_sparse')" % (stype,))


def empty(stype, shape, ctx=None, dtype=None):
    """An array of storage type ``stype`` with no stored values (all zeros)."""
    return zeros(stype, shape, ctx=ctx, dtype=dtype)


def array(source_array, ctx=None, dtype=None):
    """A sparse array from a sparse NDArray or a SciPy sparse matrix, of the same storage type
    (SciPy matrices become CSR)."""
    if isinstance(source_array, RowSparseNDArray):
        return row_sparse_array(source_array, ctx=ctx, dtype=dtype)
    if isinstance(source_array, CSRNDArray):
        return csr_matrix(source_array, ctx=ctx, dtype=dtype)
    sps = _scipy_sparse()
    if sps is not None and sps.issparse(source_array):
        return csr_matrix(source_array, ctx=ctx, dtype=dtype)
    raise MXNetError("sparse.array: expected a sparse NDArray or a SciPy sparse matrix, got %s"
                     % type(source_array).__name__)


def retain(data, indices):
    """The stored rows of row-sparse ``data`` among ``indices`` (MXNet's ``sparse.retain``)."""
    if not isinstance(data, RowSparseNDArray):
        raise MXNetError("retain: expected a row_sparse array, got a %s array" % data.stype)
    return data.retain(indices)


def getnnz(data, axis=None):
    """Stored values of a CSR matrix: in all (axis None, shape (1,)), per column (axis 0) or per
    row (axis 1), as int64 (MXNet's ``contrib.getnnz``)."""
    if not isinstance(data, CSRNDArray):
        raise MXNetError("getnnz: expected a CSR matrix, got a %s array" % data.stype)
    indices, indptr = data.indices.asnumpy(), data.indptr.asnumpy()
    if axis is None:
        counts = np.array([len(indices)])
    elif axis in (1, -1):
        counts = np.diff(indptr)
    elif axis in (0, -2):
        counts = np.bincount(indices, minlength=data.shape[1])
    else:
        raise MXNetError("getnnz: axis must be None, 0 or 1, got %r" % (axis,))
    return _dense_array(counts.astype(_INDEX_DTYPE), ctx=data.context, dtype=_INDEX_DTYPE)


def __getattr__(name):
    # MXNet's ``nd.sparse`` has its own functions for the operators with sparse kernels; here
    # every operator of ``nd`` serves (computing on the dense equivalent of sparse inputs).
    from .. import ndarray as nd
    if name.startswith("__") or not hasattr(nd, name):
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    return getattr(nd, name)


_CONVERTERS = {"csr": _dense_to_csr, "row_sparse": _dense_to_row_sparse}


def cast_storage(data, stype):
    """``data`` in storage type ``stype`` ('default', 'csr' or 'row_sparse'), a new array."""
    if stype == "default":
        if isinstance(data, BaseSparseNDArray):
            return _dense_array(data.asnumpy(), ctx=data.context, dtype=data.dtype)
        return data.copy()
    if stype == "csr":
        return csr_matrix(data, ctx=data.context, dtype=data.dtype)
    if stype == "row_sparse":
        return row_sparse_array(data, ctx=data.context, dtype=data.dtype)
    raise MXNetError("cast_storage: unknown storage type %r (use 'default', 'csr' or 'row_sparse')" % (stype,))
