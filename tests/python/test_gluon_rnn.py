"""gluon.rnn: fused RNN/LSTM/GRU layers and the recurrent cells, against MXNet 1.9.1's outputs,
gradients and files (tests/fixtures/extra/make_gluon_rnn.py wrote them), and against each other
(a fused layer equals its cells unrolled with the same weights)."""

import pathlib

import numpy as np
import pytest

import oxnet as mx
from oxnet import autograd, gluon, nd
from oxnet.gluon import rnn
from oxnet.test_utils import assert_almost_equal

EXTRA = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "extra"
REF = nd.load(str(EXTRA / "gluon-rnn.params"))


def _ref(key):
    return REF[key].asnumpy()


class LM(gluon.HybridBlock):
    """The fixture's language model: embedding, 2-layer bidirectional LSTM, decoder."""

    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.embed = gluon.nn.Embedding(11, 4)
            self.lstm = rnn.LSTM(5, num_layers=2, bidirectional=True)
            self.decoder = gluon.nn.Dense(11, flatten=False)

    def hybrid_forward(self, F, x):
        return self.decoder(self.lstm(self.embed(x)))


@pytest.mark.parametrize("hybridize", [False, True])
def test_language_model_loads_mxnet_parameters_and_matches_outputs_and_gradients(hybridize):
    lm = LM(prefix="lm_")
    lm.load_parameters(str(EXTRA / "gluon-rnn-lm.params"))
    if hybridize:
        lm.hybridize()
    with autograd.record():
        y = lm(REF["lm_tokens"])
    y.backward(REF["lm_head"])
    assert_almost_equal(y.asnumpy(), _ref("lm_out"), rtol=1e-4, atol=1e-5)
    for name, param in lm.collect_params().items():
        assert_almost_equal(param.grad().asnumpy(), _ref("lm_grad_" + name), rtol=1e-3, atol=1e-5)


def test_saved_parameter_names_match_mxnet(tmp_path):
    lm = LM(prefix="lm_")
    lm.load_parameters(str(EXTRA / "gluon-rnn-lm.params"))
    lm.save_parameters(str(tmp_path / "lm.params"))
    ours = nd.load(str(tmp_path / "lm.params"))
    theirs = nd.load(str(EXTRA / "gluon-rnn-lm.params"))
    assert sorted(ours) == sorted(theirs)
    assert "lstm._unfused.1.r_cell.h2h_weight" in ours
    for key in theirs:
        assert_almost_equal(ours[key].asnumpy(), theirs[key].asnumpy())


def test_mxnet_export_with_partial_begin_states_imports_and_runs():
    # MXNet exports zero begin states as `_zeros(shape=(4, 0, 5))`: the batch comes from the data.
    block = gluon.SymbolBlock.imports(str(EXTRA / "gluon-rnn-lm-symbol.json"), ["data"],
                                      str(EXTRA / "gluon-rnn-lm-0000.params"))
    assert_almost_equal(block(REF["lm_tokens"]).asnumpy(), _ref("lm_out"), rtol=1e-4, atol=1e-5)
    wider = nd.concat(REF["lm_tokens"], REF["lm_tokens"], dim=1)
    assert block(wider).shape == (6, 6, 11)


def test_export_round_trip_of_a_hybridized_parent(tmp_path):
    lm = LM(prefix="lm_")
    lm.initialize()
    lm.hybridize()
    tokens = nd.array(np.random.RandomState(0).randint(0, 11, (7, 2)))
    y = lm(tokens)
    assert lm.lstm.l0_i2h_weight.shape == (20, 4)
    assert lm.lstm.l1_i2h_weight.shape == (20, 10)
    lm.export(str(tmp_path / "lm"))
    back = gluon.SymbolBlock.imports(str(tmp_path / "lm-symbol.json"), ["data"], str(tmp_path / "lm-0000.params"))
    assert_almost_equal(back(tokens).asnumpy(), y.asnumpy(), rtol=1e-5, atol=1e-6)


def _set_params(block, key_of):
    """Give every (deferred) parameter of ``block`` the fixture value ``REF[key_of(name)]``."""
    for name, param in block.collect_params().items():
        value = REF[key_of(name)]
        param.shape = value.shape
        param._finish_deferred_init()
        param.set_data(value)


def _layer(case):
    return {"gru_ntc": lambda: rnn.GRU(4, num_layers=2, layout="NTC", prefix="gru_ntc_"),
            "rnn_tanh": lambda: rnn.RNN(4, activation="tanh", bidirectional=True, prefix="rnn_tanh_"),
            "rnn_relu": lambda: rnn.RNN(4, num_layers=2, prefix="rnn_relu_")}[case]()


@pytest.mark.parametrize("hybridize", [False, True])
@pytest.mark.parametrize("case", ["gru_ntc", "rnn_tanh", "rnn_relu"])
def test_layers_with_states_match_mxnet(case, hybridize):
    layer = _layer(case)
    layer.initialize()
    _set_params(layer, lambda name: "%s_p_%s" % (case, name[len(layer.prefix):]))
    if hybridize:
        layer.hybridize()
    x = REF[case + "_x"].copy()
    x.attach_grad()
    states = [REF["%s_s%d" % (case, i)] for i in range(len(layer.state_info()))]
    with autograd.record():
        y, new_states = layer(x, states)
        loss = (y * y).sum() + sum((s * s).sum() for s in new_states)
    loss.backward()
    assert_almost_equal(y.asnumpy(), _ref(case + "_y"), rtol=1e-4, atol=1e-5)
    for i, s in enumerate(new_states):
        assert_almost_equal(s.asnumpy(), _ref("%s_ns%d" % (case, i)), rtol=1e-4, atol=1e-5)
    assert_almost_equal(x.grad.asnumpy(), _ref(case + "_dx"), rtol=1e-3, atol=1e-5)


CELLS = {"lstmcell": lambda: rnn.LSTMCell(3, prefix="lstmcell_"),
         "grucell": lambda: rnn.GRUCell(3, prefix="grucell_"),
         "rnncell": lambda: rnn.RNNCell(3, activation="relu", prefix="rnncell_")}


@pytest.mark.parametrize("hybridize", [False, True])
@pytest.mark.parametrize("case", sorted(CELLS))
def test_cells_unrolled_match_mxnet(case, hybridize):
    cell = CELLS[case]()
    cell.initialize()
    _set_params(cell, lambda name: "%s_p_%s" % (case, name[len(cell.prefix):]))
    if hybridize:
        cell.hybridize()
    y, states = cell.unroll(4, REF["cell_x"], merge_outputs=True)
    assert_almost_equal(y.asnumpy(), _ref(case + "_y"), rtol=1e-4, atol=1e-5)
    for i, s in enumerate(states):
        assert_almost_equal(s.asnumpy(), _ref("%s_s%d" % (case, i)), rtol=1e-4, atol=1e-5)
    y, states = cell.unroll(4, REF["cell_x"], merge_outputs=True, valid_length=REF["cell_valid"])
    assert_almost_equal(y.asnumpy(), _ref(case + "_vy"), rtol=1e-4, atol=1e-5)
    for i, s in enumerate(states):
        assert_almost_equal(s.asnumpy(), _ref("%s_vs%d" % (case, i)), rtol=1e-4, atol=1e-5)


def test_stacked_bidirectional_dropout_residual_cells_match_mxnet():
    stack = rnn.SequentialRNNCell(prefix="stack_")
    with stack.name_scope():
        stack.add(rnn.BidirectionalCell(rnn.LSTMCell(3, prefix="l_"), rnn.LSTMCell(3, prefix="r_")))
        stack.add(rnn.DropoutCell(0.0))
        stack.add(rnn.ResidualCell(rnn.GRUCell(6, prefix="res_")))
    stack.initialize()
    _set_params(stack, lambda name: "stack_p_" + name)
    x = REF["cell_x"].transpose((1, 0, 2))
    y, states = stack.unroll(4, x, layout="TNC", merge_outputs=True, valid_length=REF["cell_valid"])
    assert_almost_equal(y.asnumpy(), _ref("stack_y"), rtol=1e-4, atol=1e-5)
    assert len(states) == 5
    for i, s in enumerate(states):
        assert_almost_equal(s.asnumpy(), _ref("stack_s%d" % i), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", ["TNC", "NTC"])
@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
def test_fused_layer_equals_its_cells_unrolled(mode, layout):
    hidden, layers = 4, 2
    if mode == "lstm":
        layer, cell = rnn.LSTM(hidden, layers, layout=layout, bidirectional=True), rnn.LSTMCell
    elif mode == "gru":
        layer, cell = rnn.GRU(hidden, layers, layout=layout, bidirectional=True), rnn.GRUCell
    else:
        layer = rnn.RNN(hidden, layers, activation="tanh", layout=layout, bidirectional=True)
        cell = lambda h, prefix: rnn.RNNCell(h, activation="tanh", prefix=prefix)  # noqa: E731
    layer.initialize(mx.init.Uniform(0.5))
    x = nd.random.normal(shape=(5, 3, 2) if layout == "TNC" else (3, 5, 2))
    fused = layer(x)
    stack = rnn.SequentialRNNCell()
    for i in range(layers):
        stack.add(rnn.BidirectionalCell(cell(hidden, prefix="l%d_" % i), cell(hidden, prefix="r%d_" % i)))
    stack.initialize()
    for name, param in stack.collect_params().items():
        source = getattr(layer, name)
        param.shape = source.shape
        param._finish_deferred_init()
        param.set_data(source.data())
    unrolled, _ = stack.unroll(x.shape[layout.find("T")], x, layout=layout, merge_outputs=True)
    assert_almost_equal(fused.asnumpy(), unrolled.asnumpy(), rtol=1e-4, atol=1e-5)


def test_layer_defaults_shapes_and_repr():
    with mx.name.Prefix("fresh_"):
        layer = rnn.LSTM(6, num_layers=2, bidirectional=True)
        assert [rnn.GRU(3).prefix, rnn.RNN(3).prefix, rnn.LSTMCell(2).prefix] == ["fresh_gru0_", "fresh_rnn0_",
                                                                                 "fresh_lstm1_"]
    assert layer.prefix == "fresh_lstm0_"
    assert sorted(layer.params.keys())[:2] == ["fresh_lstm0_l0_h2h_bias", "fresh_lstm0_l0_h2h_weight"]
    assert layer.l1_i2h_weight.shape == (24, 12) and layer.l0_i2h_weight.shape == (24, 0)
    assert repr(layer) == "LSTM(None -> 6, TNC, num_layers=2, bidirectional)"
    assert [s["shape"] for s in layer.state_info(5)] == [(4, 5, 6), (4, 5, 6)]
    layer.initialize()
    out, states = layer(nd.ones((7, 5, 3)), layer.begin_state(5))
    assert out.shape == (7, 5, 12) and [s.shape for s in states] == [(4, 5, 6), (4, 5, 6)]
    assert repr(layer) == "LSTM(3 -> 6, TNC, num_layers=2, bidirectional)"


def test_bad_states_and_layouts_raise_clear_errors():
    layer = rnn.GRU(4)
    layer.initialize()
    with pytest.raises(ValueError, match=r"Invalid recurrent state shape. Expecting \(1, 2, 4\)"):
        layer(nd.ones((3, 2, 5)), nd.zeros((1, 3, 4)))
    with pytest.raises(ValueError, match="layout"):
        rnn.LSTM(4, layout="CNT")
    with pytest.raises(NotImplementedError, match="Bidirectional cannot be stepped"):
        rnn.BidirectionalCell(rnn.GRUCell(2), rnn.GRUCell(2))(nd.ones((1, 2)), [])


def test_lstm_language_model_trains():
    mx.random.seed(0)
    lm = LM()
    lm.initialize(mx.init.Xavier())
    lm.hybridize()
    trainer = gluon.Trainer(lm.collect_params(), "adam", {"learning_rate": 0.02})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    tokens = nd.array(np.tile(np.arange(11), 4)[:40].reshape(10, 4))
    target = (tokens + 1) % 11
    losses = []
    for _ in range(60):
        with autograd.record():
            loss = loss_fn(lm(tokens), target)
        loss.backward()
        trainer.step(tokens.shape[1])
        losses.append(loss.mean().asscalar())
    assert losses[-1] < 0.1 * losses[0], losses


def test_symbolic_unroll_of_one_input_tensor_splits_it_into_steps():
    # a symbol input is split into a multi-output symbol; each step must get its own output
    cell = rnn.RNNCell(4, prefix="rnn_")
    outputs, _ = cell.unroll(3, mx.sym.var("data"), layout="NTC", merge_outputs=True)
    _, out_shapes, _ = outputs.infer_shape(data=(2, 3, 5))
    assert out_shapes == [(2, 3, 4)]


def test_bound_executor_completes_partial_begin_states():
    # begin states are zeros((0, hidden)): their batch comes from inference, and the bound
    # executor (fused or not) must create them with it
    cell = rnn.ResidualCell(rnn.GRUCell(6, prefix="rnn_"))
    outputs, _ = cell.unroll(2, [mx.sym.var("rnn_t%d_data" % i) for i in range(2)])
    data = np.random.RandomState(0).randn(3, 6).astype(np.float32)
    values = outputs[1].eval(rnn_t0_data=mx.nd.array(data), rnn_t1_data=mx.nd.array(data),
                             rnn_i2h_weight=mx.nd.zeros((18, 6)), rnn_i2h_bias=mx.nd.zeros((18,)),
                             rnn_h2h_weight=mx.nd.zeros((18, 6)), rnn_h2h_bias=mx.nd.zeros((18,)))
    # zero weights: update gate 0.5, candidate 0, so h = 0.5 h_prev = 0 and the residual adds data
    np.testing.assert_allclose(values[0].asnumpy(), data, rtol=1e-6)


@pytest.mark.parametrize("length", [1, 3])
def test_hybridized_bidirectional_unroll_with_valid_length(length):
    class BiLSTM(gluon.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.cell = rnn.BidirectionalCell(rnn.LSTMCell(4, prefix="l_"), rnn.LSTMCell(4, prefix="r_"))

        def hybrid_forward(self, F, inputs, valid_length):
            return self.cell.unroll(length, inputs, valid_length=valid_length, layout="NTC", merge_outputs=True)

    net = BiLSTM()
    net.initialize()
    data = mx.nd.random.uniform(shape=(2, length, 3))
    valid_length = mx.nd.array([length, 1])
    outputs, states = net(data, valid_length)
    net.hybridize()
    hybrid_outputs, hybrid_states = net(data, valid_length)
    assert hybrid_outputs.shape == (2, length, 8) and [s.shape for s in hybrid_states] == [(2, 4)] * 4
    assert_almost_equal(hybrid_outputs.asnumpy(), outputs.asnumpy(), rtol=1e-5, atol=1e-6)
    assert not hybrid_outputs.asnumpy()[1, 1:].any()  # steps past the second sequence's end


def test_context_default_ctx_is_the_current_context():
    with pytest.warns(DeprecationWarning):
        assert mx.Context.default_ctx == mx.current_context()
    with mx.cpu(1):
        with pytest.warns(DeprecationWarning):
            assert mx.Context.default_ctx == mx.cpu(1)


def _length_layer(case):
    kw = dict(num_layers=2, bidirectional=True, use_sequence_length=True)
    if case == "lstm":
        return rnn.LSTM(4, **kw)
    if case == "lstmp":
        return rnn.LSTM(5, projection_size=3, **kw)
    return rnn.GRU(4, **kw)


@pytest.mark.parametrize("hybridize", [False, True])
@pytest.mark.parametrize("case", ["lstm", "lstmp", "gru"])
def test_layer_with_sequence_length_is_padding_invariant(case, hybridize):
    """An example's outputs, final states and parameter gradients are the same alone (no
    padding) as padded with garbage inside a batch of longer and shorter sequences."""
    layer = _length_layer(case)
    layer.initialize(mx.init.Uniform(0.5))
    if hybridize:
        layer.hybridize()
    rng = np.random.RandomState(1)
    lengths = [6, 2, 4]
    x = rng.randn(6, 3, 2) * 3  # garbage beyond each length
    begin = [nd.array(rng.randn(*info["shape"]) * 0.5) for info in layer.state_info(3)]
    heads = rng.uniform(-1, 1, (6, 3, layer._state_width() * 2))

    def run(data, states, lens, head):
        with autograd.record():
            out, final = layer(nd.array(data), states, nd.array(lens))
            loss = (out * nd.array(head)).sum() + sum(s.sum() for s in final)
        loss.backward()
        grads = {name: p.grad().asnumpy().copy() for name, p in layer.collect_params().items()}
        return out.asnumpy(), [s.asnumpy() for s in final], grads

    out, final, grads = run(x, begin, lengths, heads)
    summed = {name: np.zeros_like(g) for name, g in grads.items()}
    for b, length in enumerate(lengths):
        alone_out, alone_final, alone_grads = run(x[:length, b:b + 1], [s[:, b:b + 1] for s in begin], [length],
                                                  heads[:length, b:b + 1])
        assert_almost_equal(out[:length, b], alone_out[:, 0], rtol=1e-5, atol=1e-6)
        assert not out[length:, b].any()
        for s, alone in zip(final, alone_final):
            assert_almost_equal(s[:, b], alone[:, 0], rtol=1e-5, atol=1e-6)
        for name in summed:
            summed[name] += alone_grads[name]
    for name, g in grads.items():
        assert_almost_equal(g, summed[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_fused_layer_with_lengths_equals_cells_unrolled_with_valid_length(mode):
    hidden = 4
    layer = (rnn.LSTM if mode == "lstm" else rnn.GRU)(hidden, bidirectional=True, use_sequence_length=True,
                                                      layout="NTC")
    cell = rnn.LSTMCell if mode == "lstm" else rnn.GRUCell
    layer.initialize(mx.init.Uniform(0.5))
    x = nd.random.normal(shape=(3, 5, 2))
    lengths = nd.array([5, 1, 3])
    fused, fused_states = layer(x, layer.begin_state(3), lengths)
    bi = rnn.BidirectionalCell(cell(hidden, prefix="l0_"), cell(hidden, prefix="r0_"))
    bi.initialize()
    for name, param in bi.collect_params().items():
        param.shape = getattr(layer, name).shape
        param._finish_deferred_init()
        param.set_data(getattr(layer, name).data())
    unrolled, states = bi.unroll(5, x, layout="NTC", merge_outputs=True, valid_length=lengths)
    assert_almost_equal(fused.asnumpy(), unrolled.asnumpy(), rtol=1e-4, atol=1e-5)
    # Cells list states per direction ([h, c] forward, then backward); the layer per kind.
    per_kind = [nd.stack(*states[k::len(fused_states)], axis=0) for k in range(len(fused_states))]
    for got, want in zip(fused_states, per_kind):
        assert_almost_equal(got.asnumpy(), want.asnumpy(), rtol=1e-4, atol=1e-5)


def test_lstmp_layer_parameters_states_and_saved_names(tmp_path):
    layer = rnn.LSTM(6, num_layers=2, projection_size=3, bidirectional=True)
    layer.initialize()
    out, states = layer(nd.ones((4, 2, 5)), layer.begin_state(2))
    assert out.shape == (4, 2, 6) and [s.shape for s in states] == [(4, 2, 3), (4, 2, 6)]
    assert layer.l1_i2h_weight.shape == (24, 6) and layer.l0_h2h_weight.shape == (24, 3)
    assert layer.r1_h2r_weight.shape == (3, 6)
    layer.save_parameters(str(tmp_path / "lstmp.params"))
    saved = nd.load(str(tmp_path / "lstmp.params"))
    assert "_unfused.1.r_cell.h2r_weight" in saved
    with pytest.raises(ValueError, match="use_sequence_length=True"):
        rnn.GRU(3, use_sequence_length=True)(nd.ones((2, 1, 2)))


def test_lstmp_layer_equals_lstmp_cells_unrolled():
    layer = rnn.LSTM(6, num_layers=2, projection_size=3, bidirectional=True, prefix="lstm0_")
    stack = rnn.HybridSequentialRNNCell(prefix="lstm0_")
    with stack.name_scope():
        for i in range(2):
            stack.add(rnn.BidirectionalCell(gluon.contrib.rnn.LSTMPCell(6, 3, prefix="l%d_" % i),
                                            gluon.contrib.rnn.LSTMPCell(6, 3, prefix="r%d_" % i)))
    layer.initialize()
    stack.initialize()
    x = nd.random.normal(shape=(4, 2, 5))
    begin = layer.begin_state(2)
    layer.infer_shape(x, begin)
    stack_params = stack.collect_params()
    for name, param in layer.collect_params().items():
        value = nd.random.uniform(-0.5, 0.5, shape=param.shape)
        param.set_data(value)
        stack_params[name].set_data(value)
    fused, fused_states = layer(x, begin)
    unrolled, states = stack.unroll(4, x, begin_state=stack.begin_state(batch_size=2), layout="TNC",
                                    merge_outputs=True)
    assert_almost_equal(fused.asnumpy(), unrolled.asnumpy(), rtol=1e-4, atol=1e-5)
    for kind, fused_state in enumerate(fused_states):  # h (projected) then c, per layer and direction
        assert_almost_equal(fused_state.asnumpy(), nd.stack(*states[kind::2], axis=0).asnumpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_relu", "lstmp"])
def test_unfused_layer_shares_parameters_and_computes_the_same(kind):
    """``_unfuse()`` gives the layer as cells over the same Parameter objects (initialized after
    unfusing, as MXNet's test does), with dropout cells between layers."""
    options = dict(num_layers=3, bidirectional=True, dropout=0.2)
    layer = {"lstm": lambda: rnn.LSTM(4, **options), "gru": lambda: rnn.GRU(4, **options),
             "rnn_relu": lambda: rnn.RNN(4, activation="relu", **options),
             "lstmp": lambda: rnn.LSTM(4, projection_size=3, **options)}[kind]()
    cells = layer._unfuse()
    assert sum(isinstance(c, rnn.DropoutCell) for c in cells._children.values()) == 2
    layer.initialize(mx.init.Uniform(0.5))
    x = nd.random.normal(shape=(5, 2, 3))
    fused = layer(x)
    assert set(cells.collect_params()) == set(layer.collect_params())
    assert all(cells.collect_params()[name] is param for name, param in layer.collect_params().items())
    unrolled, _ = cells.unroll(5, x, layout="TNC", merge_outputs=True)
    assert_almost_equal(fused.asnumpy(), unrolled.asnumpy(), rtol=1e-4, atol=1e-5)


def test_unfusing_a_clipped_layer_is_refused():
    with pytest.raises(AssertionError, match="clipping"):
        rnn.LSTM(4, state_clip_min=-1, state_clip_max=1)._unfuse()


@pytest.mark.parametrize("drop_states", [0.0, 0.5])
def test_variational_dropout_reuses_one_mask_along_time(drop_states):
    """In training every step drops the same input and output units (one mask per sequence);
    at inference the cell is its base cell; valid_length zeroes the padding steps."""
    mx.random.seed(1)
    cell = gluon.contrib.rnn.VariationalDropoutCell(rnn.RNNCell(6), drop_inputs=0.5, drop_states=drop_states,
                                                    drop_outputs=0.5)
    cell.initialize(mx.init.Uniform(1.0))
    x = nd.random.uniform(0.5, 1.0, shape=(3, 8, 5))  # NTC
    with autograd.train_mode():
        outs, _ = cell.unroll(8, x, layout="NTC", merge_outputs=True)
    # tanh of these values is never exactly 0: zeros are dropped output units, the same at
    # every step of a sequence, different between sequences.
    dropped = outs.asnumpy() == 0
    assert dropped.any() and not dropped.all()
    assert (dropped == dropped[:, :1, :]).all()
    inference, _ = cell.unroll(8, x, layout="NTC", merge_outputs=True)
    cell.base_cell._modified = False
    reference, _ = cell.base_cell.unroll(8, x, layout="NTC", merge_outputs=True)
    cell.base_cell._modified = True
    assert_almost_equal(inference.asnumpy(), reference.asnumpy())
    lengths = nd.array([2, 8, 5])
    masked, _ = cell.unroll(8, x, layout="NTC", valid_length=lengths)
    assert (masked.asnumpy()[0, 2:] == 0).all() and (masked.asnumpy()[2, 5:] == 0).all()


def test_variational_state_dropout_of_a_bidirectional_cell_is_refused():
    with pytest.raises(AssertionError, match="bidirectional"):
        gluon.contrib.rnn.VariationalDropoutCell(rnn.BidirectionalCell(rnn.GRUCell(2), rnn.GRUCell(2)),
                                                 drop_states=0.5)
