"""What only a GPU context has: device memory and its pool, copies between devices, cuBLAS
products, device-side errors. Operator values on the GPU are checked by the `ctx`-parametrized
tests (the operator table, ndarray, autograd, nn ops); these tests skip with 'no GPU' without one."""

import numpy as np
import pytest

import oxnet as mx
from oxnet.test_utils import assert_almost_equal

pytestmark = pytest.mark.skipif(mx.context.num_gpus() == 0, reason="no GPU")

DTYPES = ["float32", "float64", "float16", "int32", "int64", "int8", "uint8", "bool"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_arrays_round_trip_through_the_gpu(dtype):
    x = (np.arange(1000) % 7 - 3).astype(dtype).reshape(10, 100)
    on_gpu = mx.nd.array(x, ctx=mx.gpu(0), dtype=dtype)
    assert on_gpu.context == mx.gpu(0)
    np.testing.assert_array_equal(on_gpu.asnumpy(), x)
    back = on_gpu.as_in_context(mx.cpu())
    assert back.context == mx.cpu()
    np.testing.assert_array_equal(back.asnumpy(), x)
    # A view of a GPU array copies only its rows.
    np.testing.assert_array_equal(on_gpu[3:5].asnumpy(), x[3:5])


def test_copyto_casts_across_devices():
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
    src = mx.nd.array(x)
    dst = mx.nd.zeros((4, 6), ctx=mx.gpu(0), dtype="float16")
    src.copyto(dst)
    assert_almost_equal(dst.asnumpy(), x.astype(np.float16))
    host = mx.nd.zeros((4, 6), dtype="float64")
    dst.copyto(host)
    assert_almost_equal(host.asnumpy(), x.astype(np.float16).astype(np.float64))
    assert_almost_equal(mx.nd.array(x, ctx=mx.gpu(0)).astype("int32").asnumpy(), x.astype(np.int32))


def test_creation_on_the_gpu_matches_the_cpu():
    g = mx.gpu(0)
    np.testing.assert_array_equal(mx.nd.zeros((3, 5), ctx=g).asnumpy(), np.zeros((3, 5), np.float32))
    np.testing.assert_array_equal(mx.nd.ones((2, 2), ctx=g, dtype="int64").asnumpy(), np.ones((2, 2), np.int64))
    np.testing.assert_array_equal(mx.nd.full((4,), 2.5, ctx=g).asnumpy(), np.full((4,), 2.5, np.float32))
    np.testing.assert_array_equal(mx.nd.arange(0, 10, 2, ctx=g).asnumpy(), np.arange(0, 10, 2, dtype=np.float32))
    mx.random.seed(7)
    on_gpu = mx.nd.random.normal(0, 1, shape=(100,), ctx=g).asnumpy()
    mx.random.seed(7)
    on_cpu = mx.nd.random.normal(0, 1, shape=(100,)).asnumpy()
    np.testing.assert_array_equal(on_gpu, on_cpu)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_dot_and_batch_dot_through_cublas(dtype, ta, tb):
    rng = np.random.RandomState(0)
    a = rng.uniform(-1, 1, (7, 5) if not ta else (5, 7)).astype(dtype)
    b = rng.uniform(-1, 1, (5, 3) if not tb else (3, 5)).astype(dtype)
    expected = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    out = mx.nd.dot(mx.nd.array(a, ctx=mx.gpu(0), dtype=dtype), mx.nd.array(b, ctx=mx.gpu(0), dtype=dtype), transpose_a=ta, transpose_b=tb)
    tol = 1e-2 if dtype == "float16" else 1e-5
    assert_almost_equal(out.asnumpy().astype(np.float64), expected, rtol=tol, atol=tol)
    batch_a = np.stack([a, 2 * a])
    batch_b = np.stack([b, -b])
    out = mx.nd.batch_dot(mx.nd.array(batch_a, ctx=mx.gpu(0), dtype=dtype), mx.nd.array(batch_b, ctx=mx.gpu(0), dtype=dtype),
                          transpose_a=ta, transpose_b=tb)
    assert_almost_equal(out.asnumpy().astype(np.float64), np.stack([expected, -2 * expected]), rtol=tol, atol=tol)


def test_fully_connected_forward_and_backward_match_the_cpu():
    rng = np.random.RandomState(1)
    x, w, b = rng.randn(8, 3, 4).astype(np.float32), rng.randn(5, 12).astype(np.float32), rng.randn(5).astype(np.float32)
    results = []
    for ctx in (mx.cpu(), mx.gpu(0)):
        args = [mx.nd.array(v, ctx=ctx) for v in (x, w, b)]
        for a in args:
            a.attach_grad()
        with mx.autograd.record():
            y = mx.nd.FullyConnected(*args, num_hidden=5)
            loss = (mx.nd.relu(y) * y).sum()
        loss.backward()
        results.append([y.asnumpy()] + [a.grad.asnumpy() for a in args])
    for cpu, gpu in zip(*results):
        assert_almost_equal(gpu, cpu, rtol=1e-4, atol=1e-4)


def test_reductions_and_broadcasting_on_the_gpu():
    rng = np.random.RandomState(2)
    x = rng.randn(4, 5, 6).astype(np.float32)
    g = mx.nd.array(x, ctx=mx.gpu(0))
    assert_almost_equal(mx.nd.sum(g, axis=1).asnumpy(), x.sum(axis=1), rtol=1e-5, atol=1e-5)
    assert_almost_equal(mx.nd.mean(g, axis=(0, 2), keepdims=True).asnumpy(), x.mean(axis=(0, 2), keepdims=True), rtol=1e-5, atol=1e-5)
    assert_almost_equal(mx.nd.max(g).asnumpy(), x.max(keepdims=True).reshape(1))
    row = rng.randn(6).astype(np.float32)
    assert_almost_equal((g + mx.nd.array(row, ctx=mx.gpu(0))).asnumpy(), x + row)
    assert_almost_equal(mx.nd.broadcast_mul(g, mx.nd.array(x[:, :1, :], ctx=mx.gpu(0))).asnumpy(), x * x[:, :1, :], rtol=1e-6)


def test_the_pool_reuses_freed_blocks_and_empty_cache_returns_them():
    g = mx.gpu(0)
    mx.nd.waitall()
    a = mx.nd.zeros((1 << 20,), ctx=g)
    a.wait_to_read()
    used, _, hits = mx._core.gpu_pool_stats(0)[:3]
    assert used >= 4 << 20
    del a
    mx.nd.waitall()
    pooled = mx._core.gpu_pool_stats(0)[1]
    assert pooled >= 4 << 20
    b = mx.nd.ones((1 << 20,), ctx=g)
    b.wait_to_read()
    assert mx._core.gpu_pool_stats(0)[2] > hits, "an allocation of a freed size class is served from the pool"
    del b
    g.empty_cache()
    assert mx._core.gpu_pool_stats(0)[1] == 0
    free, total = mx.context.gpu_memory_info(0)
    assert 0 < free <= total


def test_out_of_memory_is_a_clear_error():
    _, total = mx.context.gpu_memory_info(0)
    with pytest.raises(mx.MXNetError, match=r"out of memory on gpu\(0\).*requested"):
        mx.nd.zeros((total // 2,), ctx=mx.gpu(0), dtype="float64").wait_to_read()
    # The device is still usable afterwards.
    np.testing.assert_array_equal(mx.nd.ones((3,), ctx=mx.gpu(0)).asnumpy(), np.ones(3, np.float32))


def test_device_errors_name_the_problem():
    x = mx.nd.ones((2, 3), ctx=mx.gpu(0))
    with pytest.raises(mx.MXNetError, match="different devices"):
        (x + mx.nd.ones((2, 3))).wait_to_read()
    with pytest.raises(mx.MXNetError, match=r"gpu\(7\)|does not exist"):
        mx.nd.ones((2,), ctx=mx.gpu(7)).wait_to_read()
    with pytest.raises(ValueError, match="only host"):
        mx.nd.ones((2,), ctx=mx.gpu(0)).to_dlpack_for_read()


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_softmax_family_and_pick_match_the_cpu(dtype):
    rng = np.random.RandomState(4)
    x, index = rng.randn(6, 7, 5).astype(dtype), rng.randint(-2, 9, (6, 5)).astype("float32")
    tol = 2e-3 if dtype == "float16" else 1e-5

    def compute(ctx):
        data, idx = mx.nd.array(x, ctx=ctx, dtype=dtype), mx.nd.array(index, ctx=ctx)
        data.attach_grad()
        with mx.autograd.record():
            outs = [mx.nd.softmax(data, axis=1), mx.nd.log_softmax(data), mx.nd.softmax(data, axis=0, temperature=2.0),
                    mx.nd.pick(data, idx, axis=1), mx.nd.pick(data, idx, axis=1, mode="wrap")]
            total = mx.nd.add_n(*[(o * o).sum() for o in outs])
        total.backward()
        return [o.asnumpy().astype(np.float64) for o in outs] + [data.grad.asnumpy().astype(np.float64)]

    for cpu, gpu in zip(*[compute(ctx) for ctx in (mx.cpu(), mx.gpu(0))]):
        assert_almost_equal(gpu, cpu, rtol=tol, atol=tol)


def test_dropout_draws_the_cpu_mask_on_the_gpu():
    def compute(ctx):
        mx.random.seed(11)
        x = mx.nd.ones((64, 33), ctx=ctx)
        with mx.autograd.train_mode():
            return [mx.nd.Dropout(x, p=0.3).asnumpy(), mx.nd.Dropout(x, p=0.5, axes=(0,)).asnumpy()]

    cpu, gpu = compute(mx.cpu()), compute(mx.gpu(0))
    for c, g in zip(cpu, gpu):
        np.testing.assert_array_equal(g, c)
    assert 0.2 < (cpu[0] == 0).mean() < 0.4
    assert (cpu[1] == cpu[1][:1]).all(), "axes=(0,) shares one mask row"


def _train_on_cpu_and_gpu(layers, optimizer, options, features, labels, steps):
    """The mean loss after each of `steps` Gluon steps of the network `layers()` builds, trained
    from the same seed on the CPU and on the GPU: (cpu losses, gpu losses)."""
    from oxnet import autograd, gluon

    histories = []
    for ctx in (mx.cpu(), mx.gpu(0)):
        mx.random.seed(3)
        net = gluon.nn.HybridSequential()
        net.add(*layers())
        net.initialize(mx.init.Xavier(), ctx=ctx)
        net.hybridize()
        trainer = gluon.Trainer(net.collect_params(), optimizer, options)
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        x, y = mx.nd.array(features, ctx=ctx), mx.nd.array(labels, ctx=ctx)
        losses = []
        for _ in range(steps):
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(len(features))
            losses.append(loss.mean().asscalar())
        histories.append(np.array(losses))
    return histories


def test_gluon_training_on_the_gpu_matches_the_cpu():
    from oxnet.gluon import nn

    rng = np.random.RandomState(0)
    features, labels = rng.randn(32, 8).astype(np.float32), (np.arange(32) % 4).astype(np.float32)
    cpu, gpu = _train_on_cpu_and_gpu(lambda: [nn.Dense(16, activation="relu"), nn.Dropout(0.3), nn.Dense(4)],
                                     "sgd", {"learning_rate": 0.1, "momentum": 0.9}, features, labels, steps=5)
    assert cpu[-1] < cpu[0]
    assert_almost_equal(gpu, cpu, rtol=1e-4, atol=1e-5)


def test_cnn_training_with_convolution_and_pooling_on_the_gpu_matches_the_cpu():
    from oxnet.gluon import nn

    rng = np.random.RandomState(5)
    images, labels = rng.randn(12, 3, 12, 12).astype(np.float32), (np.arange(12) % 5).astype(np.float32)

    def layers():
        return [nn.Conv2D(8, kernel_size=3, padding=1, activation="relu"), nn.MaxPool2D(pool_size=2),
                nn.Conv2D(12, kernel_size=3, strides=2, groups=4, use_bias=False), nn.AvgPool2D(pool_size=2, strides=1),
                nn.Flatten(), nn.Dense(5)]

    cpu, gpu = _train_on_cpu_and_gpu(layers, "adam", {"learning_rate": 0.01}, images, labels, steps=4)
    assert cpu[-1] < cpu[0]
    assert_almost_equal(gpu, cpu, rtol=1e-4, atol=1e-5)
