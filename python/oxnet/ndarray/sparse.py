"""Sparse storage (``mxnet.ndarray.sparse``): oxnet stores every array densely.

The names exist so that programs importing them keep working; creating a sparse array raises
an MXNetError that says sparse storage is not supported (``tostype('default')`` data works).
"""

from ..base import MXNetError
from .ndarray import NDArray


class BaseSparseNDArray(NDArray):
    """Base of the sparse array types; never instantiated by oxnet."""

    __slots__ = ()


class CSRNDArray(BaseSparseNDArray):
    """Compressed-sparse-row array; not supported by oxnet."""

    __slots__ = ()


class RowSparseNDArray(BaseSparseNDArray):
    """Row-sparse array; not supported by oxnet."""

    __slots__ = ()


def _unsupported(what):
    def function(*_args, **_kwargs):
        raise MXNetError("%s: sparse storage ('csr', 'row_sparse') is not supported by oxnet; "
                         "use dense arrays (stype='default')" % what)
    function.__name__ = what
    return function


csr_matrix = _unsupported("csr_matrix")
row_sparse_array = _unsupported("row_sparse_array")
zeros = _unsupported("sparse.zeros")
empty = _unsupported("sparse.empty")
array = _unsupported("sparse.array")
