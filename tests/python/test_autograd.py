"""mx.autograd: recording scopes, variables, backward/grad, higher order, Function, and three
reference networks checked against gradients derived by hand in NumPy."""

import numpy as np
import pytest

import oxnet as mx
from oxnet import autograd
from oxnet.test_utils import assert_almost_equal


def test_scopes_and_flags():
    assert not autograd.is_recording() and not autograd.is_training()
    with autograd.record():
        assert autograd.is_recording() and autograd.is_training()
        with autograd.pause():
            assert not autograd.is_recording() and not autograd.is_training()
        with autograd.predict_mode():
            assert autograd.is_recording() and not autograd.is_training()
    with autograd.record(train_mode=False):
        assert autograd.is_recording() and not autograd.is_training()
    with autograd.train_mode():
        assert autograd.is_training() and not autograd.is_recording()
    assert autograd.set_recording(True) is False
    assert autograd.set_recording(False) is True
    assert autograd.set_training(True) is False
    assert autograd.set_training(False) is True


def test_grad_req_write_add_null(ctx):
    x = mx.nd.array([1.0, 2.0, 3.0], ctx=ctx)
    x.attach_grad()
    for _ in range(2):
        with autograd.record():
            y = (x * x).sum()
        y.backward()
    assert_almost_equal(x.grad.asnumpy(), 2 * x.asnumpy())
    z = mx.nd.array([1.0, 2.0], ctx=ctx)
    z.attach_grad(grad_req="add")
    for _ in range(3):
        with autograd.record():
            y = (z * 3).sum()
        y.backward()
    assert_almost_equal(z.grad.asnumpy(), np.array([9.0, 9.0]))
    n = mx.nd.array([1.0], ctx=ctx)
    n.attach_grad(grad_req="null")
    assert n.grad is None


def test_gradients_land_in_the_buffers_held_before_backward(ctx):
    """backward computes a 'write' gradient straight into the variable's buffer; an array held
    from before sees it, also where two variables share one gradient value, and through a
    hybridized block's cached graph."""
    a, b = mx.nd.array([1.0, 2.0, 3.0], ctx=ctx), mx.nd.array([4.0, -5.0, 6.0], ctx=ctx)
    a.attach_grad()
    b.attach_grad()
    held_a, held_b = a.grad, b.grad
    with autograd.record():
        y = mx.nd.relu(a * b) + a
    y.backward()
    assert_almost_equal(held_a.asnumpy(), np.array([5.0, 1.0, 7.0]))
    assert_almost_equal(held_b.asnumpy(), np.array([1.0, 0.0, 3.0]))
    with autograd.record():
        y = a + b  # both gradients are the head gradient itself
    y.backward(mx.nd.array([2.0, 3.0, 4.0], ctx=ctx))
    assert_almost_equal(held_a.asnumpy(), np.array([2.0, 3.0, 4.0]))
    assert_almost_equal(held_b.asnumpy(), np.array([2.0, 3.0, 4.0]))

    net = mx.gluon.nn.Dense(2, in_units=3)
    net.initialize(ctx=ctx)
    net.hybridize()
    held_w = net.weight.grad(ctx)
    x = mx.nd.array([[1.0, 2.0, 3.0]], ctx=ctx)
    with autograd.record():
        out = net(x)
    out.backward(mx.nd.array([[1.0, -1.0]], ctx=ctx))
    assert_almost_equal(held_w.asnumpy(), np.array([[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0]]))


def test_multiple_uses_aggregate_and_head_grads(ctx):
    x = mx.nd.array([[0.5, -1.0], [2.0, 0.25]], ctx=ctx)
    x.attach_grad()
    with autograd.record():
        y = x * x + mx.nd.exp(x) * x + x
    head = mx.nd.array([[1.0, 2.0], [0.5, -1.0]], ctx=ctx)
    y.backward(head)
    xn = x.asnumpy()
    expected = (2 * xn + np.exp(xn) * xn + np.exp(xn) + 1) * head.asnumpy()
    assert_almost_equal(x.grad.asnumpy(), expected, rtol=1e-5)


@pytest.mark.parametrize("uses", [2, 7, 8, 50])
def test_a_gradient_reaching_a_variable_many_times_unchanged_sums_to_the_count(uses, ctx):
    # Every addition passes the head gradient on unchanged: b receives that one array `uses`
    # times, x1 once from each chain step and once from the product.
    head = mx.nd.array([[1.0, 2.0], [0.5, -1.0]], ctx=ctx)
    a = mx.nd.array([[0.5, -1.0], [2.0, 0.25]], ctx=ctx)
    b = mx.nd.array([[3.0, 0.5], [-2.0, 1.5]], ctx=ctx)
    for variable in (a, b):
        variable.attach_grad()
    with autograd.record():
        y = a * b
        for _ in range(uses):
            y = y + b
    y.backward(head)
    an, bn, hn = a.asnumpy(), b.asnumpy(), head.asnumpy()
    assert_almost_equal(b.grad.asnumpy(), (an + uses) * hn, rtol=1e-6)
    assert_almost_equal(a.grad.asnumpy(), bn * hn, rtol=1e-6)


def test_errors_for_unrecorded_and_freed_graphs(ctx):
    x = mx.nd.ones((2,), ctx=ctx)
    x.attach_grad()
    y = x * 2
    with pytest.raises(mx.MXNetError, match="not in a computational graph"):
        y.backward()
    with autograd.record():
        y = x * 2
    y.backward()
    with pytest.raises(mx.MXNetError, match="retain_graph=True"):
        y.backward()
    with autograd.record():
        y = x * 2
    y.backward(retain_graph=True)
    y.backward()
    assert_almost_equal(x.grad.asnumpy(), np.array([2.0, 2.0]))
    with autograd.record():
        y = x * 2
    with pytest.raises(mx.MXNetError, match="head gradient"):
        y.backward(mx.nd.ones((1,), ctx=ctx))


def test_head_gradient_with_extra_leading_rows_uses_the_leading_rows(ctx):
    """As MXNet, where a head's producer reads the part of the head gradient it expects: extra rows
    along axis 0 (several heads' gradients concatenated) are accepted, the leading ones used."""
    x = mx.nd.array(np.arange(6.0).reshape(3, 2), ctx=ctx)
    x.attach_grad()
    head_grad = np.arange(1.0, 9.0).reshape(4, 2)
    with autograd.record():
        y = mx.nd.concat(x * 2, dim=0)
    y.backward(mx.nd.array(head_grad, ctx=ctx))
    assert_almost_equal(x.grad.asnumpy(), 2 * head_grad[:3])
    for shape in [(2, 2), (3, 3), (4, 3), (8,), (1, 3, 2)]:
        with autograd.record():
            y = x * 2
        with pytest.raises(mx.MXNetError, match=r"head gradient of shape .* for a head of shape \(3, 2\)"):
            y.backward(mx.nd.ones(shape, ctx=ctx))


def test_executor_backward_reads_one_head_gradient_per_output(ctx):
    """As MXNet's GraphExecutor: gradients beyond the outputs are ignored, a dict is read by output
    name, and a head gradient must match its output's shape."""
    a = mx.sym.var("a")
    out = a * 3
    grad = mx.nd.zeros((3, 2), ctx=ctx)
    exe = out.bind(ctx, {"a": mx.nd.ones((3, 2), ctx=ctx)}, args_grad={"a": grad})
    exe.forward(is_train=True)
    exe.backward([mx.nd.ones((3, 2), ctx=ctx), mx.nd.ones((5,), ctx=ctx)])
    assert_almost_equal(grad.asnumpy(), np.full((3, 2), 3.0))
    exe.backward({out.list_outputs()[0]: mx.nd.full((3, 2), 2.0, ctx=ctx)})
    assert_almost_equal(grad.asnumpy(), np.full((3, 2), 6.0))
    with pytest.raises(mx.MXNetError, match="head gradient 0 has shape"):
        exe.backward([mx.nd.ones((4, 2), ctx=ctx)])


def test_inplace_on_a_variable_while_recording_is_refused(ctx):
    x = mx.nd.ones((2,), ctx=ctx)
    x.attach_grad()
    with autograd.record():
        with pytest.raises(mx.MXNetError, match="already in a computational graph"):
            x += 1


def test_detach_and_block_grad_stop_gradients(ctx):
    x = mx.nd.array([1.0, 2.0], ctx=ctx)
    x.attach_grad()
    with autograd.record():
        y = x * x.detach() + mx.nd.BlockGrad(x) * 10
    y.backward()
    assert_almost_equal(x.grad.asnumpy(), x.asnumpy())


def test_grad_returns_gradients_without_touching_buffers(ctx):
    x = mx.nd.array([0.3, -0.7], ctx=ctx)
    x.attach_grad()
    with autograd.record():
        y = mx.nd.sin(x) * 2
    (g,) = autograd.grad(y, [x])
    assert_almost_equal(g.asnumpy(), 2 * np.cos(x.asnumpy()), rtol=1e-6)
    assert (x.grad.asnumpy() == 0).all()


def test_grad_with_respect_to_an_unreachable_variable_raises(ctx):
    """As MXNet: a variable the heads do not depend on is an error, not a silent zero; one that
    is reached only through stop_gradient gets zeros."""
    x, z, w = (mx.nd.array([0.3, -0.7], ctx=ctx) for _ in range(3))
    for a in (x, z, w):
        a.attach_grad()
    with autograd.record():
        y = x * 2 + mx.nd.stop_gradient(w)
    with pytest.raises(mx.MXNetError, match="2-th variable because it is unreachable"):
        autograd.grad(y, [x, z], retain_graph=True)
    gx, gw = autograd.grad(y, [x, w])
    assert_almost_equal(gx.asnumpy(), np.full(2, 2.0))
    assert (gw.asnumpy() == 0).all()


@pytest.mark.parametrize("name", ["tanh", "sigmoid", "log", "mul"])
def test_second_order_gradients_match_analytic(name, ctx):
    xn = np.array([0.4, 1.3, 2.1])
    x = mx.nd.array(xn, ctx=ctx, dtype="float64")
    x.attach_grad()
    fn = {"tanh": mx.nd.tanh, "sigmoid": mx.nd.sigmoid, "log": mx.nd.log, "mul": lambda v: v * v * v}[name]
    with autograd.record():
        y = fn(x)
        (dy,) = autograd.grad(y, [x], create_graph=True)
    dy.backward()
    t, s = np.tanh(xn), 1 / (1 + np.exp(-xn))
    first, second = {
        "tanh": (1 - t ** 2, -2 * t * (1 - t ** 2)),
        "sigmoid": (s * (1 - s), s * (1 - s) * (1 - 2 * s)),
        "log": (1 / xn, -1 / xn ** 2),
        "mul": (3 * xn ** 2, 6 * xn),
    }[name]
    assert_almost_equal(dy.asnumpy(), first, rtol=1e-10)
    assert_almost_equal(x.grad.asnumpy(), second, rtol=1e-10)


def test_mark_variables(ctx):
    x = mx.nd.array([1.0, 2.0], ctx=ctx)
    gx = mx.nd.zeros((2,), ctx=ctx)
    autograd.mark_variables([x], [gx])
    with autograd.record():
        y = (x ** 3).sum()
    y.backward()
    assert_almost_equal(gx.asnumpy(), 3 * x.asnumpy() ** 2)


def test_custom_function(ctx):
    class Sigmoid(autograd.Function):
        def forward(self, x):
            y = 1 / (1 + mx.nd.exp(-x))
            self.save_for_backward(y)
            return y

        def backward(self, dy):
            (y,) = self.saved_tensors
            return dy * y * (1 - y)

    xn = np.array([-1.0, 0.0, 2.0])
    x = mx.nd.array(xn, ctx=ctx)
    x.attach_grad()
    with autograd.record():
        z = Sigmoid()(x) * 3
    z.backward()
    s = 1 / (1 + np.exp(-xn))
    assert_almost_equal(x.grad.asnumpy(), 3 * s * (1 - s), rtol=1e-5)
    f = Sigmoid()
    f(x)
    with pytest.raises(RuntimeError, match="only be called once"):
        f(x)


def test_recorded_graph_as_dot(ctx):
    x = mx.nd.ones((2,), ctx=ctx)
    x.attach_grad()
    with autograd.record():
        y = mx.nd.tanh(x * 2) + x
    dot = autograd.to_dot(y)
    assert dot.startswith("digraph") and "tanh" in dot and "_mul_scalar" in dot and "->" in dot


def test_training_flag_reaches_kernels(ctx):
    x = mx.nd.ones((2,), ctx=ctx)
    with autograd.record():
        assert autograd.is_training()
    with autograd.record(train_mode=False):
        assert not autograd.is_training()


# ---- three reference networks, gradients derived by hand ---------------------------------------

def _log_softmax(z):
    return z - mx.nd.log(mx.nd.sum(mx.nd.exp(z), axis=1, keepdims=True))


def test_softmax_regression_matches_hand_derivation(ctx):
    rng = np.random.RandomState(0)
    xn, wn, bn = rng.randn(5, 4), rng.randn(4, 3) * 0.5, rng.randn(3) * 0.1
    labels = np.array([0, 2, 1, 1, 0])
    onehot = np.eye(3)[labels]
    x = mx.nd.array(xn, ctx=ctx, dtype="float64")
    w, b = mx.nd.array(wn, ctx=ctx, dtype="float64"), mx.nd.array(bn, ctx=ctx, dtype="float64")
    w.attach_grad()
    b.attach_grad()
    with autograd.record():
        z = mx.nd.broadcast_add(mx.nd.dot(x, w), b)
        loss = -(mx.nd.array(onehot, ctx=ctx, dtype="float64") * _log_softmax(z)).sum() / 5
    loss.backward()
    zn = xn @ wn + bn
    p = np.exp(zn - zn.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dz = (p - onehot) / 5
    assert_almost_equal(loss.asnumpy(), np.array([-(onehot * np.log(p)).sum() / 5]), rtol=1e-10)
    assert_almost_equal(w.grad.asnumpy(), xn.T @ dz, rtol=1e-5, atol=1e-10)
    assert_almost_equal(b.grad.asnumpy(), dz.sum(0), rtol=1e-5, atol=1e-10)


def test_tanh_mlp_matches_hand_derivation(ctx):
    rng = np.random.RandomState(1)
    xn, yn = rng.randn(6, 3), rng.randn(6, 2)
    w1n, b1n, w2n, b2n = rng.randn(3, 5) * 0.5, rng.randn(5) * 0.1, rng.randn(5, 2) * 0.5, rng.randn(2) * 0.1
    params = [mx.nd.array(p, ctx=ctx, dtype="float64") for p in (w1n, b1n, w2n, b2n)]
    for p in params:
        p.attach_grad()
    w1, b1, w2, b2 = params
    x, y = mx.nd.array(xn, ctx=ctx, dtype="float64"), mx.nd.array(yn, ctx=ctx, dtype="float64")
    with autograd.record():
        h = mx.nd.tanh(mx.nd.broadcast_add(mx.nd.dot(x, w1), b1))
        out = mx.nd.broadcast_add(mx.nd.dot(h, w2), b2)
        loss = ((out - y) ** 2).sum() * 0.5
    loss.backward()
    hn = np.tanh(xn @ w1n + b1n)
    dout = hn @ w2n + b2n - yn
    dh = dout @ w2n.T * (1 - hn ** 2)
    for got, want in zip(params, (xn.T @ dh, dh.sum(0), hn.T @ dout, dout.sum(0))):
        assert_almost_equal(got.grad.asnumpy(), want, rtol=1e-5, atol=1e-10)


def test_rnn_unrolled_with_concat_matches_hand_derivation(ctx):
    rng = np.random.RandomState(2)
    steps, batch, nin, nh = 3, 2, 3, 4
    xs = [rng.randn(batch, nin) for _ in range(steps)]
    wn, bn, vn = rng.randn(nin + nh, nh) * 0.4, rng.randn(nh) * 0.1, rng.randn(nh, 1)
    w, b, v = (mx.nd.array(p, ctx=ctx, dtype="float64") for p in (wn, bn, vn))
    for p in (w, b, v):
        p.attach_grad()
    with autograd.record():
        h = mx.nd.zeros((batch, nh), ctx=ctx, dtype="float64")
        for t in range(steps):
            xh = mx.nd.concat(mx.nd.array(xs[t], ctx=ctx, dtype="float64"), h, dim=1)
            h = mx.nd.tanh(mx.nd.broadcast_add(mx.nd.dot(xh, w), b))
        loss = mx.nd.dot(h, v).sum()
    loss.backward()
    # Forward and backpropagation through time by hand.
    hs, xhs = [np.zeros((batch, nh))], []
    for t in range(steps):
        xhs.append(np.concatenate([xs[t], hs[-1]], axis=1))
        hs.append(np.tanh(xhs[-1] @ wn + bn))
    dv = hs[-1].T @ np.ones((batch, 1))
    dh = np.ones((batch, 1)) @ vn.T
    dw, db = np.zeros_like(wn), np.zeros_like(bn)
    for t in reversed(range(steps)):
        da = dh * (1 - hs[t + 1] ** 2)
        dw += xhs[t].T @ da
        db += da.sum(0)
        dh = (da @ wn.T)[:, nin:]
    assert_almost_equal(w.grad.asnumpy(), dw, rtol=1e-5, atol=1e-10)
    assert_almost_equal(b.grad.asnumpy(), db, rtol=1e-5, atol=1e-10)
    assert_almost_equal(v.grad.asnumpy(), dv, rtol=1e-5, atol=1e-10)


def test_deep_chain_backward_and_release_do_not_recurse(ctx):
    x = mx.nd.ones((1,), ctx=ctx)
    x.attach_grad()
    with autograd.record():
        y = x
        for _ in range(100000):
            y = y * 1.0
    y.backward()
    del y
    assert_almost_equal(x.grad.asnumpy(), np.array([1.0]))


def test_get_symbol_returns_the_recorded_graph():
    x = mx.nd.array([[1.0, 2.0], [3.0, 4.0]])
    w = mx.nd.array([[0.5, -1.0], [2.0, 0.25]])
    x.attach_grad()
    with mx.autograd.record():
        y = mx.nd.tanh(mx.nd.dot(x, w) + 1)
    sym = mx.autograd.get_symbol(y)
    assert sym.list_arguments() == ["var0", "var1"]
    ops = [n["op"] for n in __import__("json").loads(sym.tojson())["nodes"] if n["op"] != "null"]
    assert ops == ["dot", "_plus_scalar", "tanh"]
    out = sym.eval(var0=x, var1=w)[0]
    np.testing.assert_allclose(out.asnumpy(), y.asnumpy(), rtol=1e-6)
    with pytest.raises(mx.MXNetError, match="not recorded"):
        mx.autograd.get_symbol(mx.nd.ones((1,)))


def _recorded_step(x, w, scalar):
    with autograd.record():
        y = (mx.nd.dot(x, w) * scalar).tanh().sum(axis=1)
    return y


def test_repeated_recordings_reuse_a_compiled_gradient_only_when_it_applies(ctx):
    # A loop records the same graph every step; what it computes must be what an uncached
    # gradient (autograd.grad, built afresh) computes, whatever changed between steps: values,
    # an attribute, a shape, the gradient request, a given head gradient.
    rng = np.random.RandomState(0)
    w = mx.nd.array(rng.rand(4, 3), ctx=ctx)
    w.attach_grad()
    cases = [((5, 4), 2.0, None), ((5, 4), 2.0, None), ((5, 4), 3.0, None), ((7, 4), 3.0, None),
             ((7, 4), 3.0, rng.rand(7)), ((7, 4), 3.0, None)]
    for shape, scalar, head in cases:
        x = mx.nd.array(rng.rand(*shape), ctx=ctx)
        head_grad = None if head is None else mx.nd.array(head, ctx=ctx)
        expected = autograd.grad(_recorded_step(x, w, scalar), [w], head_grads=head_grad)[0].asnumpy()
        _recorded_step(x, w, scalar).backward(head_grad)
        assert_almost_equal(w.grad.asnumpy(), expected, rtol=1e-5, atol=1e-6)
    # grad_req 'add' accumulates through the reused gradient too.
    w.attach_grad(grad_req="add")
    x = mx.nd.array(rng.rand(5, 4), ctx=ctx)
    once = autograd.grad(_recorded_step(x, w, 2.0), [w])[0].asnumpy()
    for _ in range(3):
        _recorded_step(x, w, 2.0).backward()
    assert_almost_equal(w.grad.asnumpy(), 3 * once, rtol=1e-5, atol=1e-6)


def test_function_gradients_are_never_reused(ctx):
    # Each call's backward reads what that call's forward stored on its own instance.
    class Scale(autograd.Function):
        def forward(self, x, factor):
            self.factor = float(factor.asscalar())
            return x * self.factor

        def backward(self, dy):
            return dy * self.factor, mx.nd.zeros((1,), ctx=ctx)

    x = mx.nd.ones((3,), ctx=ctx)
    x.attach_grad()
    for factor in (2.0, 5.0, -1.0):
        with autograd.record():
            y = Scale()(x, mx.nd.array([factor], ctx=ctx))
        y.backward()
        assert x.grad.asnumpy().tolist() == [factor] * 3


def test_hybridized_training_steps_match_imperative_ones_across_shapes(ctx):
    # A hybridized block's gradient finds its own call's saved values whichever call of the
    # compiled run it serves; two calls recorded together each get their own.
    def build(hybridize):
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(6, activation="tanh", in_units=4), mx.gluon.nn.Dense(1, in_units=6))
        net.initialize(mx.init.Xavier(), ctx=ctx)
        if hybridize:
            net.hybridize()
        return net

    imperative, hybrid = build(False), build(True)
    for p, q in zip(imperative.collect_params().values(), hybrid.collect_params().values()):
        q.set_data(p.data())
    rng = np.random.RandomState(1)
    for rows in (3, 3, 5, 3, 5):
        a, b = (mx.nd.array(rng.rand(rows, 4), ctx=ctx) for _ in range(2))
        for net in (imperative, hybrid):
            with autograd.record():
                loss = (net(a) * net(b)).sum() + (net(a) ** 2).mean()
            loss.backward()
        for p, q in zip(imperative.collect_params().values(), hybrid.collect_params().values()):
            assert_almost_equal(q.grad().asnumpy(), p.grad().asnumpy(), rtol=1e-4, atol=1e-6)
