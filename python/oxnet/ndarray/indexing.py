"""Basic indexing of NDArrays: ints, slices (with steps), Ellipsis, None; an array index means take."""

import numpy as np

from ..base import MXNetError, integer_types, numeric_types
from .ndarray import NDArray, _op, array, zeros


def _expand(key, ndim):
    """Normalize a key to a tuple covering every axis once (Ellipsis expanded)."""
    key = key if isinstance(key, tuple) else (key,)
    for k in key:
        if isinstance(k, (NDArray, np.ndarray, list)):
            raise IndexError("indexing with arrays inside a tuple (advanced indexing) is not supported; "
                             "index with one array to take rows, or use mx.nd.take")
        if not (k is None or k is Ellipsis or isinstance(k, (slice,) + integer_types)):
            raise IndexError("NDArray indices must be ints, slices, None, Ellipsis or arrays, not %s" % type(k).__name__)
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
    if consumed > ndim:
        raise IndexError("too many indices (%d) for an array of %d dimension(s)" % (consumed, ndim))
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    out = []
    for k in key:
        if k is Ellipsis:
            out.extend([slice(None)] * (ndim - consumed))
        else:
            out.append(k)
    if Ellipsis not in key:
        out.extend([slice(None)] * (ndim - consumed))
    return out


def _region(shape, key):
    """begin/end/step per axis, the region's shape, and the result's shape (ints dropped, None added)."""
    begin, end, step, region, result = [], [], [], [], []
    axis = 0
    for k in _expand(key, len(shape)):
        if k is None:
            result.append(1)
            continue
        n = shape[axis]
        if isinstance(k, integer_types):
            i = int(k) + n if k < 0 else int(k)
            if not 0 <= i < n:
                raise IndexError("index %d is out of bounds for axis %d with size %d" % (k, axis, n))
            begin.append(i)
            end.append(i + 1)
            step.append(1)
            region.append(1)
        else:
            if k.step == 0:
                raise ValueError("slice step cannot be zero")
            length = len(range(*k.indices(n)))
            begin.append(k.start)
            end.append(k.stop)
            step.append(k.step)
            region.append(length)
            result.append(length)
        axis += 1
    return tuple(begin), tuple(end), tuple(step), tuple(region), tuple(result)


def _index_array(arr, key):
    if isinstance(key, NDArray):
        return key
    return array(np.asarray(key), ctx=arr.context, dtype="int64")


def get_item(arr, key):
    if isinstance(key, (NDArray, np.ndarray, list)):
        return _op("take", arr, _index_array(arr, key))
    shape = arr.shape
    if isinstance(key, integer_types) and arr.ndim > 0:
        n = shape[0]
        i = int(key) + n if key < 0 else int(key)
        if not 0 <= i < n:
            raise IndexError("index %d is out of bounds for axis 0 with size %d" % (key, n))
        # MXNet 1.x arrays are never 0-d: indexing a 1-D array keeps one element of shape (1,).
        view = arr.handle.slice_view(i, i + 1) if arr.ndim == 1 else arr.handle.at_view(i)
        return NDArray(view, arr.writable)
    if isinstance(key, slice) and key.step in (None, 1) and arr.ndim > 0:
        start, stop, _ = key.indices(shape[0])
        return NDArray(arr.handle.slice_view(start, max(start, stop)), arr.writable)
    begin, end, step, region, result = _region(shape, key)
    out = _op("slice", arr, begin=begin, end=end, step=step) if begin else arr
    if not result:
        result = (1,)
    return out.reshape(result) if out.shape != result else out


def set_item(arr, key, value):
    if isinstance(key, (NDArray, np.ndarray, list)):
        raise IndexError("assignment through an array index (scatter) is not supported yet; "
                         "use slices or integers")
    begin, end, step, region, _ = _region(arr.shape, key)
    if isinstance(value, numeric_types):
        _op("_slice_assign_scalar", arr, scalar=float(value), begin=begin, end=end, step=step, out=arr)
        return
    if not isinstance(value, NDArray):
        value = array(value, ctx=arr.context, dtype=arr.dtype)
    else:
        if value.dtype != arr.dtype:
            value = value.astype(arr.dtype)
        if value.context != arr.context:
            # MXNet copies a value from another device on assignment.
            value = value.as_in_context(arr.context)
    if value.shape != region:
        if value.size == int(np.prod(region)):
            value = value.reshape(region)
        else:
            try:
                broadcast = _op("broadcast_add", zeros(region, ctx=arr.context, dtype=arr.dtype), value)
            except MXNetError:
                broadcast = None
            if broadcast is None or broadcast.shape != region:
                raise ValueError("cannot assign a value of shape %s to a region of shape %s" % (value.shape, region))
            value = broadcast
    _op("_slice_assign", arr, value, begin=begin, end=end, step=step, out=arr)
