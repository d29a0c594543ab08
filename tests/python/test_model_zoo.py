"""gluon.model_zoo.vision: MXNet 1.9.1's architectures with its parameter names, so that its saved
parameters load and give its outputs; gluon.contrib.nn's Concurrent, HybridConcurrent and Identity.

The MXNet comparisons need an interpreter with MXNet 1.9.1 (OXNET_MXNET_PYTHON, default
~/venvs/mxnet/bin/python) and skip, saying so, without one."""

import json
import os
import subprocess

import numpy as np
import pytest

import oxnet as mx
from oxnet import autograd, gluon
from oxnet.gluon import nn
from oxnet.gluon.contrib.nn import Concurrent, HybridConcurrent, Identity
from oxnet.gluon.model_zoo import vision

MXNET_PYTHON = os.environ.get("OXNET_MXNET_PYTHON", os.path.expanduser("~/venvs/mxnet/bin/python"))

# (parameter arrays, trainable elements) of each model with 1000 classes, as MXNet 1.9.1 builds it;
# the trainable counts are the published ones (ResNet-18 11.69M, VGG-16 138.36M, DenseNet-121 7.98M, ...).
MXNET_PARAM_COUNTS = {
    "resnet18_v1": (102, 11689512), "resnet34_v1": (182, 21797672), "resnet50_v1": (299, 25575912),
    "resnet101_v1": (588, 44589800), "resnet152_v1": (877, 60252648),
    "resnet18_v2": (98, 11687848), "resnet34_v2": (178, 21796008), "resnet50_v2": (259, 25549480),
    "resnet101_v2": (514, 44541608), "resnet152_v2": (769, 60185256),
    "vgg11": (22, 132863336), "vgg13": (26, 133047848), "vgg16": (32, 138357544), "vgg19": (38, 143667240),
    "vgg11_bn": (54, 132868840), "vgg13_bn": (66, 133053736), "vgg16_bn": (84, 138365992),
    "vgg19_bn": (102, 143678248),
    "alexnet": (16, 61100840),
    "densenet121": (606, 7978856), "densenet161": (806, 28681000), "densenet169": (846, 14149480),
    "densenet201": (1006, 20013928),
    "squeezenet1.0": (52, 1248424), "squeezenet1.1": (52, 1235496),
    "inceptionv3": (472, 23834568),
    "mobilenet1.0": (137, 4231976), "mobilenet0.75": (137, 2585560), "mobilenet0.5": (137, 1331592),
    "mobilenet0.25": (137, 470072),
    "mobilenetv2_1.0": (266, 3504960), "mobilenetv2_0.75": (266, 2627592), "mobilenetv2_0.5": (266, 1964736),
    "mobilenetv2_0.25": (266, 1516392),
}
MODEL_NAMES = sorted(MXNET_PARAM_COUNTS)


def _input_size(name):
    """The size each model is built for: the fixed final pools of SqueezeNet, DenseNet and Inception
    need full-size images, the others run on small ones."""
    if name == "inceptionv3":
        return 299
    if name.startswith(("squeezenet", "densenet")):
        return 224
    return 64 if name == "alexnet" else 32


def _build(name, **kwargs):
    """The model under fresh name counters, so its prefix is MXNet's first one (resnetv10_, ...)."""
    with mx.name.NameManager():
        return vision.get_model(name, **kwargs)


def _shapes_after_inference(net, size):
    net.infer_shape(mx.nd.zeros((1, 3, size, size)))
    return {name: param.shape for name, param in net.collect_params().items()}


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_has_mxnets_parameter_count(name):
    net = _build(name)
    shapes = _shapes_after_inference(net, 299 if name == "inceptionv3" else 224)
    trainable = sum(int(np.prod(shapes[n])) for n, p in net.collect_params().items() if p.grad_req != "null")
    assert (len(shapes), trainable) == MXNET_PARAM_COUNTS[name]


def test_resnet18_v1_parameter_names_and_shapes():
    net = _build("resnet18_v1", classes=10)
    shapes = _shapes_after_inference(net, 32)
    names = list(shapes)
    assert names[:6] == ["resnetv10_conv0_weight", "resnetv10_batchnorm0_gamma", "resnetv10_batchnorm0_beta",
                         "resnetv10_batchnorm0_running_mean", "resnetv10_batchnorm0_running_var",
                         "resnetv10_stage1_conv0_weight"]
    assert names[-2:] == ["resnetv10_dense0_weight", "resnetv10_dense0_bias"]
    assert shapes["resnetv10_stage2_conv2_weight"] == (128, 64, 1, 1)  # the stage's downsampling projection
    assert shapes["resnetv10_stage4_batchnorm4_running_var"] == (512,)
    assert shapes["resnetv10_dense0_weight"] == (10, 512)
    assert "features.5.0.downsample.0.weight" in net._collect_params_with_prefix()


def test_bottleneck_v1_keeps_its_1x1_biases_as_mxnet():
    shapes = _shapes_after_inference(_build("resnet50_v1", classes=10), 32)
    assert shapes["resnetv10_stage1_conv0_bias"] == (64,)
    assert shapes["resnetv10_stage1_conv2_bias"] == (256,)
    assert "resnetv10_stage1_conv1_bias" not in shapes


def test_get_model_names_and_errors():
    assert isinstance(vision.get_model("ResNet18_V1"), vision.ResNetV1)
    assert isinstance(vision.get_model("mobilenetv2_0.25"), vision.MobileNetV2)
    assert isinstance(vision.squeezenet1_1(), vision.SqueezeNet)
    assert isinstance(vision.get_resnet(2, 50).features[5][0], vision.BottleneckV2)
    assert isinstance(vision.get_vgg(11, batch_norm=True).features[1], nn.BatchNorm)
    with pytest.raises(ValueError, match="resnet18_v1"):
        vision.get_model("resnet19_v1")
    with pytest.raises(ValueError, match="version"):
        vision.get_resnet(3, 18)
    with pytest.raises(ValueError, match="Options are"):
        vision.densenet.get_densenet(100)


@pytest.mark.parametrize("name", ["resnet18_v1", "vgg16_bn", "mobilenet0.5", "mobilenetv2_1.0", "densenet121",
                                  "squeezenet1.0", "alexnet", "inceptionv3"])
def test_pretrained_weights_are_refused_with_how_to_load_them(name):
    with pytest.raises(ValueError, match="not shipped.*load_parameters"):
        vision.get_model(name, pretrained=True)


def _randomize_norm_stats(net, seed):
    """BatchNorm statistics away from their 0/1 initial values, so inference really normalizes."""
    rng = np.random.RandomState(seed)
    for name, param in net.collect_params().items():
        if name.endswith(("_gamma", "_running_var")):
            param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, param.shape)))
        elif name.endswith(("_beta", "_running_mean")):
            param.set_data(mx.nd.array(rng.uniform(-0.5, 0.5, param.shape)))


@pytest.mark.parametrize("name", ["resnet18_v2", "resnet50_v1", "vgg11_bn", "alexnet", "mobilenet0.25",
                                  "mobilenetv2_0.25", "squeezenet1.0", "densenet121", "inceptionv3"])
def test_hybridized_output_equals_imperative(name):
    net = _build(name, classes=10)
    net.initialize(mx.init.Xavier())
    size = _input_size(name)
    x = mx.nd.random.uniform(-1, 1, shape=(2, 3, size, size))
    net(x)
    _randomize_norm_stats(net, 0)
    imperative = net(x).asnumpy()
    net.hybridize()
    hybridized = net(x).asnumpy()
    assert imperative.shape == (2, 10)
    assert np.all(np.isfinite(imperative)) and imperative.std() > 0
    np.testing.assert_allclose(hybridized, imperative, rtol=1e-5, atol=1e-6)


def test_resnet_backward_and_sgd_step():
    net = _build("resnet18_v1", classes=10, thumbnail=True)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x = mx.nd.random.uniform(-1, 1, shape=(4, 3, 32, 32))
    labels = mx.nd.array([0, 3, 7, 9])
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
    params = net.collect_params()
    losses = []
    for step in range(3):
        with autograd.record():
            loss = loss_fn(net(x), labels)
        loss.backward()
        losses.append(float(loss.mean().asscalar()))
        if step == 0:
            before = {n: p.data().asnumpy().copy() for n, p in params.items() if p.grad_req != "null"}
            grads = {n: params[n].grad().asnumpy().copy() for n in before}
        trainer.step(4)
        if step == 0:
            for n in before:
                np.testing.assert_allclose(params[n].data().asnumpy(), before[n] - 0.05 * grads[n] / 4,
                                           rtol=1e-5, atol=1e-7)
    assert all(np.abs(g).sum() > 0 for g in grads.values())
    assert np.abs(params["resnetv10_stage1_batchnorm0_running_mean"].data().asnumpy()).sum() > 0
    assert losses[2] < losses[0]


def test_hybrid_concurrent_concatenates_children_along_axis():
    first, second = nn.Dense(3, in_units=4, prefix="a_"), nn.Dense(2, in_units=4, prefix="b_")
    block = HybridConcurrent(axis=1, prefix="cat_")
    block.add(first, Identity(), second)
    block.initialize(mx.init.Uniform())
    x = mx.nd.random.uniform(shape=(5, 4))
    expected = np.concatenate([first(x).asnumpy(), x.asnumpy(), second(x).asnumpy()], axis=1)
    np.testing.assert_allclose(block(x).asnumpy(), expected, rtol=1e-6)
    block.hybridize()
    np.testing.assert_allclose(block(x).asnumpy(), expected, rtol=1e-6)
    assert block.axis == 1 and len(block) == 3


def test_concurrent_and_identity():
    block = Concurrent(axis=0)
    block.add(nn.Dense(2, in_units=2, use_bias=False, weight_initializer=mx.init.One()), Identity())
    block.initialize()
    x = mx.nd.array([[1.0, 2.0]])
    np.testing.assert_allclose(block(x).asnumpy(), [[3.0, 3.0], [1.0, 2.0]])
    identity = Identity()
    identity.hybridize()
    np.testing.assert_allclose(identity(x).asnumpy(), x.asnumpy())


# ---- against MXNet 1.9.1 ------------------------------------------------------------------------

# Models whose outputs MXNet computes, with their input size and whether a training pass (batch
# statistics, gradients, running-statistic updates) is compared too; models with Dropout are compared
# in inference mode only.
MXNET_OUTPUT_CASES = [("resnet18_v1", 64, True), ("resnet50_v2", 64, True), ("vgg11_bn", 32, False),
                      ("alexnet", 64, False), ("mobilenet0.25", 64, True), ("mobilenetv2_0.25", 64, True),
                      ("squeezenet1.1", 224, False), ("densenet121", 224, True), ("inceptionv3", 299, False)]

MXNET_REFERENCE = r"""
import json, sys
import numpy as np
import mxnet as mx
from mxnet.gluon.model_zoo import vision

out_dir, cases, names = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])

shapes = {}
for name, kwargs, size in names:
    with mx.name.NameManager():
        net = vision.get_model(name, classes=10, **kwargs)
    net.infer_shape(mx.nd.zeros((1, 3, size, size)))
    shapes[name + json.dumps(kwargs, sort_keys=True)] = {
        "params": [[k, list(p.shape)] for k, p in net.collect_params().items()],
        "structural": sorted(net._collect_params_with_prefix())}
json.dump(shapes, open(out_dir + "/shapes.json", "w"))

for index, (name, size, train) in enumerate(cases):
    mx.random.seed(index)
    rng = np.random.RandomState(index)
    with mx.name.NameManager():
        net = vision.get_model(name, classes=10)
    net.initialize(mx.init.Xavier())
    x = mx.nd.array(rng.uniform(-1, 1, (2, 3, size, size)))
    net(x)
    for key, param in net.collect_params().items():
        if key.endswith(("_gamma", "_running_var")):
            param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, param.shape)))
        elif key.endswith(("_beta", "_running_mean")):
            param.set_data(mx.nd.array(rng.uniform(-0.5, 0.5, param.shape)))
    net.save_parameters("%s/%s.params" % (out_dir, name))
    net.collect_params().save("%s/%s-full-names.params" % (out_dir, name), strip_prefix=net.prefix)
    results = {"data": x, "inference": net(x)}
    if train:
        net.cast("float64")
        with mx.autograd.record():
            results["train"] = net(x.astype("float64"))
        # MXNet 1.9.1 on CPU updates the running statistics in BatchNorm's backward pass.
        results["train"].backward()
        net.save_parameters("%s/%s-after-train.params" % (out_dir, name))
        mx.nd.save("%s/%s-grads.params" % (out_dir, name),
                   {k: p.grad() for k, p in net._collect_params_with_prefix().items() if p.grad_req != "null"})
    mx.nd.save("%s/%s-io.params" % (out_dir, name), results)
"""

# Models (with extra constructor arguments and input size) whose parameter names and shapes are
# compared with MXNet's: every name get_model knows, plus the ResNet thumbnail stems.
MXNET_SHAPE_CASES = ([(name, {}, 299 if name == "inceptionv3" else 224) for name in MODEL_NAMES]
                     + [("resnet18_v1", {"thumbnail": True}, 32), ("resnet50_v2", {"thumbnail": True}, 32)])


@pytest.fixture(scope="module")
def mxnet_reference(tmp_path_factory):
    """Directory of MXNet's shapes.json and, per MXNET_OUTPUT_CASES model, its saved parameters and outputs."""
    if not os.path.exists(MXNET_PYTHON) or subprocess.run([MXNET_PYTHON, "-c", "import mxnet"],
                                                          capture_output=True).returncode != 0:
        pytest.skip("no MXNet 1.9.1 interpreter (set OXNET_MXNET_PYTHON)")
    out_dir = tmp_path_factory.mktemp("mxnet_model_zoo")
    result = subprocess.run([MXNET_PYTHON, "-c", MXNET_REFERENCE, str(out_dir), json.dumps(MXNET_OUTPUT_CASES),
                             json.dumps(MXNET_SHAPE_CASES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return out_dir


def test_parameter_names_shapes_and_order_match_mxnet(mxnet_reference):
    reference = json.load(open(mxnet_reference / "shapes.json"))
    for name, kwargs, size in MXNET_SHAPE_CASES:
        expected = reference[name + json.dumps(kwargs, sort_keys=True)]
        net = _build(name, classes=10, **kwargs)
        shapes = _shapes_after_inference(net, size)
        assert [[k, list(s)] for k, s in shapes.items()] == expected["params"], name
        assert sorted(net._collect_params_with_prefix()) == expected["structural"], name


@pytest.mark.parametrize("name,size,train", MXNET_OUTPUT_CASES, ids=[c[0] for c in MXNET_OUTPUT_CASES])
def test_mxnet_parameters_reproduce_mxnet_outputs(mxnet_reference, name, size, train):
    io = mx.nd.load(str(mxnet_reference / ("%s-io.params" % name)))
    full_names = mx.nd.load(str(mxnet_reference / ("%s-full-names.params" % name)))
    # Both layouts MXNet's load_parameters reads: structural keys (save_parameters) and the legacy
    # prefix-less full names (ParameterDict.save with strip_prefix, as the old save_params wrote).
    for layout in ("%s.params", "%s-full-names.params"):
        net = _build(name, classes=10)
        net.load_parameters(str(mxnet_reference / (layout % name)))
        np.testing.assert_allclose(net(io["data"]).asnumpy(), io["inference"].asnumpy(), rtol=1e-4, atol=1e-5)
    assert {net.prefix + key for key in full_names} == set(net.collect_params())
    if train:
        # In float64: in float32 a ReLU input within rounding of 0 may flip sides, and the flip
        # changes a deep network's gradients by percents; float64 leaves no such ties.
        net.cast("float64")
        with autograd.record():
            out = net(io["data"].astype("float64"))
        np.testing.assert_allclose(out.asnumpy(), io["train"].asnumpy(), rtol=1e-9, atol=1e-12)
        out.backward()
        own = net._collect_params_with_prefix()
        for key, grad in mx.nd.load(str(mxnet_reference / ("%s-grads.params" % name))).items():
            np.testing.assert_allclose(own[key].grad().asnumpy(), grad.asnumpy(), rtol=1e-7, atol=1e-9,
                                       err_msg=key)
        # MXNet 1.9.1 on CPU updates running statistics in BatchNorm's backward pass, which never runs
        # for a BatchNorm with nothing to differentiate (ResNetV2's input normalization), while oxnet
        # updates them in the forward pass; so only BatchNorms with a learned gamma are compared.
        # The tolerance is loose because MXNet keeps the momentum as a float32, 0.9 + 2.4e-8.
        for key, value in mx.nd.load(str(mxnet_reference / ("%s-after-train.params" % name))).items():
            layer, _, stat = key.rpartition(".")
            if stat in ("running_mean", "running_var") and own[layer + ".gamma"].grad_req != "null":
                np.testing.assert_allclose(own[key].data().asnumpy(), value.asnumpy(), rtol=1e-6, atol=1e-6,
                                           err_msg=key)
