"""Automatic mixed precision (mx.contrib.amp) as MXNet 1.9.1 does it.

The expected graphs, dtypes and loss-scale sequences below are what MXNet 1.9.1 gives for the
same calls. ``amp.init`` changes the operators of the whole process for good, so the checks
that need it run in a child process (amp_worker.py); the graph conversions need no init.
"""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import oxnet as mx
from oxnet.contrib import amp
from oxnet.contrib.amp.loss_scaler import LossScaler
from oxnet.gluon import nn
from oxnet.test_utils import assert_almost_equal, same_symbol_structure

WORKER = pathlib.Path(__file__).with_name("amp_worker.py")
bfloat16 = mx.base.bfloat16


def _worker(*args, timeout=120):
    proc = subprocess.run([sys.executable, str(WORKER)] + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _nodes(sym):
    """(op, name, cast dtype, [(input node, output)]) per node of the graph, casts kept."""
    return [(n["op"], n["name"], n.get("attrs", {}).get("dtype", ""), [tuple(i[:2]) for i in n["inputs"]])
            for n in json.loads(sym.tojson(remove_amp_cast=False))["nodes"]]


def _cnn():
    data = mx.sym.var("data")
    net = mx.sym.Convolution(data, kernel=(3, 3), num_filter=4, name="conv0")
    net = mx.sym.BatchNorm(net, name="bn0")
    net = mx.sym.Activation(net, act_type="relu", name="relu0")
    net = mx.sym.Pooling(net, kernel=(2, 2), pool_type="max", name="pool0")
    net = mx.sym.flatten(net, name="flat0")
    fc = mx.sym.FullyConnected(net, num_hidden=3, name="fc0")
    net = mx.sym.elemwise_add(fc, mx.sym.exp(fc, name="exp0"), name="add0")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def _cnn_params(rng):
    args = {"conv0_weight": rng.uniform(-0.5, 0.5, (4, 1, 3, 3)), "conv0_bias": rng.uniform(-0.1, 0.1, (4,)),
            "bn0_gamma": rng.uniform(0.5, 1.5, (4,)), "bn0_beta": rng.uniform(-0.1, 0.1, (4,)),
            "fc0_weight": rng.uniform(-0.3, 0.3, (3, 100)), "fc0_bias": rng.uniform(-0.1, 0.1, (3,))}
    aux = {"bn0_moving_mean": rng.uniform(-0.1, 0.1, (4,)), "bn0_moving_var": rng.uniform(0.5, 1.5, (4,))}
    to_nd = lambda d: {k: mx.nd.array(v) for k, v in d.items()}  # noqa: E731
    return to_nd(args), to_nd(aux)


# The graph MXNet 1.9.1's convert_symbol makes of _cnn() for bfloat16.
BF16_CNN = [
    ("null", "data", "", []), ("amp_cast", "data_amp_cast_bfloat16", "bfloat16", [(0, 0)]),
    ("null", "conv0_weight", "", []), ("amp_cast", "conv0_weight_amp_cast_bfloat16", "bfloat16", [(2, 0)]),
    ("null", "conv0_bias", "", []), ("amp_cast", "conv0_bias_amp_cast_bfloat16", "bfloat16", [(4, 0)]),
    ("Convolution", "conv0", "", [(1, 0), (3, 0), (5, 0)]),
    ("null", "bn0_gamma", "", []), ("null", "bn0_beta", "", []), ("null", "bn0_moving_mean", "", []),
    ("null", "bn0_moving_var", "", []), ("BatchNorm", "bn0", "", [(6, 0), (7, 0), (8, 0), (9, 0), (10, 0)]),
    ("Activation", "relu0", "", [(11, 0)]), ("Pooling", "pool0", "", [(12, 0)]),
    ("amp_cast", "pool0_output_amp_cast_float32", "float32", [(13, 0)]), ("Flatten", "flat0", "", [(14, 0)]),
    ("amp_cast", "flat0_0_amp_cast_bfloat16", "bfloat16", [(15, 0)]),
    ("null", "fc0_weight", "", []), ("amp_cast", "fc0_weight_amp_cast_bfloat16", "bfloat16", [(17, 0)]),
    ("null", "fc0_bias", "", []), ("amp_cast", "fc0_bias_amp_cast_bfloat16", "bfloat16", [(19, 0)]),
    ("FullyConnected", "fc0", "", [(16, 0), (18, 0), (20, 0)]),
    ("amp_cast", "fc0_output_amp_cast_float32", "float32", [(21, 0)]), ("exp", "exp0", "", [(22, 0)]),
    ("elemwise_add", "add0", "", [(22, 0), (23, 0)]), ("null", "softmax_label", "", []),
    ("SoftmaxOutput", "softmax", "", [(24, 0), (25, 0)]),
]


def test_convert_symbol_casts_as_mxnet():
    assert _nodes(amp.convert_symbol(_cnn(), target_dtype="bfloat16")) == BF16_CNN
    # float16 keeps Flatten in float16 (it is dtype-neutral there), so its output needs no cast.
    fp16 = _nodes(amp.convert_symbol(_cnn(), target_dtype="float16"))
    assert [n[1] for n in fp16 if n[0] == "amp_cast"] == [
        "data_amp_cast_float16", "conv0_weight_amp_cast_float16", "conv0_bias_amp_cast_float16",
        "fc0_weight_amp_cast_float16", "fc0_bias_amp_cast_float16", "fc0_output_amp_cast_float32"]
    # Inputs other than the data get the dtype they are read in as __dtype__; with
    # cast_optional_params the parameters of the low-precision operators are not cast at run
    # time but stored in the target dtype (BatchNorm's stay float32).
    data_names = ["data", "softmax_label"]
    for optional, stored in [(False, "0"), (True, "12")]:
        converted = amp.convert_symbol(_cnn(), target_dtype="bfloat16", cast_optional_params=optional,
                                       data_names=data_names)
        casts = [n[1] for n in _nodes(converted) if n[0] == "amp_cast"]
        assert ("conv0_weight_amp_cast_bfloat16" in casts) != optional
        assert [c for c in casts if "conv0" not in c and "fc0_weight" not in c and "fc0_bias" not in c] == [
            "data_amp_cast_bfloat16", "pool0_output_amp_cast_float32", "flat0_0_amp_cast_bfloat16",
            "fc0_output_amp_cast_float32"]
        dtypes = {name: attrs["__dtype__"] for name, attrs in converted.attr_dict().items() if "__dtype__" in attrs}
        assert dtypes == {"conv0_weight": stored, "conv0_bias": stored, "fc0_weight": stored, "fc0_bias": stored,
                          "bn0_gamma": "0", "bn0_beta": "0", "bn0_moving_mean": "0", "bn0_moving_var": "0"}


def test_convert_symbol_widest_and_conditional_ops():
    x, y = mx.sym.var("x"), mx.sym.var("y")
    res = mx.sym.FullyConnected(x, y, num_hidden=10, no_bias=True) + mx.sym.sin(y)
    converted = amp.convert_symbol(res, target_dtype="bfloat16", target_dtype_ops=["FullyConnected"], fp32_ops=["sin"])
    assert [n[0] for n in _nodes(converted)] == ["null", "amp_cast", "null", "amp_cast", "FullyConnected", "amp_cast",
                                                 "sin", "elemwise_add"]
    # A widest-type operator reads an input already cast (x) through that cast, and inputs of
    # unknown dtype (relu's output) through one amp_multicast named after its first input.
    fc = mx.sym.FullyConnected(x, y, num_hidden=4, no_bias=True, name="fc")
    shared = amp.convert_symbol(fc + x, target_dtype="bfloat16", target_dtype_ops=["FullyConnected"], fp32_ops=[])
    assert [(n[0], n[3]) for n in _nodes(shared)][4:] == [("FullyConnected", [(1, 0), (3, 0)]),
                                                         ("elemwise_add", [(4, 0), (1, 0)]), ("amp_cast", [(5, 0)])]
    mixed = amp.convert_symbol(fc + mx.sym.relu(mx.sym.var("z")), target_dtype="bfloat16",
                               target_dtype_ops=["FullyConnected"], fp32_ops=[])
    assert [(n[0], n[3]) for n in _nodes(mixed)][7:9] == [("amp_multicast", [(4, 0), (6, 0)]),
                                                         ("elemwise_add", [(7, 0), (7, 1)])]
    assert _nodes(mixed)[7][1] == "fc_output_amp_multicast"
    fc = mx.sym.FullyConnected(x, y, num_hidden=10, no_bias=True)
    unmet = amp.convert_symbol(fc, target_dtype="bfloat16", target_dtype_ops=[], fp32_ops=["sin"],
                               conditional_fp32_ops=[("FullyConnected", "no_bias", ["False"])])
    assert [n[0] for n in _nodes(unmet)] == ["null", "null", "FullyConnected", "amp_cast"]
    met = amp.convert_symbol(fc, target_dtype="bfloat16", target_dtype_ops=[], fp32_ops=["sin"],
                             conditional_fp32_ops=[("FullyConnected", "no_bias", ["True"])])
    assert [n[1] for n in _nodes(met)] == ["x", "x_amp_cast_float32", "y", "y_amp_cast_float32", "fullyconnected1"]
    expected = mx.sym.FullyConnected(mx.sym.amp_cast(x, dtype="float32"), mx.sym.amp_cast(y, dtype="float32"),
                                     num_hidden=10, no_bias=True)
    assert same_symbol_structure(met, expected)


@pytest.mark.parametrize("kwargs", [
    dict(target_dtype_ops=["FullyConnected"], fp32_ops=["elemwise_add"]),  # widest-type ops are not choosable
    dict(target_dtype_ops=["FullyConnected"], fp32_ops=["Activation"],
         conditional_fp32_ops=[("Activation", "act_type", ["selu"])]),
    dict(target_dtype_ops=["FullyConnected"], fp32_ops=["FullyConnected"]),
    dict(target_dtype_ops="FullyConnected"),
])
def test_convert_symbol_rejects_inconsistent_lists(kwargs):
    res = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=2) + mx.sym.var("y")
    with pytest.raises(AssertionError):
        amp.convert_symbol(res, target_dtype="bfloat16", **kwargs)
    with pytest.raises(AssertionError):
        amp.convert_symbol(res, target_dtype="float64")


def test_numpy_dtypes_are_written_as_mxnet_names():
    """MXNet's bfloat16 stand-in and NumPy types as a dtype parameter, as MXNet's tests pass them."""
    assert mx.sym.amp_cast(mx.sym.var("x"), dtype=bfloat16, name="c").attr_dict()["c"]["dtype"] == "bfloat16"
    assert mx.sym.amp_cast(mx.sym.var("x"), dtype=np.float16, name="h").attr_dict()["h"]["dtype"] == "float16"
    assert mx.nd.amp_cast(mx.nd.ones((2,)), dtype=bfloat16).dtype == bfloat16
    assert mx.nd.amp_cast(mx.nd.ones((2,)), dtype=np.dtype("float16")).dtype == np.float16


def test_cast_optional_params_infers_input_dtypes():
    """MXNet's rules for inputs only casts read (its test_bf16_casting)."""
    data = mx.sym.var("data")
    conflicting = mx.sym.Group([mx.sym.amp_cast(data, dtype=bfloat16), mx.sym.amp_cast(data, dtype="float32")])
    converted = amp.convert_symbol(conflicting, data_names=[], target_dtype="bfloat16", cast_optional_params=True)
    assert converted.simple_bind(ctx=mx.cpu(), data=(1, 2)).arg_arrays[0].dtype == np.float32
    agreeing = mx.sym.Group([mx.sym.amp_cast(data, dtype=bfloat16), mx.sym.amp_cast(data, dtype=bfloat16)])
    converted = amp.convert_symbol(agreeing, data_names=[], target_dtype="bfloat16", cast_optional_params=True)
    assert converted.simple_bind(ctx=mx.cpu(), data=(1, 2)).arg_arrays[0].dtype == bfloat16
    multicast = mx.sym.amp_multicast(mx.sym.var("data", dtype="float32"), mx.sym.var("data2", dtype=bfloat16),
                                     num_outputs=2)
    converted = amp.convert_symbol(multicast, target_dtype="bfloat16", cast_optional_params=True)
    assert converted.simple_bind(ctx=mx.cpu(), data=(1, 2), data2=(1, 2)).arg_arrays[0].dtype == bfloat16


def test_saved_graphs_drop_amp_casts():
    converted = amp.convert_symbol(_cnn(), target_dtype="bfloat16")
    saved = json.loads(converted.tojson())["nodes"]
    # MXNet's RemoveAmpCast: operators read past the casts, the outputs keep theirs (none here).
    assert [n["op"] for n in saved] == [n[0] for n in _nodes(_cnn())]
    assert converted.list_arguments() == mx.sym.load_json(converted.tojson(remove_amp_cast=False)).list_arguments()
    head_cast = amp.convert_symbol(mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=2, name="fc"),
                                   target_dtype="bfloat16")
    assert [n["op"] for n in json.loads(head_cast.tojson())["nodes"]] == ["null", "null", "null", "FullyConnected",
                                                                          "amp_cast"]


@pytest.mark.parametrize("target, cast_optional_params", [("bfloat16", False), ("bfloat16", True), ("float16", False)])
def test_convert_model_runs_close_to_float32(target, cast_optional_params):
    rng = np.random.RandomState(0)
    args, aux = _cnn_params(rng)
    data = mx.nd.array(rng.uniform(0, 1, (5, 1, 8, 8)))
    label = mx.nd.array([0, 1, 2, 0, 1])

    def run(sym, args, aux):
        exe = sym.simple_bind(mx.cpu(), data=data.shape, softmax_label=label.shape, grad_req="null")
        exe.copy_params_from(args, aux)
        return exe.forward(is_train=False, data=data, softmax_label=label)[0]

    expected = run(_cnn(), args, aux)
    sym, args_lp, aux_lp = amp.convert_model(_cnn(), dict(args), dict(aux), target_dtype=target,
                                             cast_optional_params=cast_optional_params)
    low = bfloat16 if target == "bfloat16" else np.float16
    weight_dtype = low if cast_optional_params else np.float32
    assert args_lp["conv0_weight"].dtype == weight_dtype and args_lp["fc0_weight"].dtype == weight_dtype
    assert args_lp["bn0_gamma"].dtype == np.float32 and aux_lp["bn0_moving_var"].dtype == np.float32
    got = run(sym, args_lp, aux_lp)
    assert got.dtype == np.float32
    assert_almost_equal(got.asnumpy(), expected.asnumpy(), rtol=3e-2, atol=3e-2)


def _gluon_cnn():
    net = nn.HybridSequential(prefix="cnn_")
    with net.name_scope():
        net.add(nn.Conv2D(8, kernel_size=3, padding=1, activation="relu"), nn.BatchNorm(), nn.MaxPool2D(),
                nn.Flatten(), nn.Dense(16, activation="relu"), nn.Dense(4))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    return net


def test_convert_hybrid_block_runs_close_to_float32():
    net = _gluon_cnn()
    data = mx.nd.array(np.random.RandomState(1).uniform(0, 1, (6, 1, 8, 8)))
    expected = net(data).asnumpy()
    converted = amp.convert_hybrid_block(net, target_dtype="bfloat16", ctx=mx.cpu())
    out = converted(data)
    assert out.dtype == np.float32
    assert_almost_equal(out.asnumpy(), expected, rtol=5e-2, atol=5e-2)
    params = converted.collect_params()
    assert params["cnn_conv0_weight"].dtype == np.float32
    optional = amp.convert_hybrid_block(net, target_dtype="bfloat16", ctx=mx.cpu(), cast_optional_params=True)
    params = optional.collect_params()
    assert params["cnn_conv0_weight"].dtype == bfloat16 and params["cnn_dense1_weight"].dtype == bfloat16
    assert params["cnn_batchnorm0_gamma"].dtype == np.float32
    assert_almost_equal(optional(data).asnumpy(), expected, rtol=5e-2, atol=5e-2)
    with pytest.raises(RuntimeError, match="hybridize"):
        amp.convert_hybrid_block(nn.Dense(2), target_dtype="bfloat16", ctx=mx.cpu())


class _Param:
    def __init__(self, grad):
        self._grad = [mx.nd.array(grad)]


def test_loss_scaler_halves_on_overflow_and_doubles_after_2000_clean_steps():
    scaler = LossScaler()
    clean, broken = [_Param([1.0, 2.0])], [_Param([1.0, np.inf]), _Param([np.nan])]
    assert scaler.loss_scale == 2.0 ** 16
    assert scaler.has_overflow(broken)
    # As in MXNet, the new scale becomes loss_scale at the next check.
    assert scaler.loss_scale == 2.0 ** 16
    assert not scaler.has_overflow(clean)
    assert scaler.loss_scale == 2.0 ** 15
    for _ in range(1999):
        assert not scaler.has_overflow(clean)
    assert scaler.loss_scale == 2.0 ** 15
    assert not scaler.has_overflow(clean)
    assert scaler.loss_scale == 2.0 ** 16
    # Capped at 2**24.
    scaler._next_loss_scale = 2.0 ** 24
    scaler._unskipped = 1999
    scaler.has_overflow(clean)
    scaler.has_overflow(clean)
    assert scaler.loss_scale == 2.0 ** 24


def test_amp_needs_init_and_a_trainer():
    dense = nn.Dense(2, in_units=2)
    dense.initialize()
    trainer = mx.gluon.Trainer(dense.collect_params(), "sgd")
    with pytest.raises(AssertionError, match="init_trainer"):
        with amp.scale_loss(mx.nd.ones((1,)), trainer):
            pass


def test_lists_name_every_registered_operator_once():
    names = {spelling for name, aliases, *_ in mx._core.list_ops() for spelling in [name, *aliases]
             if not spelling.startswith("_backward")}
    for target in ("float16", "bfloat16"):
        lists = [amp.list_lp16_ops(target), amp.list_lp16_fp32_ops(target), amp.list_fp32_ops(target),
                 amp.list_widest_type_cast(target), [c[0] for c in amp.list_conditional_fp32_ops(target)]]
        listed = [name for names_ in lists for name in names_]
        assert len(listed) == len(set(listed)), "an operator is in two lists"
        assert set(listed) == names
    assert amp.list_lp16_ops("bfloat16") == ["Convolution", "FullyConnected"]
    assert amp.list_lp16_use_fp32_params("float16") is None
    assert amp.list_lp16_use_fp32_params(bfloat16)["BatchNorm"][1:] == ["gamma", "beta", "moving_mean", "moving_var"]


# What MXNet 1.9.1 gives for the calls of amp_worker.dtypes on CPU. float16 AMP on CPU casts only
# float32 and bfloat16 arrays, so the float32 operators leave float16 inputs as they are.
INIT_DTYPES = {
    "bfloat16": {
        "conv": "bfloat16", "relu": "bfloat16", "activation_relu": "bfloat16", "activation_softrelu": "float32",
        "pool": "bfloat16", "flatten": "float32", "fc": "bfloat16", "exp": "float32", "log_softmax": "float32",
        "sum": "float32", "fluent_exp": "float32", "elemwise_add_fp32": "float32", "plus_fp32": "float32",
        "plus_same": "bfloat16", "times_scalar": "float32", "concat": "bfloat16", "batchnorm": "bfloat16",
        "gluon_dense": "bfloat16"},
    "float16": {
        "conv": "float16", "relu": "float16", "activation_relu": "float16", "activation_softrelu": "float16",
        "pool": "float16", "flatten": "float16", "fc": "float16", "exp": "float16", "log_softmax": "float16",
        "sum": "float16", "fluent_exp": "float16", "elemwise_add_fp32": "float32", "plus_fp32": "float32",
        "plus_same": "float16", "times_scalar": "float16", "concat": "float16", "batchnorm": "float16",
        "gluon_dense": "float16"},
}


@pytest.mark.parametrize("target", ["bfloat16", "float16"])
def test_init_casts_operator_inputs_as_mxnet(target):
    report = _worker("dtypes", target)
    symbol = report.pop("symbol")
    assert report == INIT_DTYPES[target]
    assert [tuple(n[:3]) for n in symbol] == [
        ("null", "data", ""), ("amp_cast", "amp_cast0", target), ("null", "fc1_weight", ""),
        ("amp_cast", "amp_cast1", target), ("null", "fc1_bias", ""), ("amp_cast", "amp_cast2", target),
        ("FullyConnected", "fc1", ""), ("Activation", "r1", ""), ("amp_cast", "amp_cast3", "float32"),
        ("exp", "e1", ""), ("amp_multicast", "amp_multicast0", ""), ("elemwise_add", "_plus0", "")]


def test_scale_loss_skips_overflowing_steps():
    report = _worker("scaling")
    assert report["initial_scale"] == 2.0 ** 16
    assert report["after_overflow"] == report["weight_before"]
    assert report["scale_after_overflow"] == 2.0 ** 16
    # The clean step applies the plain gradient (x = [1, 2, 3] for every output), lr 0.1.
    np.testing.assert_allclose(report["after_clean"], [[0.4, 0.3, 0.2]] * 2, rtol=1e-6)
    assert report["scale_after_clean"] == 2.0 ** 15
    np.testing.assert_allclose(report["scaled_grad"], [[v * 2.0 ** 15 for v in (1, 2, 3)]] * 2)
    np.testing.assert_allclose(report["unscaled_grad"], [[1.0, 2.0, 3.0]] * 2)
    assert report["scale_after_unscale"] == 1.0


def test_digits_cnn_trains_under_bfloat16_amp_as_in_float32():
    pytest.importorskip("sklearn")
    reference = _worker("digits", "float32", 10)
    mixed = _worker("digits", "bfloat16", 10)
    assert reference["output_dtype"] == "float32" and mixed["output_dtype"] == "bfloat16"
    assert reference["accuracy"] > 0.96
    assert mixed["accuracy"] > reference["accuracy"] - 0.02, (mixed, reference)
