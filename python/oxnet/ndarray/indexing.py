"""NDArray indexing with MXNet 1.9.1's (NumPy's) semantics.

Basic indexing (ints, slices, Ellipsis, None) returns a view sharing memory where the selected
elements are contiguous, and a copy (the ``slice`` operator) otherwise. Advanced indexing (integer
arrays, lists and tuples, possibly mixed with ints and slices) gathers with ``gather_nd`` and
assigns with ``_scatter_set_nd``. Integer indices out of range raise IndexError; boolean arrays
are not indices in MXNet's legacy (non-NumPy) mode.
"""

import numpy as np

from ..base import integer_types, numeric_types
from .ndarray import NDArray, _op, array

_ARRAY_LIKE = (NDArray, np.ndarray, list, tuple, range)


def _is_advanced(entry):
    """Whether a key entry takes part in advanced indexing (ints do, once arrays are present)."""
    return isinstance(entry, _ARRAY_LIKE + integer_types)


def _expand_key(key, ndim):
    """The key as a list with one entry per axis (Ellipsis and missing trailing axes become full
    slices) plus its None entries, which add axes of size 1."""
    key = list(key) if isinstance(key, tuple) else [key]
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    for k in key:
        if isinstance(k, (bool, np.bool_)) or (isinstance(k, (NDArray, np.ndarray)) and k.dtype == np.bool_):
            raise ValueError("boolean indexing is not supported for legacy NDArrays; index with "
                             "integer arrays (e.g. the positions from numpy.nonzero)")
        if not (k is None or k is Ellipsis or isinstance(k, (slice,) + _ARRAY_LIKE + integer_types)):
            raise IndexError("NDArray indices must be ints, slices, None, Ellipsis or integer arrays, "
                             "not %s" % type(k).__name__)
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
    if consumed > ndim:
        raise IndexError("too many indices (%d) for an array of %d dimension(s)" % (consumed, ndim))
    fill = [slice(None)] * (ndim - consumed)
    if any(k is Ellipsis for k in key):
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        return key[:at] + fill + key[at + 1:]
    return key + fill


def _check_int(index, axis, size):
    if not -size <= index < size:
        raise IndexError("index %d is out of bounds for axis %d with size %d" % (index, axis, size))
    return int(index) % size


def slices_are_contiguous(slice_key, shape):
    """Whether ``array[slice_key]`` (one slice per axis) covers one contiguous run of a C-order
    array: reading axes from the last, once an axis selects a proper subset, every axis before it
    selects at most one element, and no axis steps over elements while selecting several."""
    lengths = [len(range(*s.indices(n))) for s, n in zip(slice_key, shape)]
    if int(np.prod(lengths)) <= 1:
        return True
    inner_is_subset = False
    for s, n, length in zip(reversed(slice_key), reversed(shape), reversed(lengths)):
        step = s.indices(n)[2]
        if length > 1 and (step != 1 or inner_is_subset):
            return False
        if length < n:
            inner_is_subset = True
    return True


def _output_shape(key, result_dims):
    """The indexing result's shape: walking the key, each slice keeps the next of ``result_dims``,
    each None adds an axis of size 1, ints and array indices add nothing (the caller places an
    advanced block)."""
    dims = iter(result_dims)
    return [1 if k is None else next(dims) for k in key if k is None or isinstance(k, slice)]


# ---- basic indexing ---------------------------------------------------------------------------
def _basic_region(arr, key):
    """Per axis slices (ints as one-element slices), the region's shape and the result's shape
    (ints dropped, None added; at least 1-d, as legacy NDArrays are)."""
    slices, region, axis = [], [], 0
    for k in key:
        if k is None:
            continue
        n = arr.shape[axis]
        if isinstance(k, integer_types):
            i = _check_int(k, axis, n)
            k = slice(i, i + 1)
        elif k.step == 0:
            raise ValueError("slice step cannot be zero")
        slices.append(k)
        region.append(len(range(*k.indices(n))))
        axis += 1
    kept = [length for k, length in zip((k for k in key if k is not None), region) if isinstance(k, slice)]
    return slices, tuple(region), tuple(_output_shape(key, kept)) or (1,)


def _basic_get(arr, key):
    slices, region, shape = _basic_region(arr, key)
    if slices_are_contiguous(slices, arr.shape):
        # One contiguous run: a view of the flat array, so writes through it reach ``arr``.
        strides = np.cumprod((1,) + arr.shape[:0:-1])[::-1]
        starts = [s.indices(n)[0] if length else 0 for s, n, length in zip(slices, arr.shape, region)]
        begin = int(np.dot(starts, strides)) if arr.ndim else 0
        end = begin + (int(np.dot([length - 1 for length in region], strides)) + 1 if all(region) else 0)
        flat = arr.reshape(-1)
        out = NDArray(flat.handle.slice_view(begin, end), arr.writable).reshape(region or (1,))
    else:
        out = _op("slice", arr, begin=tuple(s.start for s in slices), end=tuple(s.stop for s in slices),
                  step=tuple(s.step for s in slices))
    return out.reshape(shape) if out.shape != shape else out


def _value_array(arr, value, shape):
    """``value`` as an array of ``arr``'s dtype and device broadcast to ``shape`` (NumPy's rules;
    extra leading axes of size 1 are dropped)."""
    if isinstance(value, NDArray):
        value = value.as_in_context(arr.context)
        if value.dtype != arr.dtype:
            value = value.astype(arr.dtype)
    else:
        try:
            value = array(value, ctx=arr.context, dtype=arr.dtype)
        except (TypeError, ValueError) as error:
            raise TypeError("cannot assign a value of type %s to an NDArray" % type(value).__name__) from error
    shape = tuple(shape)
    if value.shape == shape:
        return value
    value_shape = value.shape
    while len(value_shape) > len(shape) and value_shape[0] == 1:
        value_shape = value_shape[1:]
    if value_shape != value.shape:
        value = value.reshape(value_shape or (1,))
    if value.size == 0 or value.shape == shape:
        return value.reshape(shape)
    try:
        return value.broadcast_to(shape)
    except ValueError:
        raise ValueError("cannot assign a value of shape %s to a region of shape %s" % (value.shape, shape)) from None


def _basic_set(arr, key, value):
    slices, region, shape = _basic_region(arr, key)
    whole = region == arr.shape and all(s.indices(n)[2] > 0 for s, n in zip(slices, arr.shape))
    if isinstance(value, numeric_types):
        if whole:
            _op("_full", shape=arr.shape, ctx=str(arr.context), dtype=arr.handle.dtype, value=float(value), out=arr)
        else:
            arr.slice_assign_scalar(float(value), tuple(s.start for s in slices),
                                    tuple(s.stop for s in slices), tuple(s.step for s in slices))
        return
    value = _value_array(arr, value, shape).reshape(region)
    if whole:
        if value.handle is not arr.handle:
            value.copyto(arr)
        return
    arr.slice_assign(value, tuple(s.start for s in slices), tuple(s.stop for s in slices),
                     tuple(s.step for s in slices))


# ---- advanced indexing ------------------------------------------------------------------------
def _index_array(entry, axis, size, ctx):
    """An advanced index entry as an int64 NDArray (host indices are bounds-checked here)."""
    if isinstance(entry, NDArray):
        return (entry if entry.dtype == np.int64 else entry.astype("int64")).as_in_context(ctx)
    if isinstance(entry, integer_types):
        entry = [entry]
    host = np.asarray(entry)
    if host.size and not np.issubdtype(host.dtype, np.integer):
        raise IndexError("arrays used as indices must be of integer type, not %s" % host.dtype)
    host = host.astype(np.int64)
    bad = (host < -size) | (host >= size)
    if bad.any():
        raise IndexError("index %d is out of bounds for axis %d with size %d" % (host[bad].flat[0], axis, size))
    return array(host % max(size, 1), ctx=ctx, dtype="int64")


def _advanced_plan(arr, key):
    """The ``gather_nd`` index array of ``arr[key]`` and the result's final shape."""
    key_nd = [k for k in key if k is not None]
    advanced_in_key = [i for i, k in enumerate(key) if _is_advanced(k)]
    adjacent = advanced_in_key == list(range(advanced_in_key[0], advanced_in_key[-1] + 1))
    # Full slices after the last indexed axis need no index: gather_nd copies trailing axes whole.
    indexed = len(key_nd)
    while indexed and isinstance(key_nd[indexed - 1], slice) and key_nd[indexed - 1] == slice(None):
        indexed -= 1
    ctx = arr.context
    advanced = {ax: _index_array(k, ax, arr.shape[ax], ctx)
                for ax, k in enumerate(key_nd[:indexed]) if _is_advanced(k)}
    block = np.broadcast_shapes(*(a.shape for a in advanced.values()))
    first_advanced = min(advanced)
    slice_axes = [ax for ax in range(indexed) if ax not in advanced]
    lead = sum(1 for ax in slice_axes if ax < first_advanced) if adjacent else 0
    ranges = {ax: range(*key_nd[ax].indices(arr.shape[ax])) for ax in slice_axes}
    index_space = (tuple(len(ranges[ax]) for ax in slice_axes[:lead]) + block
                   + tuple(len(ranges[ax]) for ax in slice_axes[lead:]))
    columns = []
    for ax in range(indexed):
        if ax in advanced:
            index = advanced[ax]
            shape = (1,) * lead + (1,) * (len(block) - index.ndim) + index.shape
            shape += (1,) * (len(index_space) - len(shape))
        else:
            rank = slice_axes.index(ax)
            position = rank if rank < lead else rank + len(block)
            r = ranges[ax]
            index = _op("_arange", start=r.start, stop=r.stop, step=r.step, ctx=str(ctx), dtype="int64") \
                if len(r) else array(np.zeros(0), ctx=ctx, dtype="int64")
            shape = [1] * len(index_space)
            shape[position] = len(r)
        index = index.reshape(shape)
        columns.append(index if index.shape == index_space else _op("broadcast_to", index, shape=index_space))
    indices = _op("stack", *columns, axis=0)
    result_dims = index_space + arr.shape[indexed:]
    final_shape = _output_shape(key, result_dims[:lead] + result_dims[lead + len(block):] if adjacent
                                else result_dims[len(block):])
    # The block's axes go where its first index is when the indices are adjacent, else in front.
    if adjacent:
        at = sum(1 for k in key[:advanced_in_key[0]] if k is None or isinstance(k, slice))
        final_shape[at:at] = list(block)
    else:
        final_shape[:0] = list(block)
    return indices, result_dims, tuple(final_shape)


def _advanced_get(arr, key):
    indices, _, final_shape = _advanced_plan(arr, key)
    out = _op("gather_nd", arr, indices)
    return out.reshape(final_shape) if out.shape != final_shape else out


def _advanced_set(arr, key, value):
    indices, result_dims, final_shape = _advanced_plan(arr, key)
    if isinstance(value, numeric_types):
        value = _op("_full", shape=result_dims, ctx=str(arr.context), dtype=arr.handle.dtype, value=float(value))
    else:
        value = _value_array(arr, value, final_shape).reshape(result_dims)
    _op("_scatter_set_nd", arr, value, indices, shape=arr.shape, out=arr)


# ---- entry points -----------------------------------------------------------------------------
def get_item(arr, key):
    shape = arr.shape
    if isinstance(key, integer_types) and not isinstance(key, (bool, np.bool_)) and arr.ndim > 0:
        i = _check_int(key, 0, shape[0])
        # MXNet 1.x arrays are never 0-d: indexing a 1-D array keeps one element of shape (1,).
        view = arr.handle.slice_view(i, i + 1) if arr.ndim == 1 else arr.handle.at_view(i)
        return NDArray(view, arr.writable)
    if isinstance(key, slice) and key.step in (None, 1) and arr.ndim > 0:
        start, stop, _ = key.indices(shape[0])
        return NDArray(arr.handle.slice_view(start, max(start, stop)), arr.writable)
    if (isinstance(key, tuple) and not key) or (arr.ndim == 0 and isinstance(key, slice) and key == slice(None)):
        return arr
    key = _expand_key(key, arr.ndim)
    if any(isinstance(k, _ARRAY_LIKE) for k in key):
        return _advanced_get(arr, key)
    return _basic_get(arr, key)


def set_item(arr, key, value):
    key = _expand_key(key, arr.ndim)
    if any(isinstance(k, _ARRAY_LIKE) for k in key):
        _advanced_set(arr, key, value)
    else:
        _basic_set(arr, key, value)
