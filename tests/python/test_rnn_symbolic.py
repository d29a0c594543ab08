"""The symbolic RNN package (mx.rnn), executors placing ctx_groups on contexts, monitors of
backward passes and Gluon op hooks."""

import numpy as np
import pytest

import oxnet as mx


def _bind_and_run(sym, arrays):
    exe = sym.bind(mx.cpu(), {k: mx.nd.array(v) for k, v in arrays.items()})
    return [o.asnumpy() for o in exe.forward()]


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_unfused_cells_compute_what_the_fused_rnn_op_computes(mode):
    seq_len, batch, num_input, hidden = 3, 2, 4, 5
    fused = mx.rnn.FusedRNNCell(hidden, num_layers=2, mode=mode, bidirectional=True, prefix="f_")
    data = mx.sym.Variable("data")
    fused_out, _ = fused.unroll(seq_len, data, layout="TNC", merge_outputs=True)
    stack = fused.unfuse()
    unfused_out, _ = stack.unroll(seq_len, data, layout="TNC", merge_outputs=True)

    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, (seq_len, batch, num_input)).astype(np.float32)
    arg_shapes, _, _ = fused_out.infer_shape(data=x.shape)
    size = dict(zip(fused_out.list_arguments(), arg_shapes))["f_parameters"][0]
    packed = mx.nd.array(rng.uniform(-0.5, 0.5, (size,)).astype(np.float32))

    expected = _bind_and_run(fused_out, {"data": x, "f_parameters": packed.asnumpy()})[0]
    # unpack_weights splits the packed vector per gate; the step cells take the gates stacked.
    unpacked = stack.pack_weights(fused.unpack_weights({"f_parameters": packed}))
    arrays = {name: unpacked[name].asnumpy() for name in unfused_out.list_arguments() if name != "data"}
    arrays["data"] = x
    got = _bind_and_run(unfused_out, arrays)[0]
    assert got.shape == (seq_len, batch, 2 * hidden)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # pack(unpack(p)) is p.
    repacked = fused.pack_weights(fused.unpack_weights({"f_parameters": packed}))["f_parameters"]
    np.testing.assert_array_equal(repacked.asnumpy(), packed.asnumpy())


def test_zoneout_learns_the_shape_of_its_first_previous_output():
    # where(mask, new, zeros((0, 0))): the zeros take the shape of the other branch.
    cell = mx.rnn.ZoneoutCell(mx.rnn.RNNCell(6, prefix="z_"), zoneout_outputs=0.5)
    outputs, _ = cell.unroll(2, [mx.sym.Variable("a"), mx.sym.Variable("b")])
    _, out_shapes, _ = mx.sym.Group(outputs).infer_shape(a=(3, 4), b=(3, 4))
    assert out_shapes == [(3, 6), (3, 6)]


def test_encode_sentences_maps_unknown_tokens_to_the_unknown_token():
    encoded, vocab = mx.rnn.encode_sentences([["a", "x"], ["y", "b"]], vocab={"a": 1, "b": 2},
                                             start_label=0, unknown_token="<unk>")
    assert encoded == [[1, 0], [0, 2]]
    assert vocab == {"a": 1, "b": 2, "<unk>": 0}
    with pytest.raises(AssertionError):
        mx.rnn.encode_sentences([["z"]], vocab={"a": 1})


def test_bucket_sentence_iter_pads_and_shifts_labels():
    sentences = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [2, 2, 2, 2, 2]]
    it = mx.rnn.BucketSentenceIter(sentences, 2, buckets=[3, 5], invalid_label=-1)
    batches = list(it)
    assert sorted(b.bucket_key for b in batches) == [3, 5]
    for batch in batches:
        data, label = batch.data[0].asnumpy(), batch.label[0].asnumpy()
        np.testing.assert_array_equal(label[:, :-1], data[:, 1:])
        assert (label[:, -1] == -1).all()


def test_perplexity_clips_out_of_range_labels_as_pick_does():
    metric = mx.metric.Perplexity(ignore_label=None)
    pred = mx.nd.array([[0.25, 0.75]])
    metric.update([mx.nd.array([5])], [pred])  # clipped to class 1
    assert abs(metric.get()[1] - 1 / 0.75) < 1e-5


def test_ctx_group_places_arrays_and_gradients_on_the_group_context():
    with mx.AttrScope(ctx_group="dev1"):
        a = mx.sym.Variable("a")
        a2 = a * 2
    with mx.AttrScope(ctx_group="dev2"):
        b = mx.sym.Variable("b")
        c = a2 + b
    exe = c.simple_bind(mx.cpu(0), a=(2, 3), b=(2, 3), group2ctx={"dev1": mx.cpu(1), "dev2": mx.cpu(2)})
    assert exe.arg_dict["a"].context == mx.cpu(1)
    assert exe.grad_dict["b"].context == mx.cpu(2)
    assert exe.outputs[0].context == mx.cpu(2)
    exe.forward(is_train=True, a=mx.nd.ones((2, 3)), b=mx.nd.ones((2, 3)))
    exe.backward(mx.nd.ones((2, 3)))
    np.testing.assert_array_equal(exe.outputs[0].asnumpy(), np.full((2, 3), 3.0))
    np.testing.assert_array_equal(exe.grad_dict["a"].asnumpy(), np.full((2, 3), 2.0))
    assert exe.grad_dict["a"].context == mx.cpu(1)
    # Without group2ctx every array must be on the executor's context, as in MXNet.
    with pytest.raises(mx.MXNetError):
        c.bind(mx.cpu(0), {"a": mx.nd.ones((2, 3), ctx=mx.cpu(1)), "b": mx.nd.ones((2, 3))})


def test_monitor_reports_each_nodes_input_gradients_after_backward():
    x = mx.sym.Variable("data")
    fc = mx.sym.FullyConnected(x, num_hidden=2, name="fc")
    act = mx.sym.Activation(fc, act_type="sigmoid", name="act")
    exe = act.simple_bind(mx.cpu(), data=(1, 3), grad_req={"fc_weight": "write", "fc_bias": "write"})
    seen = {}
    exe.set_monitor_callback(lambda name, arr: seen.__setitem__(name, arr.asnumpy()))
    exe.forward(is_train=True, data=mx.nd.ones((1, 3)))
    exe.backward(mx.nd.ones((1, 2)))
    assert {"fc_output", "act_output", "act_backward_output", "fc_backward_output0",
            "fc_backward_output1", "fc_backward_output2"} <= set(seen)
    np.testing.assert_allclose(seen["fc_backward_output2"], exe.grad_dict["fc_bias"].asnumpy())
    np.testing.assert_allclose(seen["act_backward_output"], exe.grad_dict["fc_bias"].asnumpy().reshape(1, 2))
    # The data gradient is not requested: reported as zeros.
    np.testing.assert_array_equal(seen["fc_backward_output0"], np.zeros((1, 3)))


def test_op_hook_names_inputs_and_outputs_as_mxnet():
    net = mx.gluon.nn.HybridSequential(prefix="n_")
    with net.name_scope():
        net.add(mx.gluon.nn.Dense(2), mx.gluon.nn.Activation("relu"))
    net.initialize()
    net.hybridize()
    seen = []
    net.register_op_hook(lambda name, op, arr: seen.append((name, op, arr.shape)), monitor_all=True)
    out = net(mx.nd.ones((2, 3)))
    assert [s[0] for s in seen] == ["n_dense0_fwd_data", "n_dense0_fwd_weight", "n_dense0_fwd_bias",
                                    "n_dense0_fwd_output", "n_relu0_fwd_input0", "n_relu0_fwd_output"]
    assert seen[3][1] == "FullyConnected" and seen[5][2] == out.shape
