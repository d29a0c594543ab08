"""Graphs and parameters oxnet saves load in Apache MXNet 1.9.1 and give the same outputs.

Needs an interpreter with MXNet 1.9.1: set OXNET_MXNET_PYTHON (default ~/venvs/mxnet/bin/python);
the test skips, saying so, where none exists (CI machines have none)."""

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

import oxnet as mx
from oxnet import gluon
from oxnet.gluon import nn

MXNET_PYTHON = os.environ.get("OXNET_MXNET_PYTHON", os.path.expanduser("~/venvs/mxnet/bin/python"))

LOADER = r"""
import json, sys
import mxnet as mx
prefix, out = sys.argv[1], sys.argv[2]
sym = mx.sym.load(prefix + "-symbol.json")
params = mx.nd.load(prefix + "-0000.params")
io = mx.nd.load(prefix + "-io.params")
args = {k[4:]: v for k, v in params.items() if k.startswith("arg:")}
aux = {k[4:]: v for k, v in params.items() if k.startswith("aux:")}
args["data"] = io["data"]
exe = sym.bind(mx.cpu(), args, aux_states=aux, grad_req="null")
mx.nd.save(out, {"out:0": exe.forward(is_train=False)[0]})
"""


def _mxnet_available():
    if not os.path.exists(MXNET_PYTHON):
        return False
    return subprocess.run([MXNET_PYTHON, "-c", "import mxnet"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _mxnet_available(), reason="no MXNet 1.9.1 interpreter (set OXNET_MXNET_PYTHON)")


def _models():
    mlp = nn.HybridSequential(prefix="mlp_")
    with mlp.name_scope():
        mlp.add(nn.Dense(16, activation="relu"), nn.BatchNorm(), nn.Dropout(0.5), nn.Dense(4))
    cnn = nn.HybridSequential(prefix="cnn_")
    with cnn.name_scope():
        cnn.add(nn.Conv2D(6, 3, padding=1, activation="tanh"), nn.MaxPool2D(), nn.Conv2D(8, 3),
                nn.GlobalAvgPool2D(), nn.Flatten(), nn.Dense(3))
    return [("mlp", mlp, (5, 10)), ("cnn", cnn, (2, 3, 12, 12))]


@pytest.mark.parametrize("name,net,shape", _models(), ids=[m[0] for m in _models()])
def test_exported_models_run_in_mxnet(tmp_path, name, net, shape):
    net.initialize(mx.init.Xavier())
    net.hybridize()
    data = mx.nd.random.uniform(shape=shape)
    expected = net(data).asnumpy()
    prefix = str(tmp_path / name)
    net.export(prefix)
    mx.nd.save(prefix + "-io.params", {"data": data})
    result = subprocess.run([MXNET_PYTHON, "-c", LOADER, prefix, prefix + "-mx.params"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    got = mx.nd.load(prefix + "-mx.params")["out:0"].asnumpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert json.load(open(prefix + "-symbol.json"))["attrs"]["mxnet_version"] == ["int", 10901]
