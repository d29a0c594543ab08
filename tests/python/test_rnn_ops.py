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


def _rnn_reference(x, params, h0, c0, mode, hidden, layers, dirs, clip=None, lengths=None, projection=None):
    """Step-by-step NumPy RNN with MXNet's flat parameter layout (weights, then biases; LSTMP's
    h2r weight after each direction's h2h weight). With ``lengths``, sequence b only has steps
    ``0..lengths[b]``: later outputs are zero, both directions run over its own steps only."""
    steps, batch, _ = x.shape
    g = GATES[mode] * hidden
    state = projection or hidden
    widths = [x.shape[2] if l == 0 else dirs * state for l in range(layers)]
    offset, weights = 0, []

    def take(rows, cols):
        nonlocal offset
        block = params[offset:offset + rows * cols].reshape(rows, cols)
        offset += rows * cols
        return block

    for l in range(layers):
        for _ in range(dirs):
            weights.append([take(g, widths[l]), take(g, state), take(projection, hidden) if projection else None])
    for k in range(layers * dirs):
        weights[k] += [params[offset:offset + g], params[offset + g:offset + 2 * g]]
        offset += 2 * g
    lengths = np.full(batch, steps) if lengths is None else np.asarray(lengths)
    hy, cy, layer_in = [], [], x
    for l in range(layers):
        outs = []
        for d in range(dirs):
            w_ih, w_hh, w_hr, b_ih, b_hh = weights[l * dirs + d]
            h, c = h0[l * dirs + d].copy(), c0[l * dirs + d].copy() if c0 is not None else None
            seq = np.zeros((steps, batch, state))
            for t in (range(steps - 1, -1, -1) if d else range(steps)):
                active = (t < lengths)[:, None]
                xp, hp = layer_in[t] @ w_ih.T + b_ih, h @ w_hh.T + b_hh
                new_c = c
                if mode == "lstm":
                    pre = xp + hp
                    i, f, o = (_sigmoid(pre[:, k * hidden:(k + 1) * hidden]) for k in (0, 1, 3))
                    new_c = f * c + i * np.tanh(pre[:, 2 * hidden:3 * hidden])
                    if clip:
                        new_c = np.clip(new_c, *clip)
                    new_h = o * np.tanh(new_c)
                    if projection:
                        new_h = new_h @ w_hr.T
                elif mode == "gru":
                    r = _sigmoid(xp[:, :hidden] + hp[:, :hidden])
                    z = _sigmoid(xp[:, hidden:2 * hidden] + hp[:, hidden:2 * hidden])
                    n = np.tanh(xp[:, 2 * hidden:] + r * hp[:, 2 * hidden:])
                    new_h = (1 - z) * n + z * h
                else:
                    new_h = np.maximum(xp + hp, 0) if mode == "rnn_relu" else np.tanh(xp + hp)
                h = np.where(active, new_h, h)
                if c is not None:
                    c = np.where(active, new_c, c)
                seq[t] = np.where(active, new_h, 0)
            outs.append(seq)
            hy.append(h)
            cy.append(c)
        layer_in = np.concatenate(outs, axis=2)
    return layer_in, np.stack(hy), (np.stack(cy) if c0 is not None else None)


def _param_count(mode, inputs, hidden, layers, dirs, projection=None):
    g = GATES[mode] * hidden
    state = projection or hidden
    per_direction = [g * ((inputs if l == 0 else dirs * state) + state + 2) + (projection or 0) * hidden
                     for l in range(layers)]
    return dirs * sum(per_direction)


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
    with pytest.raises(mx.MXNetError, match=r"invalid value 'lstmx' for parameter 'mode' \(\{'rnn_relu', 'rnn_tanh', 'lstm', 'gru'\}\)"):
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


LENGTH_CASES = [
    # (mode, layers, bidirectional, projection)
    ("lstm", 2, True, None), ("lstm", 2, True, 3), ("lstm", 1, False, 2), ("gru", 2, True, None),
    ("rnn_tanh", 1, True, None), ("rnn_relu", 2, False, None),
]


@pytest.mark.parametrize("mode, layers, bidirectional, projection", LENGTH_CASES)
def test_rnn_sequence_lengths_and_projection_match_numpy_with_gradients(mode, layers, bidirectional, projection, ctx):
    """Each sequence runs over its own steps only (the reverse direction from its own end; the
    final states are its states there; padded outputs are zero and pass no gradient), and LSTMP
    projects the hidden state: outputs, states and every input's gradient."""
    # Batch 9 (several concurrent batch ranges) with a full, an empty and short sequences.
    steps, batch, inputs, hidden = 5, 9, 3, 4
    dirs = 2 if bidirectional else 1
    state = projection or hidden
    rng = np.random.RandomState(len(mode) + layers + (projection or 0))
    lengths = np.array([5, 2, 0, 3, 1, 5, 4, 2, 3])
    x = rng.randn(steps, batch, inputs)
    params = rng.uniform(-0.6, 0.6, _param_count(mode, inputs, hidden, layers, dirs, projection))
    h0 = rng.randn(layers * dirs, batch, state) * 0.5
    c0 = rng.randn(layers * dirs, batch, hidden) * 0.5 if mode == "lstm" else None
    kw = dict(mode=mode, state_size=hidden, num_layers=layers, bidirectional=bidirectional, state_outputs=True,
              use_sequence_length=True, projection_size=projection)
    arrays = [x, params, h0] + ([c0] if c0 is not None else [])
    length_array = nd.array(lengths, ctx=ctx, dtype="int32")
    outs = nd.RNN(*[nd.array(a, ctx=ctx) for a in arrays], length_array, **kw)
    expected = _rnn_reference(x, params, h0, c0, mode, hidden, layers, dirs, lengths=lengths, projection=projection)
    for got, want in zip(outs, expected):
        assert_almost_equal(got.asnumpy(), want, rtol=1e-4, atol=1e-5)
    check_gradient(lambda *a: nd.RNN(*a, length_array, **kw), [a.shape for a in arrays], ctx, domain=(-0.6, 0.6),
                   dtypes=["float64", "float32"])


def test_rnn_with_full_lengths_equals_rnn_without_lengths(ctx):
    rng = np.random.RandomState(3)
    x, params = rng.randn(4, 5, 3), rng.uniform(-0.5, 0.5, _param_count("lstm", 3, 4, 2, 2))
    h0, c0 = np.zeros((4, 5, 4)), np.zeros((4, 5, 4))
    kw = dict(mode="lstm", state_size=4, num_layers=2, bidirectional=True, state_outputs=True)
    args = [nd.array(a, ctx=ctx) for a in (x, params, h0, c0)]
    plain = nd.RNN(*args, **kw)
    with_lengths = nd.RNN(*args, nd.full((5,), 4, ctx=ctx), use_sequence_length=True, **kw)
    for a, b in zip(plain, with_lengths):
        assert_almost_equal(a.asnumpy(), b.asnumpy(), rtol=1e-6, atol=1e-7)


def test_rnn_symbol_with_lengths_and_projection_infers_shapes():
    sym = mx.sym.RNN(mx.sym.var("data"), mode="lstm", state_size=6, num_layers=2, bidirectional=True,
                     projection_size=2, use_sequence_length=True, state_outputs=True, name="rnn")
    assert sym.list_arguments() == ["data", "rnn_parameters", "rnn_state", "rnn_state_cell", "rnn_sequence_length"]
    args, outs, _ = sym.infer_shape(data=(7, 3, 5))
    assert args == [(7, 3, 5), (_param_count("lstm", 5, 6, 2, 2, 2),), (4, 3, 2), (4, 3, 6), (3,)]
    assert outs == [(7, 3, 4), (4, 3, 2), (4, 3, 6)]


def test_rnn_length_and_projection_errors(ctx):
    x = nd.ones((3, 2, 4), ctx=ctx)
    params = nd.ones((_param_count("gru", 4, 3, 1, 1),), ctx=ctx)
    state = nd.zeros((1, 2, 3), ctx=ctx)
    with pytest.raises(mx.MXNetError, match=r"sequence_length has shape \(3,\), expected \(2,\)"):
        nd.RNN(x, params, state, nd.array([1, 2, 3], ctx=ctx), mode="gru", state_size=3, num_layers=1,
               use_sequence_length=True)
    with pytest.raises(mx.MXNetError, match=r"sequence_length 4(\.0)? is not a whole number in \[0, 3\]"):
        nd.RNN(x, params, state, nd.array([1, 4], ctx=ctx), mode="gru", state_size=3, num_layers=1,
               use_sequence_length=True).asnumpy()
    with pytest.raises(mx.MXNetError, match="projection_size applies to mode 'lstm' only"):
        nd.RNN(x, params, state, mode="gru", state_size=3, num_layers=1, projection_size=2)
