"""mx.onnx and mx.contrib.onnx: the model zoo, MXNet 1.9.1's fixture graphs, recurrent models and single layers
exported to ONNX give oxnet's outputs in onnxruntime, and the exported files imported back give them again."""

import sys

import numpy as np
import pytest

import oxnet as mx
from oxnet import gluon
from oxnet.gluon.model_zoo import vision

try:
    import onnx
    import onnxruntime as ort
except ImportError:
    onnx = ort = None

needs_onnx = pytest.mark.skipif(ort is None,
                                reason="needs the optional onnx and onnxruntime: pip install onnx onnxruntime")

TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def _run_onnxruntime(path, feeds):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {k: np.asarray(v) for k, v in feeds.items()})


def _run_imported(path, feeds):
    sym, arg_params, aux_params = mx.onnx.import_model(str(path))
    exe = sym.simple_bind(mx.cpu(), grad_req="null", **{k: np.shape(v) for k, v in feeds.items()})
    for name, value in list(arg_params.items()) + list(aux_params.items()):
        target = exe.arg_dict.get(name, exe.aux_dict.get(name))
        target[:] = value
    for name, value in feeds.items():
        exe.arg_dict[name][:] = value
    return [out.asnumpy() for out in exe.forward(is_train=False)]


def _assert_outputs_match(got, expected, **tolerance):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, **(tolerance or TOLERANCE))


def _check_round_trip(path, feeds, expected, **tolerance):
    _assert_outputs_match(_run_onnxruntime(path, feeds), expected, **tolerance)
    _assert_outputs_match(_run_imported(path, feeds), expected, **tolerance)


# ---------------------------------------------------------------------------------------------- model zoo

ZOO = ["resnet18_v1", "resnet18_v2", "mobilenet1.0", "mobilenetv2_1.0", "vgg11", "alexnet", "squeezenet1.0",
       "densenet121", "inceptionv3"]


def _zoo_input_size(name):
    """The smallest size each model runs at: fixed final pools need full-size images."""
    return {"inceptionv3": 299, "squeezenet1.0": 224, "densenet121": 224, "alexnet": 64}.get(name, 32)


def _zoo_model(name):
    with mx.name.NameManager():
        net = vision.get_model(name, classes=10)
    net.initialize(mx.init.Xavier(magnitude=2))
    rng = np.random.RandomState(0)
    size = _zoo_input_size(name)
    x = mx.nd.array(rng.uniform(-1, 1, (1, 3, size, size)))
    net(x)
    # Batch-norm statistics away from the identity, so that their export is checked.
    for pname, param in net.collect_params().items():
        if pname.endswith(("running_var", "gamma")):
            param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, param.shape)))
        elif pname.endswith(("running_mean", "beta")):
            param.set_data(mx.nd.array(rng.uniform(-0.2, 0.2, param.shape)))
    net.hybridize()
    return net, x


@needs_onnx
@pytest.mark.parametrize("name", ZOO)
def test_model_zoo_exports_to_onnxruntime_and_imports_back(name, tmp_path):
    net, x = _zoo_model(name)
    expected = [net(x).asnumpy()]
    net.export(str(tmp_path / name))
    path = mx.onnx.export_model(str(tmp_path / (name + "-symbol.json")), str(tmp_path / (name + "-0000.params")),
                                [x.shape], np.float32, str(tmp_path / (name + ".onnx")))
    _check_round_trip(path, {"data": x.asnumpy()}, expected)


@needs_onnx
def test_dynamic_batch_export_runs_other_batch_sizes(tmp_path):
    net, x = _zoo_model("resnet18_v1")
    sym = net(mx.sym.var("data"))
    params = {k: v.data() for k, v in net.collect_params().items()}
    path = mx.onnx.export_model(sym, params, [x.shape], onnx_file_path=str(tmp_path / "r.onnx"), dynamic=True,
                                dynamic_input_shapes=[("batch", 3, 32, 32)])
    model = onnx.load(path)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    batch = mx.nd.array(np.random.RandomState(1).uniform(-1, 1, (3, 3, 32, 32)))
    _assert_outputs_match(_run_onnxruntime(path, {"data": batch.asnumpy()}), [net(batch).asnumpy()])


# ---------------------------------------------------------------------------------------------- fixtures

FIXTURE_MODELS = ["mlp", "lenet", "resblock", "lstm", "wolfram", "gluon_mlp"]


@needs_onnx
@pytest.mark.parametrize("name", FIXTURE_MODELS)
def test_mxnet_fixture_graph_round_trip(fixtures_dir, name, tmp_path):
    sym_file = str(fixtures_dir / ("%s-symbol.json" % name))
    param_file = str(fixtures_dir / ("%s-0000.params" % name))
    io = mx.nd.load(str(fixtures_dir / ("%s-io.params" % name)))
    sym = mx.sym.load(sym_file)
    data_names = [n for n in sym.list_inputs() if n in io and not n.endswith("_label")]
    feeds = {n: io[n].asnumpy() for n in data_names}
    saved = mx.nd.load(param_file)
    saved = saved if isinstance(saved, dict) else {}
    args = {k[4:]: v for k, v in saved.items() if k.startswith("arg:")}
    aux = {k[4:]: v for k, v in saved.items() if k.startswith("aux:")}
    exe = sym.simple_bind(mx.cpu(), grad_req="null", **{n: v.shape for n, v in feeds.items()})
    exe.copy_params_from(args, aux, allow_extra_params=True)
    expected = [o.asnumpy() for o in exe.forward(is_train=False, **feeds)]
    np.testing.assert_allclose(expected[0], io["out:0"].asnumpy(), rtol=1e-3, atol=1e-5)
    path = mx.onnx.export_model(sym_file, param_file, [v.shape for v in feeds.values()],
                                onnx_file_path=str(tmp_path / (name + ".onnx")))
    _check_round_trip(path, feeds, expected)


@needs_onnx
def test_gluon_rnn_language_model_with_zero_batch_states(fixtures_dir, tmp_path):
    """Gluon's export: begin states as `_zeros` with batch 0 and `_rnn_param_concat` of the weights."""
    extra = fixtures_dir.parent / "extra"
    ref = mx.nd.load(str(extra / "gluon-rnn.params"))
    tokens, expected = ref["lm_tokens"].asnumpy(), ref["lm_out"].asnumpy()
    sym_file, param_file = str(extra / "gluon-rnn-lm-symbol.json"), str(extra / "gluon-rnn-lm-0000.params")
    path = mx.onnx.export_model(sym_file, param_file, [tokens.shape], onnx_file_path=str(tmp_path / "lm.onnx"))
    _check_round_trip(path, {"data": tokens}, [expected], rtol=1e-4, atol=1e-5)
    # Dynamic: the zero states follow the batch of the data.
    dyn = mx.onnx.export_model(sym_file, param_file, [tokens.shape], onnx_file_path=str(tmp_path / "lm-dyn.onnx"),
                               dynamic=True)
    _assert_outputs_match(_run_onnxruntime(dyn, {"data": tokens}), [expected])
    _assert_outputs_match(_run_onnxruntime(dyn, {"data": tokens[:, :2]}), [expected[:, :2]])


# ---------------------------------------------------------------------------------------------- recurrent

class _Recurrent(gluon.HybridBlock):
    def __init__(self, layer, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.layer = layer

    def hybrid_forward(self, F, x, *states):
        out, new_states = self.layer(x, list(states))
        return [out] + list(new_states)


@needs_onnx
@pytest.mark.parametrize("mode,layers,bidirectional", [
    ("lstm", 2, True), ("lstm", 1, False), ("gru", 2, True), ("rnn_tanh", 1, True), ("rnn_relu", 2, False)])
@pytest.mark.parametrize("opset", [12, 13])
def test_fused_rnn_exports_as_onnx_recurrent_ops(mode, layers, bidirectional, opset, tmp_path):
    common = dict(bidirectional=bidirectional, input_size=4)
    make = {"lstm": lambda: gluon.rnn.LSTM(5, layers, **common),
            "gru": lambda: gluon.rnn.GRU(5, layers, **common),
            "rnn_tanh": lambda: gluon.rnn.RNN(5, layers, activation="tanh", **common),
            "rnn_relu": lambda: gluon.rnn.RNN(5, layers, activation="relu", **common)}[mode]
    net = _Recurrent(make())
    net.initialize(mx.init.Uniform(0.5))
    rng = np.random.RandomState(3)
    x = mx.nd.array(rng.uniform(-1, 1, (6, 2, 4)))
    states = [mx.nd.array(rng.uniform(-1, 1, s.shape)) for s in net.layer.begin_state(2)]
    net.hybridize()
    expected = [o.asnumpy() for o in net(x, *states)]
    net.export(str(tmp_path / "rnn"))
    sym = mx.sym.load(str(tmp_path / "rnn-symbol.json"))
    data_names = [n for n in sym.list_inputs() if n.startswith("data")]
    feeds = dict(zip(data_names, [x.asnumpy()] + [s.asnumpy() for s in states]))
    path = mx.onnx.export_model(str(tmp_path / "rnn-symbol.json"), str(tmp_path / "rnn-0000.params"),
                                [v.shape for v in feeds.values()], onnx_file_path=str(tmp_path / "rnn.onnx"),
                                opset_version=opset)
    onnx_op = {"lstm": "LSTM", "gru": "GRU"}.get(mode, "RNN")
    assert sum(node.op_type == onnx_op for node in onnx.load(path).graph.node) == layers
    _check_round_trip(path, feeds, expected)


# ---------------------------------------------------------------------------------------------- layers

def _var(name="data"):
    return mx.sym.var(name)


def _conv_net():
    x = mx.sym.Convolution(_var(), num_filter=6, kernel=(3, 3), stride=(2, 1), pad=(1, 0), dilate=(1, 2),
                           num_group=2, name="conv")
    return mx.sym.Deconvolution(x, num_filter=4, kernel=(3, 3), stride=(2, 2), pad=(1, 1), adj=(1, 0),
                                no_bias=False, name="deconv"), (2, 4, 9, 10)


def _deconv_target_shape():
    return mx.sym.Deconvolution(_var(), num_filter=3, kernel=(4, 4), stride=(2, 2), target_shape=(11, 12),
                                name="deconv"), (1, 2, 6, 6)


def _activations():
    x = _var()
    parts = [mx.sym.Activation(x, act_type=a) for a in ("relu", "sigmoid", "tanh", "softrelu", "softsign")]
    parts += [mx.sym.LeakyReLU(x, act_type=a, slope=0.3) for a in ("leaky", "elu", "selu", "gelu")]
    parts.append(mx.sym.LeakyReLU(x, act_type="prelu", name="prelu"))
    return mx.sym.Concat(*parts, dim=1), (2, 3, 4, 5)


def _pooling():
    x = _var()
    parts = [
        mx.sym.Pooling(x, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max"),
        mx.sym.Pooling(x, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="avg", count_include_pad=False),
        mx.sym.Pooling(x, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="avg", count_include_pad=True),
        mx.sym.Pooling(x, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max", pooling_convention="full"),
        mx.sym.Pooling(x, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="sum"),
    ]
    flat = [mx.sym.Flatten(p) for p in parts]
    flat += [mx.sym.Flatten(mx.sym.Pooling(x, global_pool=True, kernel=(1, 1), pool_type=t)) for t in ("max", "avg")]
    return mx.sym.Concat(*flat, dim=1), (2, 3, 8, 9)


def _reshapes():
    x = _var()
    a = mx.sym.Reshape(x, shape=(0, -1))
    b = mx.sym.Reshape(x, shape=(-3, -2))
    c = mx.sym.Reshape(x, shape=(0, -4, 2, -1, -2))
    d = mx.sym.Reshape(mx.sym.transpose(x, axes=(0, 2, 1, 3)), shape=(-1, 5))
    e = mx.sym.expand_dims(mx.sym.squeeze(mx.sym.slice_axis(x, axis=2, begin=1, end=2), axis=2), axis=-1)
    f = mx.sym.slice(x, begin=(None, 1, None), end=(None, None, -1), step=(1, 2, 1))
    return mx.sym.Group([mx.sym.Flatten(s) for s in (a, b, c, d, e, f)]), (2, 6, 3, 5)


def _reductions_and_softmax():
    x = _var()
    outs = [mx.sym.mean(x, axis=1), mx.sym.sum(x, axis=(1, 3), keepdims=True), mx.sym.max(x, axis=2, exclude=True),
            mx.sym.sum(x), mx.sym.softmax(x, axis=1), mx.sym.softmax(x, temperature=2.0),
            mx.sym.log_softmax(x, axis=-1), mx.sym.SoftmaxActivation(x, mode="channel"), mx.sym.SoftmaxActivation(x),
            mx.sym.SoftmaxOutput(x, name="sm")]
    return mx.sym.Group(outs), (2, 3, 4, 5)


def _arithmetic():
    x, y = _var(), _var("other")
    z = mx.sym.broadcast_mul(x, mx.sym.sum(y, axis=0, keepdims=True)) - y
    z = mx.sym.clip(z * 2.0 + 1.0, -1.5, 2.0) / 3.0 - (1.0 / (mx.sym.abs(y) + 1.0))
    z = mx.sym.elemwise_add(z, mx.sym.Dropout(y, p=0.5)) ** 2.0
    z = mx.sym.broadcast_maximum(z, mx.sym.broadcast_minimum(x, y)) + (x > 0.1) + mx.sym.broadcast_greater(x, y)
    outs = [z, mx.sym.add_n(x, y, z), 2.0 - x, mx.sym.exp(mx.sym.tanh(x)), mx.sym.sqrt(mx.sym.square(y))]
    return mx.sym.Group(outs), {"data": (3, 4), "other": (3, 4)}


def _normalizations():
    x = _var()
    outs = [mx.sym.LayerNorm(x, name="ln"), mx.sym.LayerNorm(x, axis=1, name="ln1"), mx.sym.InstanceNorm(x, name="in"),
            mx.sym.BatchNorm(x, fix_gamma=True, name="bn_fixed"), mx.sym.BatchNorm(x, fix_gamma=False, name="bn")]
    outs += [mx.sym.L2Normalization(x, mode=m) for m in ("instance", "channel", "spatial")]
    return mx.sym.Group(outs), (2, 3, 4, 5)


def _resampling():
    x = _var()
    up = mx.sym.UpSampling(x, scale=2, sample_type="nearest")
    padded = mx.sym.Pad(x, mode="constant", pad_width=(0, 0, 0, 0, 1, 2, 2, 1), constant_value=0.5)
    edge = mx.sym.Pad(x, mode="edge", pad_width=(0, 0, 0, 0, 1, 1, 1, 1))
    reflect = mx.sym.Pad(x, mode="reflect", pad_width=(0, 0, 0, 0, 2, 1, 1, 2))
    return mx.sym.Group([up, padded, edge, reflect, mx.sym.Flatten(x)]), (1, 2, 4, 5)


def _embedding_dense():
    tokens = _var()
    emb = mx.sym.Embedding(tokens, input_dim=7, output_dim=4, name="emb")
    dense = mx.sym.FullyConnected(emb, num_hidden=3, flatten=False, name="dense")
    flat = mx.sym.FullyConnected(emb, num_hidden=2, no_bias=True, name="flat")
    return mx.sym.Group([dense, flat]), (2, 5)


def _tensor_ops():
    x, y = _var(), _var("other")
    halves = mx.sym.split(x, num_outputs=2, axis=1)
    rows = mx.sym.split(x, num_outputs=4, axis=0, squeeze_axis=True)
    outs = [halves[1], rows[2], mx.sym.stack(rows[0], rows[3], axis=1), mx.sym.dot(x, y, transpose_b=True),
            mx.sym.batch_dot(mx.sym.reshape(x, (2, 4, 3)), mx.sym.reshape(y, (2, 3, 4))),
            mx.sym.where(x > 0, x, y), mx.sym.Cast(x * 3, dtype="int32"), mx.sym.argmax(x, axis=1),
            mx.sym.broadcast_to(mx.sym.sum(x, axis=0, keepdims=True), shape=(3, 0)),
            mx.sym.broadcast_axis(mx.sym.mean(x, axis=1, keepdims=True), axis=1, size=5),
            mx.sym.tile(x, reps=(2, 1)), mx.sym.reverse(x, axis=1), mx.sym.SwapAxis(x, dim1=0, dim2=1),
            mx.sym.zeros_like(x) + mx.sym.ones_like(y), mx.sym.norm(x, axis=1)]
    return mx.sym.Group(outs), {"data": (4, 6), "other": (4, 6)}


def _image_ops():
    x = _var()
    outs = [mx.sym.LRN(x, nsize=3, alpha=0.01, beta=0.75, knorm=2), mx.sym.depth_to_space(x, block_size=2),
            mx.sym.space_to_depth(mx.sym.depth_to_space(x, block_size=2), block_size=2),
            mx.sym.Pooling(x, kernel=(3, 3), stride=(2, 2), pool_type="avg", pooling_convention="full"),
            mx.sym.Pooling(x, global_pool=True, kernel=(1, 1), pool_type="sum"),
            mx.sym.SoftmaxOutput(x, multi_output=True, name="multi"),
            mx.sym.SoftmaxOutput(x, preserve_shape=True, name="preserve")]
    return mx.sym.Group(outs), (2, 4, 7, 6)


LAYER_GRAPHS = {f.__name__[1:]: f for f in (_conv_net, _deconv_target_shape, _activations, _pooling, _reshapes,
                                            _reductions_and_softmax, _arithmetic, _normalizations, _resampling,
                                            _embedding_dense, _tensor_ops, _image_ops)}


def _random_params(sym, shapes, rng):
    arg_shapes, _, aux_shapes = sym.infer_shape(**shapes)
    params = {}
    for name, shape in zip(sym.list_arguments(), arg_shapes):
        if name not in shapes and not name.endswith("_label"):
            params[name] = mx.nd.array(rng.uniform(-1, 1, shape))
    for name, shape in zip(sym.list_auxiliary_states(), aux_shapes):
        params[name] = mx.nd.array(rng.uniform(0.5, 1.5, shape) if name.endswith("var") else rng.uniform(-1, 1, shape))
    return params


def _layer_case(name):
    sym, shapes = LAYER_GRAPHS[name]()
    shapes = shapes if isinstance(shapes, dict) else {"data": shapes}
    rng = np.random.RandomState(5)
    params = _random_params(sym, shapes, rng)
    feeds = {k: rng.uniform(-2, 2, s).astype(np.float32) for k, s in shapes.items()}
    if name == "embedding_dense":
        feeds["data"] = rng.randint(0, 7, shapes["data"]).astype(np.float32)
    args = dict(params, **{k: mx.nd.array(v) for k, v in feeds.items()})
    aux_names = set(sym.list_auxiliary_states())
    exe = sym.simple_bind(mx.cpu(), grad_req="null", **shapes)
    exe.copy_params_from({k: v for k, v in args.items() if k not in aux_names},
                         {k: v for k, v in args.items() if k in aux_names}, allow_extra_params=True)
    expected = [o.asnumpy() for o in exe.forward(is_train=False)]
    return sym, params, shapes, feeds, expected


@needs_onnx
@pytest.mark.parametrize("opset", [12, 13])
@pytest.mark.parametrize("name", sorted(LAYER_GRAPHS))
def test_layer_exports_and_imports(name, opset, tmp_path):
    sym, params, shapes, feeds, expected = _layer_case(name)
    path = mx.onnx.export_model(sym, params, list(shapes.values()), onnx_file_path=str(tmp_path / "m.onnx"),
                                opset_version=opset)
    assert onnx.load(path).opset_import[0].version == opset
    _check_round_trip(path, feeds, expected)


@needs_onnx
def test_reshape_codes_follow_the_input_when_dynamic(tmp_path):
    sym, params, shapes, feeds, _ = _layer_case("reshapes")
    path = mx.onnx.export_model(sym, params, list(shapes.values()), onnx_file_path=str(tmp_path / "m.onnx"),
                                dynamic=True)
    other = np.random.RandomState(2).uniform(-1, 1, (3, 6, 3, 5)).astype(np.float32)
    expected = [o.asnumpy() for o in sym.eval(ctx=mx.cpu(), data=mx.nd.array(other))]
    _assert_outputs_match(_run_onnxruntime(path, {"data": other}), expected)


# ---------------------------------------------------------------------------------------------- API

@needs_onnx
def test_params_forms_and_former_argument_names(fixtures_dir, tmp_path):
    sym = mx.sym.load(str(fixtures_dir / "resblock-symbol.json"))
    saved = mx.nd.load(str(fixtures_dir / "resblock-0000.params"))
    args = {k[4:]: v for k, v in saved.items() if k.startswith("arg:")}
    aux = {k[4:]: v for k, v in saved.items() if k.startswith("aux:")}
    io = mx.nd.load(str(fixtures_dir / "resblock-io.params"))
    feeds = {"data": io["data"].asnumpy()}
    for i, params in enumerate([saved, [args, aux], dict(args, **aux)]):
        path = mx.onnx.export_model(sym, params, input_shape=[(2, 3, 12, 12)], input_type=[np.float32],
                                    onnx_file_path=str(tmp_path / ("m%d.onnx" % i)))
        _assert_outputs_match(_run_onnxruntime(path, feeds), [io["out:0"].asnumpy()], rtol=1e-3, atol=1e-5)


@needs_onnx
def test_contrib_names_metadata_and_gluon_import(fixtures_dir, tmp_path):
    path = mx.contrib.onnx.export_model(str(fixtures_dir / "lenet-symbol.json"),
                                        str(fixtures_dir / "lenet-0000.params"), [(2, 1, 28, 28)],
                                        onnx_file_path=str(tmp_path / "lenet.onnx"), run_shape_inference=True,
                                        verbose=True)
    assert any(info.name == "conv1" for info in onnx.load(path).graph.value_info)
    meta = mx.contrib.onnx.get_model_metadata(path)
    assert meta == {"input_tensor_data": [("data", (2, 1, 28, 28), onnx.TensorProto.FLOAT)],
                    "output_tensor_data": [("softmax", (2, 10))]}
    sym, arg_params, aux_params = mx.contrib.onnx.import_model(path)
    assert sorted(arg_params) == sorted(n for n in sym.list_arguments() if n != "data") and not aux_params
    io = mx.nd.load(str(fixtures_dir / "lenet-io.params"))
    net = mx.contrib.onnx.import_to_gluon(path, mx.cpu())
    np.testing.assert_allclose(net(io["data"]).asnumpy(), io["out:0"].asnumpy(), rtol=1e-3, atol=1e-5)
    assert "Convolution" in mx.onnx.get_operator_support() and "RNN" in mx.onnx.get_operator_support(13)


@needs_onnx
def test_unsupported_operator_is_named(tmp_path):
    sym = mx.sym.GroupNorm(_var(), num_groups=2, name="groups")
    params = {"groups_gamma": mx.nd.ones((2,)), "groups_beta": mx.nd.zeros((2,))}
    with pytest.raises(NotImplementedError, match="GroupNorm.*groups"):
        mx.onnx.export_model(sym, params, [(1, 4, 3, 3)], onnx_file_path=str(tmp_path / "m.onnx"))


@needs_onnx
def test_unsupported_attribute_is_named(tmp_path):
    sym = mx.sym.Pooling(_var(), kernel=(2, 2), pooling_convention="same", name="pool")
    with pytest.raises(NotImplementedError, match="Pooling.*pool.*same"):
        mx.onnx.export_model(sym, {}, [(1, 2, 4, 4)], onnx_file_path=str(tmp_path / "m.onnx"))


@needs_onnx
def test_in_shapes_must_cover_the_inputs(tmp_path):
    with pytest.raises(ValueError, match="data"):
        mx.onnx.export_model(mx.sym.relu(_var()), {}, [], onnx_file_path=str(tmp_path / "m.onnx"))


def test_missing_onnx_names_the_packages(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ImportError, match="pip install onnx onnxruntime"):
        mx.onnx.export_model(mx.sym.relu(_var()), {}, [(1, 2)])
    with pytest.raises(ImportError, match="pip install onnx onnxruntime"):
        mx.contrib.onnx.import_model("missing.onnx")
