"""Helpers of the data iterators (MXNet's ``mxnet.io.utils``)."""

from collections import OrderedDict

import numpy as np

from ..ndarray import NDArray, array
from ..ndarray.sparse import BaseSparseNDArray

try:
    import h5py
except ImportError:
    h5py = None


def _is_scipy_sparse(value):
    try:
        import scipy.sparse as spsp
    except ImportError:
        return False
    return spsp.issparse(value)


def _array_types():
    return (np.ndarray, NDArray, h5py.Dataset) if h5py else (np.ndarray, NDArray)


def _init_data(data, allow_empty, default_name):
    """Bring ``data`` (an array, a list of arrays or a dict of name -> array) into the
    canonical form: a list of (name, array) pairs sorted by name. A single array takes
    ``default_name``; the arrays of a list are named ``_<i>_<default_name>``."""
    assert data is not None or allow_empty
    if data is None:
        data = []
    if isinstance(data, _array_types()) or _is_scipy_sparse(data) or isinstance(data, BaseSparseNDArray):
        data = [data]
    if isinstance(data, list):
        if not allow_empty:
            assert len(data) > 0
        if len(data) == 1:
            data = OrderedDict([(default_name, data[0])])
        else:
            data = OrderedDict([("_%d_%s" % (i, default_name), d) for i, d in enumerate(data)])
    if not isinstance(data, dict):
        raise TypeError("Input must be NDArray, numpy.ndarray, h5py.Dataset a list of them or dict with them as values")
    converted = {}
    for name, value in data.items():
        if _is_scipy_sparse(value) or isinstance(value, BaseSparseNDArray):
            raise NotImplementedError("NDArrayIter: sparse input '%s' is not supported: oxnet stores arrays "
                                      "densely; pass a dense NDArray or numpy array" % name)
        if isinstance(value, (NDArray, h5py.Dataset) if h5py else NDArray):
            converted[name] = value
            continue
        try:
            converted[name] = array(value)
        except Exception:
            raise TypeError(("Invalid type '%s' for %s, " % (type(value), name))
                            + "should be NDArray, numpy.ndarray or h5py.Dataset") from None
    return sorted(converted.items())


def _has_instance(data, dtype):
    """Whether any array of the canonical (name, array) list is a ``dtype``."""
    return any(isinstance(arr, dtype) for _, arr in data)


def _getdata_by_idx(data, idx):
    """The (name, array) list with every in-memory array reordered by ``idx`` (an HDF5
    dataset stays as it is: it is read in index order batch by batch)."""
    reordered = []
    for name, value in data:
        if h5py and isinstance(value, h5py.Dataset):
            reordered.append((name, value))
        else:
            reordered.append((name, array(value.asnumpy()[idx], value.context, dtype=value.dtype)))
    return reordered


def _slice_along_batch_axis(data, s, batch_axis):
    """``data[s]`` along ``batch_axis``."""
    return data.slice_axis(axis=batch_axis, begin=s.start, end=s.stop)
