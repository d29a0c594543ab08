"""Control flow: mx.nd/sym.contrib.foreach, while_loop and cond (imperative, symbolic, hybridized)."""

import numpy as np
import pytest

import oxnet as mx
from oxnet import autograd, gluon
from oxnet.test_utils import assert_almost_equal


def _rnn_step(x, states, w, u):
    h = mx.sym.tanh(mx.sym.dot(x, w) + mx.sym.dot(states[0], u)) if isinstance(x, mx.sym.Symbol) \
        else mx.nd.tanh(mx.nd.dot(x, w) + mx.nd.dot(states[0], u))
    return h, [h]


def _rnn_arrays(seq_len=4, batch=3, width=5, hidden=6):
    rng = np.random.RandomState(0)
    return {"data": mx.nd.array(rng.uniform(-1, 1, (seq_len, batch, width))),
            "h0": mx.nd.array(rng.uniform(-1, 1, (batch, hidden))),
            "w": mx.nd.array(rng.uniform(-1, 1, (width, hidden))),
            "u": mx.nd.array(rng.uniform(-1, 1, (hidden, hidden)))}


def _unrolled(arrays):
    """Outputs (stacked hidden states, last state) and gradients of an explicit Python loop."""
    copies = {k: v.copy() for k, v in arrays.items()}
    for v in copies.values():
        v.attach_grad()
    with autograd.record():
        h, outs = copies["h0"], []
        for t in range(copies["data"].shape[0]):
            h, _ = _rnn_step(copies["data"][t], [h], copies["w"], copies["u"])
            outs.append(h)
        loss = (mx.nd.stack(*outs) * 2).sum() + (h * 3).sum()
    loss.backward()
    return mx.nd.stack(*outs).asnumpy(), h.asnumpy(), {k: v.grad.asnumpy() for k, v in copies.items()}


def test_imperative_foreach_matches_the_unrolled_loop_with_gradients():
    arrays = _rnn_arrays()
    expected_out, expected_h, expected_grads = _unrolled(arrays)
    copies = {k: v.copy() for k, v in arrays.items()}
    for v in copies.values():
        v.attach_grad()
    with autograd.record():
        out, states = mx.nd.contrib.foreach(lambda x, s: _rnn_step(x, s, copies["w"], copies["u"]),
                                            copies["data"], [copies["h0"]])
        loss = (out * 2).sum() + (states[0] * 3).sum()
    loss.backward()
    assert isinstance(states, list) and len(states) == 1
    assert_almost_equal(out.asnumpy(), expected_out, rtol=1e-5, atol=1e-6)
    assert_almost_equal(states[0].asnumpy(), expected_h, rtol=1e-5, atol=1e-6)
    for name, grad in expected_grads.items():
        assert_almost_equal(copies[name].grad.asnumpy(), grad, rtol=1e-4, atol=1e-5)


def test_symbolic_foreach_matches_the_unrolled_loop_with_gradients():
    arrays = _rnn_arrays()
    expected_out, expected_h, expected_grads = _unrolled(arrays)
    data, h0, w, u = (mx.sym.var(n) for n in ("data", "h0", "w", "u"))
    out, states = mx.sym.contrib.foreach(lambda x, s: _rnn_step(x, s, w, u), data, [h0])
    net = mx.sym.Group([out * 2, states[0] * 3])
    assert sorted(net.list_arguments()) == ["data", "h0", "u", "w"]
    grads = {k: mx.nd.zeros(v.shape) for k, v in arrays.items()}
    exe = net.bind(mx.cpu(), {k: v.copy() for k, v in arrays.items()}, args_grad=grads)
    outputs = exe.forward(is_train=True)
    exe.backward([mx.nd.ones(o.shape) for o in outputs])
    assert_almost_equal(outputs[0].asnumpy(), expected_out * 2, rtol=1e-5, atol=1e-6)
    assert_almost_equal(outputs[1].asnumpy(), expected_h * 3, rtol=1e-5, atol=1e-6)
    for name, grad in expected_grads.items():
        assert_almost_equal(grads[name].asnumpy(), grad, rtol=1e-4, atol=1e-5)


class _ForeachRNN(gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.w = self.params.get("w", shape=(5, 6))
            self.u = self.params.get("u", shape=(6, 6))

    def hybrid_forward(self, F, data, h0, w, u):
        out, states = F.contrib.foreach(lambda x, s: _rnn_step(x, s, w, u), data, [h0])
        return out, states[0]


def test_hybridized_foreach_agrees_with_the_imperative_block():
    arrays = _rnn_arrays()
    results = []
    for hybridize in (False, True):
        block = _ForeachRNN(prefix="rnn_")
        block.initialize()
        block.w.set_data(arrays["w"])
        block.u.set_data(arrays["u"])
        if hybridize:
            block.hybridize()
        data = arrays["data"].copy()
        data.attach_grad()
        with autograd.record():
            out, h = block(data, arrays["h0"])
            loss = (out * 2).sum() + (h * 3).sum()
        loss.backward()
        results.append((out.asnumpy(), h.asnumpy(), data.grad.asnumpy(), block.w.grad().asnumpy()))
    for imperative, hybrid in zip(*results):
        assert_almost_equal(imperative, hybrid, rtol=1e-4, atol=1e-5)


def test_foreach_backward_reuses_the_forward_dropout_masks():
    # The gradient of dropout(x) * 1 with respect to x is the mask the forward pass drew (scaled):
    # the loop's backward must read the forward's masks, not draw new ones.
    data = mx.sym.var("data")
    out, _ = mx.sym.contrib.foreach(lambda x, s: (mx.sym.Dropout(x, p=0.5) + s[0], s), data, [mx.sym.var("s")])
    x = mx.nd.ones((6, 50))
    grad = mx.nd.zeros((6, 50))
    exe = out.bind(mx.cpu(), {"data": x, "s": mx.nd.zeros((50,))}, args_grad={"data": grad, "s": mx.nd.zeros((50,))})
    y = exe.forward(is_train=True)[0].asnumpy()
    exe.backward(mx.nd.ones((6, 50)))
    assert 0 < (y == 0).sum() < y.size
    assert_almost_equal(grad.asnumpy(), y)


def test_while_loop_pads_outputs_to_max_iterations():
    cond = lambda i, s: i < 3
    func = lambda i, s: ([s * 2], [i + 1, s + i])
    i, s = mx.nd.array([0]), mx.nd.array([1])
    outs, (i_end, s_end) = mx.nd.contrib.while_loop(cond, func, [i, s], max_iterations=5)
    assert outs[0].shape == (5, 1)
    assert_almost_equal(outs[0].asnumpy()[:3, 0], np.array([2, 2, 4]))
    assert_almost_equal(outs[0].asnumpy()[3:], np.zeros((2, 1)))
    assert i_end.asscalar() == 3 and s_end.asscalar() == 4

    i_sym, s_sym = mx.sym.var("i"), mx.sym.var("s")
    sym_outs, sym_vars = mx.sym.contrib.while_loop(cond, func, [i_sym, s_sym], max_iterations=5)
    net = mx.sym.Group(sym_outs + sym_vars)
    assert net.infer_shape(i=(1,), s=(1,))[1] == [(5, 1), (1,), (1,)]
    exe = net.bind(mx.cpu(), {"i": mx.nd.array([0]), "s": mx.nd.array([1])})
    got = [o.asnumpy() for o in exe.forward()]
    assert_almost_equal(got[0], outs[0].asnumpy())
    assert got[1][0] == 3 and got[2][0] == 4


def test_while_loop_gradients_agree_between_imperative_and_symbolic():
    cond = lambda i, s, w: i < 4
    func = lambda i, s, w: ([s * w], [i + 1, s * w + 1, w])
    args = {"i": mx.nd.array([0]), "s": mx.nd.array([0.5, -1.0]), "w": mx.nd.array([1.5, 0.7])}
    imp = {k: v.copy() for k, v in args.items()}
    for k in ("s", "w"):
        imp[k].attach_grad()
    with autograd.record():
        outs, (_, s_end, _) = mx.nd.contrib.while_loop(cond, func, [imp["i"], imp["s"], imp["w"]], max_iterations=6)
        loss = (outs[0][:4] * 2).sum() + (s_end * 3).sum()
    loss.backward()

    syms = {k: mx.sym.var(k) for k in args}
    sym_outs, sym_vars = mx.sym.contrib.while_loop(cond, func, [syms["i"], syms["s"], syms["w"]], max_iterations=6)
    net = mx.sym.Group([sym_outs[0].slice_axis(axis=0, begin=0, end=4) * 2, sym_vars[1] * 3])
    grads = {k: mx.nd.zeros(args[k].shape) for k in ("s", "w")}
    exe = net.bind(mx.cpu(), {k: v.copy() for k, v in args.items()}, args_grad=grads, grad_req={"i": "null", "s": "write", "w": "write"})
    outputs = exe.forward(is_train=True)
    exe.backward([mx.nd.ones(o.shape) for o in outputs])
    assert_almost_equal(outputs[1].asnumpy(), s_end.asnumpy() * 3, rtol=1e-5)
    for k in ("s", "w"):
        assert_almost_equal(grads[k].asnumpy(), imp[k].grad.asnumpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("first", [0.25, 2.0])
def test_cond_takes_either_branch_with_gradients(first):
    a_value = mx.nd.array([first, 3.0])
    b_value = mx.nd.array([2.0, -1.0])
    a, b = mx.sym.var("a"), mx.sym.var("b")
    out = mx.sym.contrib.cond(a.slice_axis(axis=0, begin=0, end=1) < 1, lambda: a * b, lambda: a + b * 2)
    grads = {"a": mx.nd.zeros((2,)), "b": mx.nd.zeros((2,))}
    exe = out.bind(mx.cpu(), {"a": a_value, "b": b_value}, args_grad=grads)
    got = exe.forward(is_train=True)[0]
    exe.backward(mx.nd.ones((2,)))

    ia, ib = a_value.copy(), b_value.copy()
    ia.attach_grad()
    ib.attach_grad()
    with autograd.record():
        expected = mx.nd.contrib.cond(ia[0] < 1, lambda: ia * ib, lambda: ia + ib * 2)
    expected.backward()
    assert_almost_equal(got.asnumpy(), expected.asnumpy())
    assert_almost_equal(grads["a"].asnumpy(), ia.grad.asnumpy())
    assert_almost_equal(grads["b"].asnumpy(), ib.grad.asnumpy())
    then_taken = first < 1
    assert_almost_equal(grads["a"].asnumpy(), b_value.asnumpy() if then_taken else np.ones(2))


def test_json_round_trip_keeps_subgraphs_and_results():
    data, h0, w, u = (mx.sym.var(n) for n in ("data", "h0", "w", "u"))
    out, states = mx.sym.contrib.foreach(lambda x, s: _rnn_step(x, s, w, u), data, [h0])
    loop_out, loop_vars = mx.sym.contrib.while_loop(lambda i, x: i < 2, lambda i, x: ([x], [i + 1, x * 2]),
                                                    [mx.sym.var("i"), states[0]], max_iterations=3)
    chosen = mx.sym.contrib.cond(loop_vars[0] > 1, lambda: loop_vars[1], lambda: out.sum(axis=0))
    net = mx.sym.Group([out, loop_out[0], chosen])
    text = net.tojson()
    assert '"subgraphs"' in text and '"_foreach"' in text and '"_while_loop"' in text and '"_cond"' in text
    loaded = mx.sym.load_json(text)
    assert loaded.tojson() == text
    assert loaded.list_arguments() == net.list_arguments()
    args = dict(_rnn_arrays(), i=mx.nd.array([0]))
    first = [o.asnumpy() for o in net.bind(mx.cpu(), {k: args[k] for k in net.list_arguments()}).forward()]
    second = [o.asnumpy() for o in loaded.bind(mx.cpu(), {k: args[k] for k in net.list_arguments()}).forward()]
    for x, y in zip(first, second):
        assert_almost_equal(x, y)


def test_unused_loop_data_is_refused():
    with pytest.raises(AssertionError, match="data arrays have to be used"):
        mx.sym.contrib.foreach(lambda x, s: (s[0] * 2, s), mx.sym.var("data"), [mx.sym.var("s")])


def test_symbolic_foreach_over_1d_data_keeps_it_1d():
    """As MXNet: each step of 1-d data sees shape (1,), the data is inferred back as (len,) and the
    stacked outputs are (len, 1), for the executor and imperatively alike."""
    data, state = mx.sym.var("data"), mx.sym.var("state")
    outs, final = mx.sym.contrib.foreach(lambda x, s: (x * s[0], [s[0] * 2]), data, [state])
    arg_shapes, out_shapes, _ = mx.sym.Group([outs, final[0]]).infer_shape(state=(1,), data=(3,))
    assert arg_shapes == [(3,), (1,)] and out_shapes == [(3, 1), (1,)]
    values = {"data": mx.nd.array([1.0, 2.0, 3.0]), "state": mx.nd.array([0.5])}
    exe = mx.sym.Group([outs, final[0]]).bind(mx.cpu(), values)
    exe.forward()
    assert_almost_equal(exe.outputs[0].asnumpy(), np.array([[0.5], [2.0], [6.0]]))
    imp_outs, imp_final = mx.nd.contrib.foreach(lambda x, s: (x * s[0], [s[0] * 2]), values["data"], [values["state"]])
    assert_almost_equal(imp_outs.asnumpy(), exe.outputs[0].asnumpy())
    assert_almost_equal(imp_final[0].asnumpy(), np.array([4.0]))


def _lstm_step(x, h, c, weights, hidden, recurrent_mask=None):
    """One LSTM step as Keras-MXNet wrote it: two FullyConnected, split into i, f, g, o; with a
    recurrent dropout mask (drawn once per batch) applied to the previous state."""
    i2h_weight, i2h_bias, h2h_weight, h2h_bias = weights
    previous = h if recurrent_mask is None else h * recurrent_mask
    gates = mx.sym.FullyConnected(x, i2h_weight, i2h_bias, num_hidden=4 * hidden) + \
        mx.sym.FullyConnected(previous, h2h_weight, h2h_bias, num_hidden=4 * hidden)
    i, f, g, o = mx.sym.split(gates, num_outputs=4, axis=1)
    c = mx.sym.sigmoid(f) * c + mx.sym.sigmoid(i) * mx.sym.tanh(g)
    return mx.sym.sigmoid(o) * mx.sym.tanh(c), c


_LSTM_INPUTS = ("data", "h0", "c0", "i2h_weight", "i2h_bias", "h2h_weight", "h2h_bias", "mask")


def _lstm_graph(kind, hidden, steps, dropout):
    data, h0, c0, *weights, mask = [mx.sym.var(n) for n in _LSTM_INPUTS]
    mask = mask if dropout else None
    if kind == "foreach":
        def step(x, states):
            h, c = _lstm_step(x, states[0], states[1], weights, hidden, mask)
            return h, [h, c]
        outs, (h, c) = mx.sym.contrib.foreach(step, data, [h0, c0])
    elif kind == "unrolled":
        h, c, per_step = h0, c0, []
        for x in mx.sym.split(data, num_outputs=steps, axis=0, squeeze_axis=True):
            h, c = _lstm_step(x, h, c, weights, hidden, mask)
            per_step.append(h)
        outs = mx.sym.stack(*per_step, axis=0)
    else:
        i2h_weight, i2h_bias, h2h_weight, h2h_bias = weights
        params = mx.sym.concat(*[mx.sym.reshape(p, shape=(-1,)) for p in (i2h_weight, h2h_weight, i2h_bias, h2h_bias)],
                               dim=0)
        fused = mx.sym.RNN(data, params, mx.sym.expand_dims(h0, 0), mx.sym.expand_dims(c0, 0), mode="lstm",
                           state_size=hidden, num_layers=1, state_outputs=True)
        outs, h, c = fused[0], mx.sym.reshape(fused[1], shape=(-3, -2)), mx.sym.reshape(fused[2], shape=(-3, -2))
    return mx.sym.Group([outs, h, c])


def _run_lstm(kind, steps, dropout, batch=4, width=3, hidden=5):
    rng = np.random.RandomState(steps)
    shapes = {"data": (steps, batch, width), "h0": (batch, hidden), "c0": (batch, hidden),
              "i2h_weight": (4 * hidden, width), "i2h_bias": (4 * hidden,), "h2h_weight": (4 * hidden, hidden),
              "h2h_bias": (4 * hidden,), "mask": (batch, hidden)}
    args = {name: mx.nd.array(rng.uniform(-0.5, 0.5, shape)) for name, shape in shapes.items()}
    # Recurrent dropout: a mask of 0 and 1/(1-p), the same for every step.
    args["mask"] = mx.nd.array((rng.uniform(size=shapes["mask"]) > 0.3) / 0.7)
    sym = _lstm_graph(kind, hidden, steps, dropout)
    args = {name: args[name] for name in sym.list_arguments()}
    grads = {name: mx.nd.zeros(a.shape) for name, a in args.items() if name != "mask"}
    exe = sym.bind(mx.cpu(), args, args_grad=grads)
    exe.forward(is_train=True)
    heads = [mx.nd.array(rng.uniform(-1, 1, o.shape)) for o in exe.outputs]
    exe.backward(heads)
    return [o.asnumpy() for o in exe.outputs], {k: g.asnumpy() for k, g in grads.items()}, exe.planned_bytes


@pytest.mark.parametrize("dropout", [False, True])
def test_keras_style_foreach_lstm_matches_the_unrolled_cells_and_the_fused_op(dropout):
    """Keras-MXNet's RNN with unroll=False (an LSTM step in foreach) gives the outputs, final
    states and gradients of the unrolled graph and of the fused RNN operator (which has no
    recurrent dropout, so it is compared without), and plans less memory than the unrolled graph."""
    results = {kind: _run_lstm(kind, 12, dropout) for kind in ("foreach", "unrolled", "fused")[:3 - dropout]}
    reference_outs, reference_grads, _ = results["unrolled"]
    for kind, (outs, grads, _) in results.items():
        for got, want in zip(outs, reference_outs):
            assert_almost_equal(got, want, rtol=1e-5, atol=1e-6)
        for name, want in reference_grads.items():
            assert_almost_equal(grads[name], want, rtol=1e-4, atol=1e-5)
    # Per step, foreach keeps only what the step's gradient reads; the unrolled graph plans
    # every step's intermediates (its weight gradients are summed as each step makes them, so
    # those no longer pile up: 0.71x measured, 0.5x before).
    sizes = dict(batch=8, width=8, hidden=32)
    foreach_bytes, unrolled_bytes = (_run_lstm(kind, 100, dropout, **sizes)[2] for kind in ("foreach", "unrolled"))
    assert foreach_bytes < 0.8 * unrolled_bytes
