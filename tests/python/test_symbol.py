"""mx.sym: composition, naming, listing, inference, operators, JSON and executors."""

import json

import numpy as np
import pytest

import oxnet as mx


def mlp(num_hidden=8, classes=3):
    data = mx.sym.var("data")
    fc1 = mx.sym.FullyConnected(data, num_hidden=num_hidden, name="fc1")
    act = mx.sym.Activation(fc1, act_type="relu", name="relu1")
    fc2 = mx.sym.FullyConnected(act, num_hidden=classes, name="fc2")
    return mx.sym.SoftmaxOutput(fc2, name="softmax")


def test_listing_and_automatic_names():
    net = mlp()
    assert net.list_arguments() == ["data", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias", "softmax_label"]
    assert net.list_outputs() == ["softmax_output"]
    assert net.name == "softmax"
    with mx.name.NameManager():
        a = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=2)
        b = mx.sym.FullyConnected(a, num_hidden=2)
    assert (a.name, b.name) == ("fullyconnected0", "fullyconnected1")
    with mx.name.Prefix("net_"):
        c = mx.sym.Activation(mx.sym.var("y"), act_type="tanh", name="act")
    assert c.name == "net_act"


def test_internals_children_indexing_and_group():
    net = mlp()
    internals = net.get_internals()
    assert "relu1_output" in internals.list_outputs()
    relu = internals["relu1_output"]
    assert relu.list_outputs() == ["relu1_output"]
    assert [s.name for s in net.get_children()] == ["fc2", "softmax_label"]
    assert mx.sym.var("x").get_children() is None
    group = mx.sym.Group([relu, net])
    assert len(group) == 2 and group[1].name == "softmax" and group[-1].name == "softmax"
    with pytest.raises(ValueError):
        internals["nope"]
    with pytest.raises(IndexError):
        group[5]


def test_calling_a_symbol_composes():
    net = mlp()
    x = mx.sym.var("x")
    pre = mx.sym.Activation(x, act_type="tanh", name="pre")
    composed = net(data=pre)
    assert composed.list_arguments()[0] == "x"
    assert net.list_arguments()[0] == "data"
    with pytest.raises(mx.MXNetError):
        net(nope=pre)


def test_attributes_scopes_and_variables():
    v = mx.sym.var("w", shape=(3, 4), lr_mult=2.0, dtype="float16", attr={"mood": "calm"})
    assert v.attr("__shape__") == "(3, 4)" and v.attr("__lr_mult__") == "2.0" and v.attr("mood") == "calm"
    assert v.attr("__dtype__") == "2"
    with mx.AttrScope(ctx_group="stage1"):
        fc = mx.sym.FullyConnected(v, num_hidden=2, name="fc")
    assert fc.attr("ctx_group") == "stage1" and fc.attr("num_hidden") == "2"
    fc._set_attr(note="x")
    assert fc.attr_dict()["fc"]["note"] == "x"
    with pytest.raises(ValueError):
        mx.sym.var("bad", foo="bar")
    # A declared shape and dtype take part in inference.
    arg, out, _ = mx.sym.FullyConnected(mx.sym.var("d", shape=(5, 4)), num_hidden=2, name="f").infer_shape()
    assert arg == [(5, 4), (2, 4), (2,)] and out == [(5, 2)]


def test_infer_shape_both_directions_and_partial():
    net = mlp()
    arg, out, aux = net.infer_shape(data=(4, 5))
    assert arg == [(4, 5), (8, 5), (8,), (3, 8), (3,), (4,)] and out == [(4, 3)] and aux == []
    with pytest.warns(UserWarning, match="Cannot decide the shapes"):
        assert net.infer_shape() == (None, None, None)
    arg, out, _ = net.infer_shape_partial()
    assert arg[0] == () and out == [()]
    conv = mx.sym.Convolution(mx.sym.var("img"), kernel=(3, 3), num_filter=4, pad=(1, 1), name="c")
    bn = mx.sym.BatchNorm(conv, name="bn")
    arg, out, aux = bn.infer_shape(img=(2, 3, 8, 8))
    assert arg == [(2, 3, 8, 8), (4, 3, 3, 3), (4,), (4,), (4,)] and aux == [(4,), (4,)] and out == [(2, 4, 8, 8)]
    arg_t, out_t, aux_t = bn.infer_type(img="float64")
    assert set(arg_t) == {np.float64} and out_t == [np.float64]


def test_inconsistent_shapes_name_the_node():
    a, b = mx.sym.var("a"), mx.sym.var("b")
    with pytest.raises(mx.MXNetError, match="'bad_add'"):
        mx.sym.elemwise_add(a, b, name="bad_add").infer_shape(a=(2, 3), b=(3, 2))
    with pytest.raises(mx.MXNetError, match="num_hidden"):
        mx.sym.FullyConnected(a, name="fc")
    with pytest.raises(mx.MXNetError, match="not valid JSON"):
        mx.sym.load_json("{nodes")


def test_operators_and_fluent_methods_evaluate():
    x, y = mx.sym.var("x"), mx.sym.var("y")
    xs, ys = np.array([1.0, 2.0, 4.0], np.float32), np.array([3.0, 1.0, 2.0], np.float32)
    cases = [
        (x + y, xs + ys), (x - y, xs - ys), (x * y, xs * ys), (x / y, xs / ys), (x ** 2, xs ** 2),
        (2 - x, 2 - xs), (1 / x, 1 / xs), (-x, -xs), (x + 1, xs + 1), (3 * x, 3 * xs),
        (x > y, (xs > ys).astype(np.float32)), (x.square().sum(), np.array([np.sum(xs ** 2)], np.float32)),
        (x.reshape((3, 1)), xs.reshape(3, 1)),
    ]
    for sym, expected in cases:
        args = {n: mx.nd.array(v) for n, v in (("x", xs), ("y", ys)) if n in sym.list_arguments()}
        got = sym.eval(**args)[0].asnumpy()
        np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-6, err_msg=sym.tojson())


def test_json_round_trip_is_mxnet_layout():
    net = mlp()
    doc = json.loads(net.tojson())
    assert doc["attrs"]["mxnet_version"] == ["int", 10901]
    ops = [n["op"] for n in doc["nodes"]]
    assert ops.count("null") == 6 and "SoftmaxOutput" in ops
    assert doc["heads"] == [[len(doc["nodes"]) - 1, 0, 0]]
    again = mx.sym.load_json(net.tojson())
    assert again.tojson() == net.tojson()
    legacy = {"nodes": [{"op": "null", "name": "x", "inputs": []},
                        {"op": "_MulScalar", "name": "m", "param": {"scalar": "3"}, "inputs": [[0, 0]]}],
              "heads": [[1, 0]], "attrs": {"mxnet_version": ["int", 905]}}
    out = mx.sym.load_json(json.dumps(legacy)).eval(x=mx.nd.array([1.0, 2.0]))[0]
    np.testing.assert_allclose(out.asnumpy(), [3.0, 6.0])


def _numpy_mlp(args):
    h = np.maximum(args["data"] @ args["fc1_weight"].T + args["fc1_bias"], 0)
    z = h @ args["fc2_weight"].T + args["fc2_bias"]
    e = np.exp(z - z.max(1, keepdims=True))
    return h, e / e.sum(1, keepdims=True)


def test_executor_forward_backward_against_numpy():
    net = mlp()
    exe = net.simple_bind(mx.cpu(), data=(4, 5))
    rng = np.random.RandomState(0)
    values = {}
    for name, array in exe.arg_dict.items():
        values[name] = rng.uniform(-1, 1, array.shape).astype(np.float32)
        array[:] = values[name]
    values["softmax_label"] = np.array([0, 1, 2, 1], np.float32)
    exe.arg_dict["softmax_label"][:] = values["softmax_label"]
    out = exe.forward(is_train=True)[0].asnumpy()
    h, p = _numpy_mlp(values)
    np.testing.assert_allclose(out, p, rtol=1e-5)
    exe.backward()
    dz = p.copy()
    dz[np.arange(4), values["softmax_label"].astype(int)] -= 1
    np.testing.assert_allclose(exe.grad_dict["fc2_weight"].asnumpy(), dz.T @ h, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(exe.grad_dict["fc2_bias"].asnumpy(), dz.sum(0), rtol=1e-4, atol=1e-6)
    assert exe.output_dict["softmax_output"] is exe.outputs[0]


def test_grad_req_add_and_null():
    x = mx.sym.var("x")
    y = mx.sym.var("y")
    loss = mx.sym.sum(x * y)
    xv, yv = mx.nd.array([1.0, 2.0]), mx.nd.array([3.0, 5.0])
    gx, gy = mx.nd.ones((2,)), mx.nd.ones((2,))
    exe = loss.bind(mx.cpu(), {"x": xv, "y": yv}, args_grad={"x": gx, "y": gy}, grad_req={"x": "add", "y": "null"})
    for _ in range(2):
        exe.forward(is_train=True)
        exe.backward()
    np.testing.assert_allclose(gx.asnumpy(), 1 + 2 * yv.asnumpy())
    np.testing.assert_allclose(gy.asnumpy(), [1.0, 1.0])


def test_backward_reads_the_last_forward_pass_of_either_mode():
    exe = mlp().simple_bind(mx.cpu(), data=(2, 5))
    with pytest.raises(mx.MXNetError, match="preceding forward"):
        exe.backward()
    # As in MXNet, is_train only selects the operators' mode; backward reads the values either way.
    x = mx.sym.var("x")
    y = mx.sym.var("y")
    exe = (x * y).bind(mx.cpu(), {"x": mx.nd.array([1.0, 2.0]), "y": mx.nd.array([3.0, 4.0])},
                       args_grad={"x": mx.nd.zeros((2,)), "y": mx.nd.zeros((2,))})
    exe.forward(is_train=False)
    exe.backward(mx.nd.ones((2,)))
    np.testing.assert_allclose(exe.grad_dict["x"].asnumpy(), [3.0, 4.0])


def test_forward_kwargs_reshape_and_shared_parameters():
    net = mlp()
    exe = net.simple_bind(mx.cpu(), data=(4, 5))
    exe.arg_dict["fc1_weight"][:] = 0.1
    small = exe.reshape(data=(2, 5), softmax_label=(2,))
    assert small.arg_dict["fc1_weight"] is exe.arg_dict["fc1_weight"]
    out = small.forward(data=mx.nd.ones((2, 5)))[0]
    assert out.shape == (2, 3)
    with pytest.raises(mx.MXNetError, match="allow_up_sizing"):
        exe.reshape(data=(8, 5), softmax_label=(8,))
    bigger = exe.reshape(allow_up_sizing=True, data=(8, 5), softmax_label=(8,))
    assert bigger.forward()[0].shape == (8, 3)
    bucket = net.simple_bind(mx.cpu(), data=(6, 5), shared_exec=exe)
    assert bucket.arg_dict["fc1_weight"] is exe.arg_dict["fc1_weight"]


def test_bind_errors_are_clear():
    net = mlp()
    with pytest.raises(ValueError, match="no array given"):
        net.bind(mx.cpu(), {"data": mx.nd.ones((2, 5))})
    with pytest.raises(mx.MXNetError, match="cannot infer"):
        net.simple_bind(mx.cpu())


def test_monitor_sees_every_node_output():
    net = mlp()
    exe = net.simple_bind(mx.cpu(), data=(2, 5))
    seen = {}
    exe.set_monitor_callback(lambda name, arr: seen.setdefault(name, arr.shape))
    exe.forward()
    assert seen["fc1_output"] == (2, 8) and seen["softmax_output"] == (2, 3) and "data" not in seen


def test_debug_str_and_dot():
    net = mlp()
    text = net.debug_str()
    assert "Op:FullyConnected, Name=fc1" in text and "Variable:data" in text
    exe = net.simple_bind(mx.cpu(), data=(2, 5))
    assert "MB allocated" in exe.debug_str()
    assert net.to_dot().startswith("digraph")


def test_viz_summary(capsys):
    net = mlp()
    mx.viz.print_summary(net, shape={"data": (2, 5)})
    text = capsys.readouterr().out
    assert "fc1(FullyConnected)" in text and "Total params: %d" % (8 * 5 + 8 + 3 * 8 + 3) in text


def _chain_block(fn):
    class Chain(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x, y):
            return fn(F, x, y)
    return Chain()


@pytest.mark.parametrize("name,fn,reference", [
    ("relu_mul_add", lambda F, x, y: F.relu(x * y + 1), lambda a, b: np.maximum(a * b + 1, 0)),
    ("sigmoid_gate", lambda F, x, y: F.sigmoid(x * y + 1) * x, lambda a, b: a / (1 + np.exp(-(a * b + 1)))),
    ("tanh_sub_exp", lambda F, x, y: F.tanh(x - y) + F.exp(y / 4), lambda a, b: np.tanh(a - b) + np.exp(b / 4)),
])
def test_fused_chains_match_numpy(name, fn, reference, monkeypatch):
    rng = np.random.RandomState(0)
    a = rng.uniform(-2, 2, (3, 70001)).astype(np.float32)
    b = rng.uniform(-2, 2, (3, 70001)).astype(np.float32)
    block = _chain_block(fn)
    block.hybridize()
    got = block(mx.nd.array(a), mx.nd.array(b)).asnumpy()
    np.testing.assert_allclose(got, reference(a, b), rtol=1e-5, atol=1e-6)
    # The same through a symbolic inference executor, and with fusion switched off.
    x, y = mx.sym.var("x"), mx.sym.var("y")
    sym = fn(mx.sym, x, y)
    out = sym.eval(x=mx.nd.array(a), y=mx.nd.array(b))[0].asnumpy()
    np.testing.assert_allclose(out, reference(a, b), rtol=1e-5, atol=1e-6)
    monkeypatch.setenv("MXNET_USE_FUSION", "0")
    plain = sym.eval(x=mx.nd.array(a), y=mx.nd.array(b))[0].asnumpy()
    np.testing.assert_allclose(plain, out, rtol=1e-6, atol=1e-7)


def test_fusion_shrinks_the_inference_plan():
    x, y = mx.sym.var("x"), mx.sym.var("y")
    sym = mx.sym.relu(mx.sym.exp(x * y + 1) - y)
    fused = sym.simple_bind(mx.cpu(), grad_req="null", x=(256, 1024), y=(256, 1024))
    # One fused kernel writes the output directly: only the output block is planned.
    assert fused.planned_bytes == 256 * 1024 * 4


def test_mirroring_recomputes_cheap_activations_to_save_memory(monkeypatch):
    """MXNET_BACKWARD_DO_MIRROR=1: swish activations (x * sigmoid(x)) between FullyConnected
    layers are recomputed in backward instead of kept, with identical gradients."""
    h = mx.sym.var("data")
    for i in range(4):
        h = mx.sym.FullyConnected(h, num_hidden=64, name="fc%d" % i)
        h = h * mx.sym.sigmoid(h)
    rng = np.random.RandomState(3)
    values = {name: rng.uniform(-0.3, 0.3, shape) for name, shape in
              zip(h.list_arguments(), h.infer_shape(data=(32, 64))[0])}

    def run(mirror):
        monkeypatch.setenv("MXNET_BACKWARD_DO_MIRROR", mirror)
        exe = h.simple_bind(mx.cpu(), grad_req="write", data=(32, 64))
        for name, v in values.items():
            exe.arg_dict[name][:] = v
        exe.forward(is_train=True)
        exe.backward([mx.nd.ones((32, 64))])
        return exe.planned_bytes, {k: g.asnumpy() for k, g in exe.grad_dict.items()}

    kept_bytes, kept = run("0")
    mirrored_bytes, mirrored = run("1")
    block = 32 * 64 * 4
    # Each layer kept its FC output, sigmoid and product (3 blocks); mirrored, only the FC output.
    assert kept_bytes - mirrored_bytes >= 2 * 3 * block, (kept_bytes, mirrored_bytes)
    for name in kept:
        np.testing.assert_allclose(mirrored[name], kept[name], rtol=1e-6, atol=1e-7)


def _prelu_chain():
    data = mx.sym.var("data")
    net = mx.sym.Deconvolution(data, kernel=(4, 4), stride=(2, 2), pad=(1, 1), num_filter=6, name="deconv")
    net = mx.sym.LeakyReLU(net, act_type="prelu", name="prelu")
    net = mx.sym.UpSampling(net, sample_type="nearest", scale=2, name="up")
    net = mx.sym.Pooling(net, pool_type="avg", kernel=(3, 3), stride=(2, 2), pad=(1, 1), count_include_pad=False, name="pool")
    net = mx.sym.LeakyReLU(net, act_type="elu", slope=0.3, name="elu")
    return mx.sym.sum(net, axis=(2, 3))


@pytest.mark.parametrize("grad_req", ["write", "add"])
def test_prelu_gamma_gradient_survives_the_memory_plan(grad_req):
    # Regression: a gradient that is not computed straight into its buffer (grad_req 'add', or a
    # gradient read after the backward steps) lived in planned memory that later backward steps
    # reused before it was added to the buffer, so prelu_gamma's gradient came out wrong.
    net = _prelu_chain()
    shapes = {"data": (2, 3, 5, 5)}
    arg_shapes, _, _ = net.infer_shape(**shapes)
    names = net.list_arguments()
    assert dict(zip(names, arg_shapes))["prelu_gamma"] == (6,)  # one slope per channel, as MXNet
    rng = np.random.RandomState(3)
    values = {n: rng.uniform(-1, 1, s) for n, s in zip(names, arg_shapes)}

    def loss(gamma):
        args = dict(values, prelu_gamma=gamma)
        exe = net.bind(mx.cpu(), {n: mx.nd.array(v, dtype="float64") for n, v in args.items()}, grad_req="null")
        return exe.forward()[0].asnumpy().sum()

    gamma = values["prelu_gamma"]
    numeric = np.zeros_like(gamma)
    for i in range(gamma.size):
        step = np.zeros_like(gamma)
        step[i] = 1e-6
        numeric[i] = (loss(gamma + step) - loss(gamma - step)) / 2e-6

    grads = {n: mx.nd.zeros(v.shape, dtype="float64") for n, v in values.items()}
    exe = net.bind(mx.cpu(), {n: mx.nd.array(v, dtype="float64") for n, v in values.items()},
                   args_grad=grads, grad_req=grad_req)
    out = exe.forward(is_train=True)[0]
    exe.backward(mx.nd.ones(out.shape, dtype="float64"))
    # The slope's gradient sums over the batch and every spatial position of its channel.
    np.testing.assert_allclose(grads["prelu_gamma"].asnumpy(), numeric, rtol=1e-6, atol=1e-6)


def test_partial_shapes_are_inferred_in_both_directions():
    a = mx.sym.var("a", shape=(0, 10))
    c = mx.sym.var("c", shape=(5, 0))
    net = mx.sym.FullyConnected(a, num_hidden=21, name="fc") + c
    arg, out, _ = net.infer_shape()
    assert dict(zip(net.list_arguments(), arg)) == {"a": (5, 10), "fc_weight": (21, 10), "fc_bias": (21,), "c": (5, 21)}
    assert out == [(5, 21)]
    # What stays unknown is 0 (legacy) or -1 (NumPy shape semantics); an unknown shape () or None.
    image = mx.sym.var("image", shape=(1, 0, 0, 0))
    conv = mx.sym.Convolution(image, kernel=(7, 7), num_filter=64, no_bias=True, name="conv")
    arg, _, _ = conv.infer_shape_partial()
    assert arg == [(1, 0, 0, 0), (64, 0, 7, 7)]
    with mx.util.np_shape(True):
        arg, out, _ = conv.infer_shape_partial(image=(1, -1, 9, 9))
        assert arg == [(1, -1, 9, 9), (64, -1, 7, 7)] and out == [(1, 64, 3, 3)]
        assert mx.sym.var("free").infer_shape_partial() == ([None], [None], [])
    # Concat and split pass known dimensions through and back.
    parts = mx.sym.Concat(mx.sym.var("p", shape=(0, 10)), mx.sym.var("q", shape=(0, 5)), dim=1) + mx.sym.var("r", shape=(2, 0))
    arg, _, _ = parts.infer_shape()
    assert arg == [(2, 10), (2, 5), (2, 15)]
    halves = mx.sym.SliceChannel(mx.sym.var("s", shape=(0, 15, 0)), num_outputs=3)
    arg, _, _ = (halves[1] + mx.sym.var("t", shape=(3, 5, 2))).infer_shape()
    assert arg == [(3, 15, 2), (3, 5, 2)]
    # A shape stated with _identity_with_attr_like_rhs flows back to the variable it names.
    w = mx.sym.var("w")
    shifted = mx.sym._internal._identity_with_attr_like_rhs(mx.sym.broadcast_add(w, mx.sym.var("shift", shape=(1,))), w)
    fc = mx.sym.FullyConnected(mx.sym.var("x"), weight=shifted, num_hidden=11, no_bias=True)
    arg, _, _ = fc.infer_shape(x=(7, 100))
    assert dict(zip(fc.list_arguments(), arg))["w"] == (11, 100)


def test_np_shape_is_recorded_in_json():
    net = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3, name="fc")
    assert "is_np_shape" not in json.loads(net.tojson())["attrs"]
    with mx.util.np_shape(True):
        assert json.loads(net.tojson())["attrs"]["is_np_shape"] == ["int", 1]


def test_hidden_and_user_attributes_reach_the_operators_variables():
    data = mx.sym.var("data", attr={"mood": "angry", "force_mirroring": "True"}, lr_mult=1)
    assert data.attr("lr_mult") == "1" and data.attr("__lr_mult__") == "1"
    assert data.attr("force_mirroring") == "True" and data.attr("__force_mirroring__") == "True"
    conv = mx.sym.Convolution(data, kernel=(1, 1), num_filter=1, name="conv", attr={"__mood__": "so so"}, wd_mult=0)
    attrs = conv.attr_dict()
    assert attrs["conv"]["__wd_mult__"] == "0" and attrs["conv"]["wd_mult"] == "0"
    assert attrs["conv_weight"]["__mood__"] == "so so" and attrs["conv_weight"]["__wd_mult__"] == "0"
    assert conv.list_attr()["__mood__"] == "so so"


def test_executor_reshape_shares_memory_with_the_original():
    y = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=4, name="fc")
    exe = y.simple_bind(mx.cpu(), x=(5, 4), grad_req="null")
    exe.arg_dict["x"][:] = 1
    exe.arg_dict["fc_weight"][:] = 1
    exe.arg_dict["fc_bias"][:] = 0
    small = exe.reshape(x=(3, 4))
    small.forward()
    np.testing.assert_array_equal(small.outputs[0].asnumpy(), 4)
    np.testing.assert_array_equal(exe.outputs[0].asnumpy()[:3], 4)  # the same storage
    big = exe.reshape(allow_up_sizing=True, x=(6, 4))
    big.arg_dict["x"][:] = 0
    np.testing.assert_array_equal(exe.arg_dict["x"].asnumpy(), 1)  # grown: new memory
    assert big.arg_dict["fc_weight"] is exe.arg_dict["fc_weight"]


def test_group_children_compose_names_and_atomic_symbols():
    data = mx.sym.var("data")
    fc1 = mx.sym.FullyConnected(data, name="fc1", num_hidden=10)
    fc2 = mx.sym.FullyConnected(fc1, name="fc2", num_hidden=100)
    assert fc2.get_children().get_children().list_outputs() == ["data", "fc1_weight", "fc1_bias"]
    renamed = fc2(data=mx.sym.var("x"), name="composed")
    assert renamed.name == "composed" and fc2.name == "fc2"
    rnn = mx.sym.RNN(data, mx.sym.var("p"), mx.sym.var("h0"), mx.sym.var("h1"), state_size=10, num_layers=2,
                     bidirectional=True, state_outputs=True, mode="lstm", name="rnn")
    atomic = rnn._gen_atomic_symbol()
    assert atomic.list_outputs() == rnn.list_outputs()
    with pytest.raises(mx.base.NotImplementedForSymbol):
        bool(data)
    assert abs(data).list_outputs()[0].startswith("abs")


def test_common_subexpressions_are_merged_at_bind(monkeypatch):
    a, b = mx.sym.var("a"), mx.sym.var("b")
    values = {"a": mx.nd.array([[1.0, 2.0]]), "b": mx.nd.array([[3.0, 5.0]])}
    twice = (a + b) + (a + b)
    exe = twice.simple_bind(mx.cpu(), a=(1, 2), b=(1, 2))
    assert len(exe.get_optimized_symbol().get_internals()) + 1 == len(twice.get_internals())
    out = exe.forward(is_train=True, **values)[0]
    exe.backward(mx.nd.ones((1, 2)))
    np.testing.assert_allclose(out.asnumpy(), [[8.0, 14.0]])
    np.testing.assert_allclose(exe.grad_dict["a"].asnumpy(), [[2.0, 2.0]])
    # Two outputs that become one value are copied apart: each keeps storage of its own.
    pair = mx.sym.Group([a * b, a * b])
    exe = pair.simple_bind(mx.cpu(), a=(1, 2), b=(1, 2))
    assert len(exe.get_optimized_symbol().get_internals()) == len(pair.get_internals())
    first, second = exe.forward(**values)
    first[:] = 0
    np.testing.assert_allclose(second.asnumpy(), [[3.0, 10.0]])
    # Random draws are never merged; the pass can be switched off.
    drops = mx.sym.Dropout(a, p=0.5) + mx.sym.Dropout(a, p=0.5)
    exe = drops.simple_bind(mx.cpu(), a=(1, 2))
    assert len(exe.get_optimized_symbol().get_internals()) == len(drops.get_internals())
    monkeypatch.setenv("MXNET_ELIMINATE_COMMON_EXPR", "0")
    exe = twice.simple_bind(mx.cpu(), a=(1, 2), b=(1, 2))
    assert len(exe.get_optimized_symbol().get_internals()) == len(twice.get_internals())


def test_vector_dot_gradients():
    # The inner product of two vectors has shape (1,): each gradient is the other vector times g.
    x, y = mx.nd.array([1.0, 2.0, 3.0]), mx.nd.array([4.0, 5.0, 6.0])
    grads = {"x": mx.nd.zeros((3,)), "y": mx.nd.zeros((3,))}
    exe = mx.sym.dot(mx.sym.var("x"), mx.sym.var("y")).bind(mx.cpu(), {"x": x, "y": y}, args_grad=grads)
    exe.forward(is_train=True)
    exe.backward(mx.nd.array([2.0]))
    np.testing.assert_allclose(grads["x"].asnumpy(), [8.0, 10.0, 12.0])
    np.testing.assert_allclose(grads["y"].asnumpy(), [2.0, 4.0, 6.0])
    x.attach_grad()
    with mx.autograd.record():
        z = mx.nd.dot(x, y)
    z.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), y.asnumpy())


def test_broadcast_like_along_chosen_axes():
    lhs = mx.sym.var("lhs")
    like = mx.sym.broadcast_like(lhs, mx.sym.var("rhs"), lhs_axes=(0,), rhs_axes=(1,))
    out = like.eval(lhs=mx.nd.array([[1.0, 2.0]]), rhs=mx.nd.zeros((4, 3)))[0]
    np.testing.assert_allclose(out.asnumpy(), [[1.0, 2.0]] * 3)


def _conv_bn_relu(data, layers, fix_gamma=False):
    """Convolution -> BatchNorm -> relu layers (kwargs of each convolution), as model zoos write them."""
    h = data
    for i, conv in enumerate(layers):
        h = mx.sym.Convolution(h, name="conv%d" % i, **conv)
        h = mx.sym.BatchNorm(h, fix_gamma=fix_gamma, eps=1e-5, name="bn%d" % i)
        h = mx.sym.Activation(h, act_type="relu", name="relu%d" % i)
    return h


_FOLDED_CHAINS = [
    # (layers, data shape): the im2col, shifted, 1x1 and depthwise strategies, with and without
    # bias, one image (the products on all threads) and a batch (images spread over threads).
    ([dict(kernel=(3, 3), num_filter=8, pad=(1, 1), stride=(2, 2))], (1, 3, 15, 15)),
    ([dict(kernel=(3, 3), num_filter=32, pad=(1, 1), no_bias=True),
      dict(kernel=(1, 1), num_filter=16)], (5, 32, 12, 12)),
    ([dict(kernel=(3, 3), num_filter=16, num_group=16, pad=(1, 1), no_bias=True),
      dict(kernel=(3, 3), num_filter=16, num_group=16, stride=(2, 2))], (3, 16, 10, 10)),
    ([dict(kernel=(3,), num_filter=4, pad=(1,))], (4, 2, 9)),
]


def _bind_with_values(sym, shape, grad_req="null"):
    rng = np.random.RandomState(0)
    exe = sym.simple_bind(mx.cpu(), grad_req=grad_req, data=shape)
    for name, array in list(exe.arg_dict.items()) + list(exe.aux_dict.items()):
        low = 0.5 if "var" in name or "gamma" in name else -1.0
        array[:] = rng.uniform(low, 1.5, array.shape)
    return exe


@pytest.mark.parametrize("layers,shape,fix_gamma", [c + (False,) for c in _FOLDED_CHAINS] + [_FOLDED_CHAINS[1] + (True,)])
def test_convolution_batchnorm_relu_fold_at_inference(monkeypatch, layers, shape, fix_gamma):
    """An inference executor folds each Convolution -> BatchNorm -> relu chain into the
    convolution: the values are those of the three operators run one by one (gamma read as 1
    under fix_gamma, whatever its value)."""
    sym = _conv_bn_relu(mx.sym.var("data"), layers, fix_gamma)
    folded = _bind_with_values(sym, shape)
    folded.forward(is_train=False)
    monkeypatch.setenv("MXNET_USE_FUSION", "0")
    plain = _bind_with_values(sym, shape)
    plain.forward(is_train=False)
    np.testing.assert_allclose(folded.outputs[0].asnumpy(), plain.outputs[0].asnumpy(), rtol=1e-5, atol=1e-5)
    assert (folded.outputs[0].asnumpy() == 0).any(), "the relu clipped something"
    # Only the chain's output is planned: the convolution's and BatchNorm's values never exist.
    assert folded.planned_bytes < plain.planned_bytes


def test_folded_convolution_in_training_mode_keeps_batchnorm_semantics(monkeypatch):
    """forward(is_train=True) on an inference executor: batch statistics and moving statistics
    updated, exactly as the unfolded operators."""
    sym = _conv_bn_relu(mx.sym.var("data"), [dict(kernel=(3, 3), num_filter=6, pad=(1, 1))])
    runs = []
    for fusion in ("1", "0"):
        monkeypatch.setenv("MXNET_USE_FUSION", fusion)
        exe = _bind_with_values(sym, (4, 3, 8, 8))
        exe.forward(is_train=True)
        runs.append((exe.outputs[0].asnumpy(), exe.aux_dict["bn0_moving_mean"].asnumpy(), exe.aux_dict["bn0_moving_var"].asnumpy()))
    for folded, plain in zip(*runs):
        np.testing.assert_allclose(folded, plain, rtol=1e-5, atol=1e-6)


def test_hybridized_inference_folds_and_matches_imperative():
    """A hybridized Gluon network at inference (the model-zoo layout: conv, BN, relu, a residual
    add) gives the imperative network's values; recording gradients runs the unfolded graph."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(8, 3, padding=1, use_bias=False), mx.gluon.nn.BatchNorm(), mx.gluon.nn.Activation("relu"),
            mx.gluon.nn.Conv2D(8, 3, padding=1), mx.gluon.nn.BatchNorm(), mx.gluon.nn.GlobalAvgPool2D())
    net.initialize(mx.init.Xavier())
    x = mx.nd.array(np.random.RandomState(1).uniform(-1, 1, (2, 4, 9, 9)))
    with mx.autograd.record():
        net(x)  # moves the moving statistics away from their initial values
    eager = net(x).asnumpy()
    net.hybridize(static_alloc=True, static_shape=True)
    np.testing.assert_allclose(net(x).asnumpy(), eager, rtol=1e-5, atol=1e-6)
    with mx.autograd.record():
        y = net(x)
    y.backward()
    assert net[0].weight.grad().abs().sum().asscalar() > 0
