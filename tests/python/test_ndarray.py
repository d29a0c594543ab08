"""NDArray semantics: creation, properties, views, reshape codes, indexing, conversion, printing."""

import glob
import os
import pickle

import numpy as np
import pytest

import oxnet as mx
from oxnet.test_utils import assert_almost_equal, same


def test_array_properties(ctx):
    x = mx.nd.array([[1, 2, 3], [4, 5, 6]], ctx=ctx)
    assert x.shape == (2, 3) and x.size == 6 and x.ndim == 2
    assert x.dtype == np.float32  # MXNet's default for non-NDArray sources
    assert x.context == ctx and x.ctx == ctx
    assert x.stype == "default"
    assert isinstance(x.handle, mx._core.NDArrayHandle)
    assert mx.nd.array(np.arange(3, dtype=np.int64), ctx=ctx, dtype="int64").dtype == np.int64
    y = mx.nd.array(x, dtype="float64")
    assert y.dtype == np.float64 and same(y, x.asnumpy())
    assert mx.nd.array(x).dtype == np.float32


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "uint8", "int8", "int32", "int64", "bool"])
def test_numpy_round_trip_every_dtype(dtype, ctx):
    src = (np.arange(24).reshape(2, 3, 4) % 7).astype(dtype)
    x = mx.nd.array(src, ctx=ctx, dtype=dtype)
    out = x.asnumpy()
    assert out.dtype == np.dtype(dtype) and np.array_equal(out, src)
    assert np.array_equal(np.asarray(x), src)
    assert x.astype("float64").dtype == np.float64


def test_bfloat16_storage(ctx):
    x = mx.nd.array([1.0, 2.5, -3.0], ctx=ctx).astype("bfloat16")
    assert x.dtype == mx.base.bfloat16
    back = x.astype("float32").asnumpy()
    assert np.array_equal(back, np.array([1.0, 2.5, -3.0], np.float32))
    assert_almost_equal((x + x).astype("float32"), back * 2)


def test_asscalar_and_truth(ctx):
    assert mx.nd.array([3.5], ctx=ctx).asscalar() == 3.5
    assert float(mx.nd.array([2], ctx=ctx)) == 2.0
    assert bool(mx.nd.array([1], ctx=ctx)) and not bool(mx.nd.array([0], ctx=ctx))
    with pytest.raises(ValueError):
        bool(mx.nd.ones((2,), ctx=ctx))
    with pytest.raises(ValueError):
        mx.nd.ones((2,), ctx=ctx).asscalar()


def test_reshape_views_share_memory(ctx):
    x = mx.nd.arange(24, ctx=ctx)
    y = x.reshape((2, 3, 4))
    assert y.handle.same_chunk(x.handle)
    y[:] = 1
    assert same(x, np.ones(24))
    assert x.reshape(4, -1).shape == (4, 6)
    assert x.reshape((2, 3, 4)).reshape(-3, -2).shape == (6, 4)
    assert x.reshape((2, 3, 4)).reshape(-4, 1, 2, -2).shape == (1, 2, 3, 4)
    assert x.reshape((2, 3, 4)).reshape(0, -1).shape == (2, 12)
    assert x.reshape((10, 5, 4)[:0] + (4, 6)).reshape(-1, 0, reverse=True).shape == (4, 6)
    assert mx.nd.zeros((10, 5, 4), ctx=ctx).reshape(-1, 0, reverse=True).shape == (50, 4)
    with pytest.raises(mx.MXNetError, match="reshape"):
        x.reshape(5, 5)


def test_first_axis_slices_are_views(ctx):
    x = mx.nd.zeros((4, 3), ctx=ctx)
    row = x[1]
    block = x[1:3]
    assert row.handle.same_chunk(x.handle) and block.handle.same_chunk(x.handle)
    block[:] = 5
    row += 1
    expected = np.zeros((4, 3))
    expected[1:3] = 5
    expected[1] += 1
    assert same(x, expected)


def test_basic_indexing_matches_numpy(ctx):
    a = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    x = mx.nd.array(a, ctx=ctx)
    keys = [1, -1, slice(None), slice(1, None), slice(None, None, 2), (0, 1), (1, slice(None), 2),
            (slice(None), slice(None, None, -1)), (Ellipsis, 1), (0, Ellipsis, slice(1, 3)),
            (None, 1), (slice(None), None, 0), (1, 2, 3, 4), (slice(0, 2), slice(1, 3), slice(0, 4, 3)),
            (-1, slice(None, None, -2), Ellipsis)]
    for key in keys:
        expected = a[key]
        if expected.ndim == 0:
            expected = expected.reshape(1)  # MXNet 1.x has no 0-d arrays
        got = x[key]
        assert got.shape == expected.shape, (key, got.shape, expected.shape)
        assert same(got, expected), key
    v = mx.nd.array([1, 2, 3], ctx=ctx)
    assert v[1].shape == (1,) and v[1].asscalar() == 2
    with pytest.raises(IndexError):
        x[2]
    with pytest.raises(IndexError):
        x[0, 0, 0, 0, 0]


def test_array_index_means_take(ctx):
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    x = mx.nd.array(a, ctx=ctx)
    assert same(x[mx.nd.array([3, 0, 3], ctx=ctx)], a[[3, 0, 3]])
    assert same(x[[1, 2]], a[[1, 2]])
    assert same(x[np.array([[0], [2]])], a[np.array([[0], [2]])])


def test_assignment(ctx):
    a = np.zeros((3, 4, 5), dtype=np.float32)
    x = mx.nd.array(a, ctx=ctx)
    updates = [
        ((slice(None),), 1.0),
        ((0,), 2.0),
        ((slice(None), 1), np.arange(5, dtype=np.float32)),
        ((1, slice(1, 3), slice(None, None, 2)), np.full((2, 3), 7, np.float32)),
        ((Ellipsis, 4), np.arange(12, dtype=np.float32).reshape(3, 4)),
        ((2, 3, 4), 9.0),
        ((slice(None, None, -1), 0, 0), np.array([1, 2, 3], np.float32)),
    ]
    for key, value in updates:
        a[key] = value
        x[key] = mx.nd.array(value, ctx=ctx) if isinstance(value, np.ndarray) and value.ndim == 2 else value
        assert same(x, a), key
    x[0] = x[1]  # source aliases the destination's chunk
    a[0] = a[1]
    assert same(x, a)
    with pytest.raises(ValueError):
        x[0] = np.ones((7,))


def test_copy_copyto_astype_context(ctx):
    x = mx.nd.array([[1, 2], [3, 4]], ctx=ctx)
    y = x.copy()
    y += 1
    assert same(x, [[1, 2], [3, 4]]) and same(y, [[2, 3], [4, 5]])
    z = mx.nd.zeros((2, 2), ctx=ctx)
    x.copyto(z)
    assert same(z, x.asnumpy())
    w = mx.nd.zeros((2, 2), ctx=ctx, dtype="int32")
    x.copyto(w)
    assert w.dtype == np.int32 and same(w, [[1, 2], [3, 4]])
    assert x.as_in_context(ctx) is x
    c = x.copyto(mx.cpu(0))
    assert c.context == mx.cpu(0) and same(c, x.asnumpy())
    assert x.astype("float32", copy=False) is x
    assert x.astype(np.int64).dtype == np.int64
    assert x.T.shape == (2, 2) and same(x.T, [[1, 3], [2, 4]])


def test_repr_like_mxnet():
    x = mx.nd.array([[1, 2], [3, 4]])
    assert repr(x) == "\n[[1. 2.]\n [3. 4.]]\n<NDArray 2x2 @cpu(0)>"


def test_context_manager_and_current_context():
    assert mx.current_context() == mx.cpu(0)
    with mx.Context("cpu", 1):
        assert mx.context.current_context() == mx.cpu(1)
        assert mx.nd.zeros((2,)).context == mx.cpu(1)
        assert mx.nd.array([1]).context == mx.cpu(1)
        with mx.cpu_pinned(0):
            assert mx.nd.ones((1,)).context == mx.cpu_pinned(0)
        assert mx.current_context() == mx.cpu(1)
    assert mx.current_context() == mx.cpu(0)
    assert str(mx.gpu(2)) == "gpu(2)" and mx.gpu(1).device_type == "gpu"
    with pytest.raises(ValueError):
        mx.Context("tpu", 0)


def test_gpu_absent_is_a_clear_error():
    if mx.context.num_gpus() > 0:
        pytest.skip("a GPU is present")
    with pytest.raises(mx.MXNetError, match="gpu\\(0\\).*no GPU"):
        mx.nd.zeros((2,), ctx=mx.gpu(0))
    with pytest.raises(mx.MXNetError, match="no GPU"):
        mx.nd.array([1, 2], ctx=mx.gpu(0))


def test_pip_cuda_libraries_are_loaded_by_path_before_gpu_use():
    from oxnet import cuda_libraries

    if not any(glob.glob(os.path.join(d, "libnvrtc.so.*")) for d in cuda_libraries.library_dirs()):
        pytest.skip("pip's nvidia-cuda-nvrtc is not installed")
    mx.context.num_gpus()
    assert any(os.path.basename(p).startswith("libnvrtc.so.") for p in cuda_libraries.preload())


def test_fluent_methods_iteration_and_pickle(ctx):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = mx.nd.array(a, ctx=ctx)
    assert same(x.sum(axis=1), a.sum(axis=1))
    assert same(x.transpose(), a.T)
    assert_almost_equal(x.exp(), np.exp(a))
    assert [r.shape for r in x] == [(3,), (3,)] and len(x) == 2
    y = pickle.loads(pickle.dumps(x))
    assert same(y, a)
    with pytest.raises(AttributeError):
        x.no_such_method


def test_generated_functions_have_docs_and_names():
    assert "broadcasting" in mx.nd.broadcast_add.__doc__
    assert "keepdims" in mx.nd.sum.__doc__ and "axis" in mx.nd.sum.__doc__
    assert mx.nd.elemwise_add is not None and mx.nd._internal._plus is not None
    assert mx.nd._internal._random_uniform.__name__ == "_random_uniform" and mx.nd.random.uniform.__doc__


def test_out_argument_returns_out(ctx):
    a = mx.nd.ones((3,), ctx=ctx)
    out = mx.nd.zeros((3,), ctx=ctx)
    r = mx.nd.elemwise_add(a, a, out=out)
    assert r is out and same(out, [2, 2, 2])
    mx.nd.dot(mx.nd.ones((3, 3), ctx=ctx), a.reshape(3, 1), out=out.reshape(3, 1))
    assert same(out, [3, 3, 3])


def test_operators_take_subclass_instances_and_return_writable_arrays(ctx):
    # Operators read an exact NDArray's handle through its slot; a subclass (which may keep the
    # handle its own way) is read by attribute access.
    class Tagged(mx.nd.NDArray):
        def __init__(self, handle):
            super().__init__(handle)
            self.tag = "kept"

    class Proxied(mx.nd.NDArray):
        __slots__ = ("inner",)

        def __init__(self, inner):
            self.inner = inner

        @property
        def handle(self):
            return self.inner.handle

    a = mx.nd.array([1.0, 2.0], ctx=ctx)
    for wrapped in (Tagged(a.handle), Proxied(a)):
        result = wrapped + a
        assert type(result) is mx.nd.NDArray and result.writable
        assert same(result, [2.0, 4.0]) and same(mx.nd.relu(wrapped), [1.0, 2.0])
    result[:] = 7.0
    assert same(result, [7.0, 7.0])


def test_pool_reuses_memory():
    mx.nd.waitall()
    used0, _, hits0 = mx._core.cpu_pool_stats()[:3]
    for _ in range(20):
        (mx.nd.ones((1000, 100)) + 1).wait_to_read()
    mx.nd.waitall()
    used1, pooled, hits1 = mx._core.cpu_pool_stats()[:3]
    assert hits1 - hits0 >= 30 and pooled > 0
    assert used1 <= used0 + 2 * 1000 * 100 * 4


def test_memory_is_taken_when_the_op_runs():
    # Delayed allocation (as MXNet's): pushing work reserves no memory; running it does.
    mx.nd.waitall()
    used0 = mx._core.cpu_pool_stats()[0]
    a = mx.nd.empty((2000, 500))
    assert mx._core.cpu_pool_stats()[0] == used0
    a[:] = 3
    a.wait_to_read()
    assert mx._core.cpu_pool_stats()[0] >= used0 + 2000 * 500 * 4
    assert a.asnumpy().sum() == 3 * 2000 * 500


def test_advanced_indexing_matches_numpy(ctx):
    a = np.arange(4 * 5 * 6 * 3, dtype=np.float32).reshape(4, 5, 6, 3)
    keys = [([1, 2],), (np.array([[3, 0], [1, 2]]),), (1, [2, 3]), ([0, 3], slice(1, 4), [2, 5]),
            (slice(None), [4, 0], [[1], [2]]), ([1, 2], slice(3, 5), None, [2, 3]),
            (None, slice(None), [1, 2], None, [3, 4]), (Ellipsis, [2, 0]), (slice(0, 3), [[1], [4]], slice(None, None, -2))]
    for key in keys:
        x = mx.nd.array(a, ctx=ctx)
        assert same(x[key], a[key]), key
        x_key = tuple(mx.nd.array(k, ctx=ctx, dtype="int64") if isinstance(k, (list, np.ndarray)) else k for k in key)
        assert same(x[x_key], a[key]), key
        expected = a.copy()
        value = -np.arange(expected[key].size, dtype=np.float32).reshape(expected[key].shape)
        expected[key] = value
        x[key] = value
        assert same(x, expected), key
        expected[key] = 7
        x[key] = 7
        assert same(x, expected), key
    with pytest.raises(IndexError):
        mx.nd.array(a, ctx=ctx)[[0, 4]]


def test_scatter_set_nd_writes_in_place(ctx):
    x = mx.nd.zeros((3, 4), ctx=ctx)
    indices = mx.nd.array([[0, 2], [1, 3]], ctx=ctx, dtype="int64")
    mx.nd._internal._scatter_set_nd(x, mx.nd.array([5, 6], ctx=ctx), indices, shape=(3, 4), out=x)
    expected = np.zeros((3, 4), np.float32)
    expected[[0, 2], [1, 3]] = [5, 6]
    assert same(x, expected)


def test_contiguous_basic_indexing_returns_views(ctx):
    x = mx.nd.array(np.arange(60).reshape(3, 4, 5), ctx=ctx)
    assert mx.nd.NDArray._basic_indexing_slice_is_contiguous((slice(1, 2), slice(None), slice(None)), (3, 4, 5))
    assert not mx.nd.NDArray._basic_indexing_slice_is_contiguous((slice(None), slice(1, 3), slice(None)), (3, 4, 5))
    view = x[1, 1:3]
    view[:] = -1
    assert (x[1, 1:3].asnumpy() == -1).all() and x.asnumpy()[1, 0, 0] == 20
    copy = x[:, 1:3]  # not contiguous: a copy
    copy[:] = 0
    assert x.asnumpy()[0, 1, 0] == 5


def test_assignment_while_recording_is_an_error(ctx):
    x = mx.nd.zeros((3, 4), ctx=ctx)
    y = mx.nd.ones((4,), ctx=ctx)
    y.attach_grad()
    with mx.autograd.record():
        with pytest.raises(mx.MXNetError, match="Inplace operations"):
            x[1] = y
        with pytest.raises(mx.MXNetError, match="Inplace operations"):
            x[[0, 2]] = y


def test_shape_methods_inplace_views(ctx):
    x = mx.nd.array(np.arange(30).reshape(2, 3, 5), ctx=ctx)
    flat, flat_copy = x.flatten(inplace=True), x.flatten()
    expanded, squeezed = x.expand_dims(-1, inplace=True), x.reshape(2, 1, 3, 5).squeeze(axis=1, inplace=True)
    assert flat.shape == (2, 15) and expanded.shape == (2, 3, 5, 1) and squeezed.shape == (2, 3, 5)
    x[0] = -1
    assert flat.asnumpy()[0, 0] == -1 and expanded.asnumpy()[0, 0, 0, 0] == -1
    assert flat_copy.asnumpy()[0, 0] == 0
    assert mx.nd.ones((1, 1), ctx=ctx).squeeze(inplace=True).shape == (1,)
    with pytest.raises(ValueError):
        x.reshape(2, 3)


def test_legacy_helpers(ctx):
    x = mx.nd.zeros((1, 2, 3, 4), ctx=ctx)
    assert mx.nd.moveaxis(x, [0, 1], [2, 3]).shape == (3, 4, 1, 2)
    with pytest.raises(ValueError):
        mx.nd.moveaxis(x, [0, 0], [1, 2])
    parts = mx.nd.split_v2(mx.nd.array(np.arange(12).reshape(2, 6), ctx=ctx), (1, 3), axis=1)
    assert [p.shape for p in parts] == [(2, 1), (2, 2), (2, 3)] and same(parts[2], np.arange(12).reshape(2, 6)[:, 3:])
    m = np.arange(12, dtype=np.float32).reshape(3, 4)
    rows = mx.nd.array([1, 3, 0], ctx=ctx)
    assert same(mx.nd.choose_element_0index(mx.nd.array(m, ctx=ctx), rows), m[[0, 1, 2], [1, 3, 0]])
    filled = m.copy()
    filled[[0, 1, 2], [1, 3, 0]] = [-1, -2, -3]
    assert same(mx.nd.fill_element_0index(mx.nd.array(m, ctx=ctx), mx.nd.array([-1, -2, -3], ctx=ctx), rows), filled)
    out = mx.nd.zeros((3, 4), ctx=ctx)
    mx.nd.onehot_encode(rows, out)
    assert same(out, np.eye(4, dtype=np.float32)[[1, 3, 0]])
    assert mx.nd.array(np.ones(()), ctx=ctx).shape == ()
    with pytest.raises(mx.MXNetError):
        mx.nd.broadcast_like(mx.nd.ones((1, 2), ctx=ctx), mx.nd.ones((3, 2), ctx=ctx), lhs_axes=(), rhs_axes=())


def test_cached_op_calls_a_symbol(ctx):
    data = mx.sym.var("data")
    op = mx.nd.CachedOp(mx.sym.FullyConnected(data, num_hidden=2, name="fc") * 2)
    x, w, b = mx.nd.ones((3, 4), ctx=ctx), mx.nd.ones((2, 4), ctx=ctx), mx.nd.ones((2,), ctx=ctx)
    assert same(op(x, w, b), np.full((3, 2), 10, np.float32))
    out = mx.nd.zeros((3, 2), ctx=ctx)
    op(x, w, b, out=out)
    assert same(out, np.full((3, 2), 10, np.float32))


def test_dlpack_export_shares_memory_with_numpy():
    x = mx.nd.arange(12).reshape((3, 4))
    y = x + 1                                   # pending when exported: the export waits for it
    shared = np.from_dlpack(y)                  # NumPy's __dlpack__ / __dlpack_device__ protocol
    assert same(shared, np.arange(1, 13, dtype=np.float32).reshape(3, 4))
    y[:] = 7                                    # zero-copy: NumPy sees later writes
    y.wait_to_read()
    assert (shared == 7).all()
    row = mx.nd.ones((4, 2), dtype="int32")[2]  # a view: the capsule addresses its offset
    row[:] = 5
    assert np.from_dlpack(row).tolist() == [5, 5]
    assert y.__dlpack_device__() == (1, 0)


def test_dlpack_capsule_keeps_the_array_alive_and_round_trips():
    capsule = mx.nd.array([[1.5, 2.5]], dtype="float64").to_dlpack_for_read()  # the array has no other owner
    back = mx.nd.from_dlpack(capsule)
    assert back.dtype == np.float64 and same(back, np.array([[1.5, 2.5]]))
    with pytest.raises(ValueError, match="consumed only once"):
        mx.nd.from_dlpack(capsule)
    writable = mx.nd.zeros((2, 3))
    unconsumed = mx.nd.to_dlpack_for_write(writable)
    del unconsumed                              # an unconsumed capsule frees its tensor when collected
    writable[:] = 3                             # the array is unaffected by the capsule's release
    assert same(writable, np.full((2, 3), 3, np.float32))


def test_c_api_imports_a_dlpack_tensor_through_ctypes():
    """Programs that call MXNet's C API through ctypes (mx.base._LIB) import DLPack tensors and
    wrap the handle in an NDArray; failures come back through check_call as MXNetError."""
    import ctypes
    from oxnet.base import _LIB, NDArrayHandle, c_str, check_call

    source = mx.nd.arange(6, dtype="float64").reshape((2, 3))
    capsule = mx.nd.to_dlpack_for_read(source)
    pointer = ctypes.pythonapi.PyCapsule_GetPointer(ctypes.py_object(capsule), c_str("dltensor"))
    handle = NDArrayHandle()
    check_call(_LIB.MXNDArrayFromDLPack(ctypes.c_void_p(pointer), ctypes.byref(handle)))
    ctypes.pythonapi.PyCapsule_SetName(ctypes.py_object(capsule), c_str("used_dltensor"))
    imported = mx.nd.NDArray(handle=handle)
    assert imported.dtype == np.float64 and same(imported, np.arange(6.0).reshape(2, 3))
    source[:] = 0                               # the import is a copy
    assert imported.asnumpy().sum() == 15
    with pytest.raises(mx.MXNetError, match="null tensor pointer"):
        check_call(_LIB.MXNDArrayFromDLPack(None, ctypes.byref(NDArrayHandle())))
    check_call(_LIB.MXNDArrayFree(None))


def test_from_dlpack_copies_numpy_arrays_including_strided_ones():
    source = np.arange(24, dtype=np.int64).reshape(4, 6)
    for foreign in (source, source[:, ::2], source.T, np.array(True), np.zeros((0, 3), np.float16)):
        imported = mx.nd.from_dlpack(foreign)
        assert imported.shape == foreign.shape and imported.dtype == foreign.dtype
        assert same(imported, foreign)
    copied = mx.nd.from_dlpack(source)
    source[0, 0] = 100                          # an import is a copy
    assert copied[0, 0].asscalar() == 0


def test_from_numpy_shares_memory_without_a_copy():
    source = np.arange(6, dtype=np.float32).reshape(3, 2)
    shared = mx.nd.from_numpy(source)
    assert not source.flags["WRITEABLE"]
    shared[2, 1] = 100
    assert source[2, 1] == 100  # the NDArray writes into the NumPy array's memory
    del source
    assert (shared * 2).asnumpy()[2, 1] == 200  # the NDArray keeps the memory alive
    copied_from = np.ones((2, 2), dtype=np.int32)
    copy = mx.nd.from_numpy(copied_from, zero_copy=False)
    copy[:] = 5
    assert copied_from.flags["WRITEABLE"] and (copied_from == 1).all()
    assert mx.nd.from_numpy(np.zeros((1, 0, 2))).shape == (1, 0, 2)
    with pytest.raises(ValueError, match="c-contiguous"):
        mx.nd.from_numpy(np.ones((2, 3)).T)
