"""A hybridized block runs a compiled graph with the executor's static memory plan: planned
memory, static_alloc, mirroring, and gradients that stay right when the plan reuses memory."""
import gc

import numpy as np
import pytest

import oxnet as mx
from oxnet import autograd, gluon


class Swish(gluon.HybridBlock):
    def hybrid_forward(self, F, x):
        return x * F.sigmoid(x)


def _mlp(layers, hidden, activation="relu", prefix="mlp_"):
    net = gluon.nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        for _ in range(layers):
            if activation == "swish":
                net.add(gluon.nn.Dense(hidden), Swish())
            else:
                net.add(gluon.nn.Dense(hidden, activation=activation))
        net.add(gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    return net


def _grads(net):
    return {name: p.grad().asnumpy().copy() for name, p in net.collect_params().items()}


def _train_step(net, x, retain_graph=False):
    with autograd.record():
        loss = net(x).sum()
    loss.backward(retain_graph=retain_graph)
    return loss


def test_hybridized_deep_mlp_plans_the_executors_memory():
    """Forward and backward of a hybridized deep MLP are planned as one run, as a bound
    executor plans them: the plan plus the output (a fresh array for the caller) is the
    executor's plan, whose output lives in a planned block."""
    batch, hidden = 64, 256
    net = _mlp(8, hidden)
    x = mx.nd.random.uniform(shape=(batch, 128))
    net(x)
    net.hybridize()
    _train_step(net, x)
    gluon_bytes = net.planned_memory()

    sym = net(mx.sym.var("data"))
    reqs = {name: "write" for name in sym.list_arguments()}
    reqs["data"] = "null"
    exe = sym.simple_bind(mx.cpu(), grad_req=reqs, data=x.shape)
    output_bytes = batch * 10 * 4
    assert gluon_bytes > 0
    assert gluon_bytes + output_bytes == exe.planned_bytes, (gluon_bytes, exe.planned_bytes)
    # Far below keeping every layer's values apart: blocks are shared across layers.
    assert gluon_bytes < 8 * 3 * batch * hidden * 4


@pytest.mark.parametrize("static_alloc", [False, True])
def test_planned_gradients_equal_imperative_ones(static_alloc):
    x = mx.nd.random.uniform(-1, 1, shape=(16, 32))
    reference = _mlp(4, 48, prefix="ref_")
    reference(x)
    _train_step(reference, x)
    expected = _grads(reference)
    expected_out = reference(x).asnumpy()

    net = _mlp(4, 48, prefix="ref_")
    net(x)
    for name, p in net.collect_params().items():
        p.set_data(reference.collect_params()[name].data())
    net.hybridize(static_alloc=static_alloc)
    for _ in range(3):  # the kept (or re-made) blocks give the same answer every call
        _train_step(net, x)
        for name, g in _grads(net).items():
            np.testing.assert_allclose(g, expected[name], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(net(x).asnumpy(), expected_out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("static_alloc", [False, True])
def test_retained_graph_differentiates_twice(static_alloc):
    """A backward that keeps the graph must not overwrite the saved forward values."""
    x = mx.nd.random.uniform(-1, 1, shape=(8, 20))
    net = _mlp(3, 30, activation="tanh")
    net(x)
    net.hybridize(static_alloc=static_alloc)
    with autograd.record():
        loss = net(x).sum()
    loss.backward(retain_graph=True)
    first = _grads(net)
    loss.backward()
    for name, g in _grads(net).items():
        np.testing.assert_allclose(g, first[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("static_alloc", [False, True])
def test_two_calls_in_one_recording_keep_their_own_values(static_alloc):
    """A block called twice before backward (a siamese network, an unrolled cell): each call's
    saved values live in storage of its own, even with static_alloc."""
    a = mx.nd.random.uniform(-1, 1, shape=(8, 20))
    b = mx.nd.random.uniform(-1, 1, shape=(8, 20))

    def grads(hybridize):
        net = _mlp(2, 24, activation="tanh", prefix="siam_")
        net.initialize(mx.init.Constant(0.05), force_reinit=True)
        net(a)
        if hybridize:
            net.hybridize(static_alloc=static_alloc)
        with autograd.record():
            loss = (net(a) * net(b)).sum()
        loss.backward()
        return _grads(net)

    expected = grads(False)
    for name, g in grads(True).items():
        np.testing.assert_allclose(g, expected[name], rtol=1e-5, atol=1e-6)


def test_mirroring_from_gluon_recomputes_activations():
    x = mx.nd.random.uniform(-1, 1, shape=(32, 64))

    def run(mirror):
        net = _mlp(4, 64, activation="swish", prefix="sw_")
        net.initialize(mx.init.Uniform(0.3), force_reinit=True)
        mx.random.seed(1)
        net(x)
        net.hybridize(mirror=mirror)
        _train_step(net, x)
        return net.planned_memory(), _grads(net)

    kept_bytes, kept = run(False)
    mirrored_bytes, mirrored = run(True)
    block = 32 * 64 * 4
    assert kept_bytes - mirrored_bytes >= 2 * block, (kept_bytes, mirrored_bytes)
    for name in kept:
        np.testing.assert_allclose(mirrored[name], kept[name], rtol=1e-5, atol=1e-6)


def test_inference_plan_reuses_blocks_across_layers():
    """Not recorded, only the intermediates are planned and a deep net needs about two of them."""
    batch, hidden = 32, 128
    net = _mlp(6, hidden)
    x = mx.nd.random.uniform(shape=(batch, hidden))
    expected = net(x).asnumpy()
    net.hybridize(static_alloc=True)
    for _ in range(2):
        np.testing.assert_allclose(net(x).asnumpy(), expected, rtol=1e-5, atol=1e-6)
    assert 0 < net.planned_memory() <= 2 * batch * hidden * 4


def test_a_dropped_static_alloc_block_leaves_no_memory_behind():
    # autograd keeps the compiled gradients of repeated recordings; those of a block that can
    # no longer be called must not keep its static_alloc buffers alive.
    def live():
        mx.nd.waitall()
        gc.collect()
        return mx._core.cpu_pool_stats()[5]

    x = mx.nd.ones((64, 512))
    before = live()
    for _ in range(3):
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(2048, activation="relu", in_units=512), gluon.nn.Dense(10, in_units=2048))
        net.initialize()
        net.hybridize(static_alloc=True)
        for _ in range(2):
            with autograd.record():
                loss = net(x).sum()
            loss.backward()
        del net, loss
    assert live() == before
