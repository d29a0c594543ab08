"""The fused RNN operator (every mode, stacked, bidirectional, state outputs, clipping, dropout)
and SequenceLast/Mask/Reverse: NumPy references, numeric gradients, MXNet 1.9.1 outputs."""

import pathlib

import numpy as np
import pytest

import oxnet as mx
from oxnet import autograd, nd
from oxnet.test_utils import assert_almost_equal
from gradcheck import check_gradient

EXTRA = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "extra"
GATES = {"rnn_relu": 1, "rnn_tanh": 1, "gru": 3, "lstm": 4}


def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


def _rnn_reference(x, params, h0, c0, mode, hidden, layers, dirs, clip=None):
    """Step-by-step NumPy RNN with MXNet's flat parameter layout (weights, then biases)."""
    steps, batch, _ = x.shape
    g = GATES[mode] * hidden
    widths = [x.shape[2] if l == 0 else dirs * hidden for l in range(layers)]
    offset, weights = 0, []
    for l in range(layers):
        for _ in range(dirs):
            w_ih = params[offset:offset + g * widths[l]].reshape(g, widths[l])
            offset += g * widths[l]
            w_hh = params[offset:offset + g * hidden].reshape(g, hidden)
            offset += g * hidden
            weights.append([w_ih, w_hh])
    for k in range(layers * dirs):
        weights[k] += [params[offset:offset + g], params[offset + g:offset + 2 * g]]
        offset += 2 * g
    hy, cy, layer_in = [], [], x
    for l in range(layers):
        outs = []
        for d in range(dirs):
            w_ih, w_hh, b_ih, b_hh = weights[l * dirs + d]
            h, c = h0[l * dirs + d].copy(), c0[l * dirs + d].copy() if c0 is not None else None
            seq = np.zeros((steps, batch, hidden))
            for t in (range(steps - 1, -1, -1) if d else range(steps)):
                xp, hp = layer_in[t] @ w_ih.T + b_ih, h @ w_hh.T + b_hh
                if mode == "lstm":
                    pre = xp + hp
                    i, f, o = (_sigmoid(pre[:, k * hidden:(k + 1) * hidden]) for k in (0, 1, 3))
                    c = f * c + i * np.tanh(pre[:, 2 * hidden:3 * hidden])
                    if clip:
                        c = np.clip(c, *clip)
                    h = o * np.tanh(c)
                elif mode == "gru":
                    r = _sigmoid(xp[:, :hidden] + hp[:, :hidden])
                    z = _sigmoid(xp[:, hidden:2 * hidden] + hp[:, hidden:2 * hidden])
                    n = np.tanh(xp[:, 2 * hidden:] + r * hp[:, 2 * hidden:])
                    h = (1 - z) * n + z * h
                else:
                    h = np.maximum(xp + hp, 0) if mode == "rnn_relu" else np.tanh(xp + hp)
                seq[t] = h
            outs.append(seq)
            hy.append(h)
            cy.append(c)
        layer_in = np.concatenate(outs, axis=2)
    return layer_in, np.stack(hy), (np.stack(cy) if c0 is not None else None)


def _param_count(mode, inputs, hidden, layers, dirs):
    g = GATES[mode] * hidden
    return sum(dirs * g * ((inputs if l == 0 else dirs * hidden) + hidden + 2) for l in range(layers))


CASES = [
    # (mode, layers, bidirectional)
    ("lstm", 1, False), ("lstm", 2, True), ("gru", 2, False), ("gru", 1, True),
    ("rnn_tanh", 2, True), ("rnn_relu", 1, False),
]


@pytest.mark.parametrize("mode, layers, bidirectional", CASES)
def test_rnn_matches_numpy_and_numeric_gradients(mode, layers, bidirectional, ctx):
    # Batch 9: the recurrence runs on several batch ranges concurrently (unequal ranges).
    steps, batch, inputs, hidden = 4, 9, 3, 5
    dirs = 2 if bidirectional else 1
    rng = np.random.RandomState(len(mode) + layers)
    x = rng.randn(steps, batch, inputs)
    params = rng.uniform(-0.6, 0.6, _param_count(mode, inputs, hidden, layers, dirs))
    h0 = rng.randn(layers * dirs, batch, hidden) * 0.5
    c0 = rng.randn(layers * dirs, batch, hidden) * 0.5 if mode == "lstm" else None
    kw = dict(mode=mode, state_size=hidden, num_layers=layers, bidirectional=bidirectional, state_outputs=True)
    arrays = [x, params, h0] + ([c0] if c0 is not None else [])
    outs = nd.RNN(*[nd.array(a, ctx=ctx) for a in arrays], **kw)
    expected = _rnn_reference(x, params, h0, c0, mode, hidden, layers, dirs)
    assert len(outs) == (3 if mode == "lstm" else 2)
    for got, want in zip(outs, expected):
        assert_almost_equal(got.asnumpy(), want, rtol=1e-4, atol=1e-5)
    # Every output's gradient (sequence and final states) reaches every input.
    shapes = [a.shape for a in arrays]
    check_gradient(lambda *a: nd.RNN(*a, **kw), shapes, ctx, domain=(-0.6, 0.6), dtypes=["float64", "float32"])


def test_rnn_matches_mxnet_in_every_mode():
    ref = nd.load(str(EXTRA / "rnn-ops.params"))
    for mode in GATES:
        inputs = [ref["%s_in%d" % (mode, i)].copy() for i in range(4 if mode == "lstm" else 3)]
        for a in inputs:
            a.attach_grad()
        with autograd.record():
            outs = nd.RNN(*inputs, mode=mode, state_size=3, num_layers=2, bidirectional=True, state_outputs=True)
        autograd.backward(outs, [ref["%s_head%d" % (mode, i)] for i in range(len(outs))])
        for i, o in enumerate(outs):
            assert_almost_equal(o.asnumpy(), ref["%s_out%d" % (mode, i)].asnumpy(), rtol=1e-4, atol=1e-5)
        for i, a in enumerate(inputs):
            assert_almost_equal(a.grad.asnumpy(), ref["%s_grad%d" % (mode, i)].asnumpy(), rtol=1e-3, atol=1e-5)


def test_rnn_symbol_infers_parameter_and_state_shapes():
    sym = mx.sym.RNN(mx.sym.var("data"), mode="gru", state_size=8, num_layers=2, bidirectional=True, name="rnn")
    assert sym.list_arguments() == ["data", "rnn_parameters", "rnn_state"]
    args, outs, _ = sym.infer_shape(data=(6, 4, 5))
    assert args == [(6, 4, 5), (_param_count("gru", 5, 8, 2, 2),), (4, 4, 8)]
    assert outs == [(6, 4, 16)]
    lstm = mx.sym.RNN(mx.sym.var("data"), mode="lstm", state_size=3, num_layers=1, state_outputs=True, name="l")
    assert lstm.list_arguments() == ["data", "l_parameters", "l_state", "l_state_cell"]
    assert len(lstm.list_outputs()) == 3


def test_lstm_state_clipping(ctx):
    rng = np.random.RandomState(9)
    x, params = rng.randn(5, 8, 3) * 3, rng.uniform(-1, 1, _param_count("lstm", 3, 4, 1, 1)) * 3
    h0, c0 = np.zeros((1, 8, 4)), np.zeros((1, 8, 4))
    kw = dict(mode="lstm", state_size=4, num_layers=1, state_outputs=True, lstm_state_clip_min=-0.5, lstm_state_clip_max=0.4)
    outs = nd.RNN(*[nd.array(a, ctx=ctx) for a in (x, params, h0, c0)], **kw)
    expected = _rnn_reference(x, params, h0, c0, "lstm", 4, 1, 1, clip=(-0.5, 0.4))
    assert np.abs(outs[2].asnumpy()).max() <= 0.5 + 1e-6
    for got, want in zip(outs, expected):
        assert_almost_equal(got.asnumpy(), want, rtol=1e-4, atol=1e-5)


def test_rnn_dropout_between_layers(ctx):
    rng = np.random.RandomState(2)
    args = [nd.array(a, ctx=ctx) for a in (rng.randn(6, 3, 4), rng.uniform(-0.5, 0.5, _param_count("gru", 4, 5, 2, 1)),
                                          np.zeros((2, 3, 5)))]
    kw = dict(mode="gru", state_size=5, num_layers=2, p=0.5)
    plain = nd.RNN(*args, mode="gru", state_size=5, num_layers=2).asnumpy()
    assert_almost_equal(nd.RNN(*args, **kw).asnumpy(), plain, rtol=1e-6, atol=1e-7)  # inference: no dropout
    mx.random.seed(4)
    params = args[1].copy()
    params.attach_grad()
    with autograd.record():
        dropped = nd.RNN(args[0], params, args[2], **kw)
    dropped.backward()
    assert np.abs(dropped.asnumpy() - plain).max() > 1e-3
    # The gradient sees the same mask as the forward pass: a finite difference along the
    # gradient direction, with the mask re-drawn from the same seed, matches it.
    direction = params.grad.asnumpy()
    eps = 1e-3

    def objective(p):
        mx.random.seed(4)
        with autograd.record():
            return nd.RNN(args[0], nd.array(p, ctx=ctx), args[2], **kw).asnumpy().sum()

    base = params.asnumpy()
    numeric = (objective(base + eps * direction) - objective(base - eps * direction)) / (2 * eps)
    assert_almost_equal(numeric, (direction * direction).sum(), rtol=2e-2)


def test_rnn_errors(ctx):
    x = nd.ones((3, 2, 4), ctx=ctx)
    with pytest.raises(mx.MXNetError, match=r"parameters has shape \(7,\), expected \(%d,\)" % _param_count("lstm", 4, 3, 1, 1)):
        nd.RNN(x, nd.ones((7,), ctx=ctx), nd.zeros((1, 2, 3), ctx=ctx), nd.zeros((1, 2, 3), ctx=ctx), mode="lstm", state_size=3, num_layers=1)
    with pytest.raises(mx.MXNetError, match="mode must be"):
        nd.RNN(x, nd.ones((7,), ctx=ctx), nd.zeros((1, 2, 3), ctx=ctx), mode="lstmx", state_size=3, num_layers=1)
    with pytest.raises(mx.MXNetError, match=r"state has shape \(2, 2, 3\), expected \(1, 2, 3\)"):
        nd.RNN(x, nd.ones((_param_count("gru", 4, 3, 1, 1),), ctx=ctx), nd.zeros((2, 2, 3), ctx=ctx), mode="gru", state_size=3, num_layers=1)
    with pytest.raises(mx.MXNetError, match="3-D"):
        nd.RNN(nd.ones((3, 4), ctx=ctx), nd.ones((7,), ctx=ctx), nd.zeros((1, 3, 3), ctx=ctx), mode="gru", state_size=3, num_layers=1)


def test_sequence_ops_match_mxnet():
    ref = nd.load(str(EXTRA / "rnn-ops.params"))
    lengths = ref["seq_len"]
    cases = {
        "last": lambda a: nd.SequenceLast(a, lengths, use_sequence_length=True),
        "last1": lambda a: nd.SequenceLast(a.transpose((1, 0, 2)), lengths, use_sequence_length=True, axis=1),
        "mask": lambda a: nd.SequenceMask(a, lengths, use_sequence_length=True, value=-1.5),
        "reverse": lambda a: nd.SequenceReverse(a, lengths, use_sequence_length=True),
    }
    for name, fn in cases.items():
        a = ref["seq_x"].copy()
        a.attach_grad()
        with autograd.record():
            y = fn(a)
        y.backward(ref["seq_%s_head" % name])
        assert_almost_equal(y.asnumpy(), ref["seq_" + name].asnumpy(), rtol=1e-6, atol=1e-7)
        assert_almost_equal(a.grad.asnumpy(), ref["seq_%s_dx" % name].asnumpy(), rtol=1e-6, atol=1e-7)


def test_sequence_ops_without_lengths_and_errors(ctx):
    x = np.random.RandomState(0).randn(3, 2, 4)
    assert_almost_equal(nd.SequenceLast(nd.array(x, ctx=ctx)).asnumpy(), x[-1])
    assert_almost_equal(nd.SequenceReverse(nd.array(x, ctx=ctx)).asnumpy(), x[::-1])
    assert_almost_equal(nd.SequenceMask(nd.array(x, ctx=ctx)).asnumpy(), x)
    lengths = nd.array([1, 3], ctx=ctx, dtype="float64")
    for op in (nd.SequenceLast, nd.SequenceMask, nd.SequenceReverse):
        check_gradient(lambda a: op(a, lengths, use_sequence_length=True), [(3, 2, 2)], ctx, dtypes=["float64", "float32"])
    with pytest.raises(mx.MXNetError, match=r"sequence_length has shape \(3,\), expected \(2,\)"):
        nd.SequenceLast(nd.array(x, ctx=ctx), nd.array([1, 2, 3], ctx=ctx), use_sequence_length=True)
    with pytest.raises(mx.MXNetError, match="not a whole number"):
        nd.SequenceMask(nd.array(x, ctx=ctx), nd.array([1, 7], ctx=ctx), use_sequence_length=True).asnumpy()
    with pytest.raises(mx.MXNetError, match="axis must be 0"):
        nd.SequenceReverse(nd.array(x, ctx=ctx), axis=1)
