"""Child process of test_amp.py: ``amp.init`` changes the operators of the whole process for good
(as in MXNet), so each check that needs it runs here, ``python amp_worker.py <mode> <dtype>``,
and prints one JSON object for the test to compare.

Modes:
  dtypes DTYPE: the dtypes operators give under amp.init(DTYPE), imperative and symbolic.
  scaling: dynamic loss scaling of a small Dense model under bfloat16 AMP (overflowing step
    skipped, scale halved, clean step applied with the gradient unscaled, amp.unscale).
  digits DTYPE EPOCHS: test accuracy of the digits CNN of examples/train_digits.py trained for
    EPOCHS epochs, under amp.init(DTYPE) and its loss scaling, or in float32 for 'float32'.
"""

import importlib.util
import json
import pathlib
import sys

import numpy as np

import oxnet as mx
from oxnet import autograd, gluon
from oxnet.contrib import amp

nd = mx.nd
REPO = pathlib.Path(__file__).resolve().parents[2]


def _name(dtype):
    return "bfloat16" if dtype == mx.base.bfloat16 else np.dtype(dtype).name


def dtypes(target):
    amp.init(target_dtype=target)
    rng = np.random.RandomState(0)
    x = nd.array(rng.uniform(-1, 1, (2, 3, 6, 6)))
    conv = nd.Convolution(x, nd.array(rng.uniform(-1, 1, (4, 3, 3, 3))), nd.zeros((4,)), kernel=(3, 3), num_filter=4)
    pooled = nd.Pooling(conv, kernel=(2, 2), pool_type="max")
    flat = nd.Flatten(pooled)
    fc = nd.FullyConnected(flat, nd.ones((5, flat.shape[1])), nd.zeros((5,)), num_hidden=5)
    dense = gluon.nn.Dense(3)
    dense.initialize()
    results = {
        "conv": conv, "relu": nd.relu(conv), "activation_relu": nd.Activation(conv, act_type="relu"),
        "activation_softrelu": nd.Activation(conv, act_type="softrelu"), "pool": pooled, "flatten": flat, "fc": fc,
        "exp": nd.exp(fc), "log_softmax": nd.log_softmax(fc), "sum": nd.sum(fc), "fluent_exp": fc.exp(),
        "elemwise_add_fp32": nd.elemwise_add(fc, nd.ones(fc.shape)), "plus_fp32": fc + nd.ones(fc.shape),
        "plus_same": fc + fc, "times_scalar": fc * 2, "concat": nd.concat(fc, fc, dim=1),
        "batchnorm": nd.BatchNorm(conv, nd.ones(4), nd.zeros(4), nd.zeros(4), nd.ones(4)),
        "gluon_dense": dense(nd.ones((2, 4))),
    }
    report = {key: _name(value.dtype) for key, value in results.items()}
    s = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3, name="fc1")
    s = mx.sym.Activation(s, act_type="relu", name="r1")
    s = mx.sym.exp(s, name="e1") + s
    nodes = json.loads(s.tojson(remove_amp_cast=False))["nodes"]
    report["symbol"] = [[n["op"], n["name"], n.get("attrs", {}).get("dtype", ""), [i[:2] for i in n["inputs"]]]
                        for n in nodes]
    return report


def scaling():
    amp.init(target_dtype="bfloat16")
    net = gluon.nn.Dense(2, in_units=3)
    net.initialize(mx.init.Constant(0.5))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer)
    scaler = trainer._amp_loss_scaler
    x = nd.array([[1.0, 2.0, 3.0]])
    report = {"initial_scale": scaler.loss_scale}

    def step(poison):
        with autograd.record():
            loss = net(x).astype("float32").sum() * poison
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(1)
        return net.weight.data().asnumpy().tolist()

    before = net.weight.data().asnumpy().tolist()
    report["after_overflow"] = step(float("inf"))
    report["weight_before"] = before
    report["scale_after_overflow"] = scaler.loss_scale
    report["after_clean"] = step(1.0)
    report["scale_after_clean"] = scaler.loss_scale
    with autograd.record():
        loss = net(x).astype("float32").sum()
        with amp.scale_loss(loss, trainer) as scaled:
            autograd.backward(scaled)
    report["scaled_grad"] = net.weight.grad().asnumpy().tolist()
    amp.unscale(trainer)
    report["unscaled_grad"] = net.weight.grad().asnumpy().tolist()
    report["scale_after_unscale"] = trainer._scale
    return report


def digits(target, epochs):
    spec = importlib.util.spec_from_file_location("train_digits", REPO / "examples" / "train_digits.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    use_amp = target != "float32"
    if use_amp:
        amp.init(target_dtype=target)
    mx.random.seed(42)
    np.random.seed(42)
    (train_x, train_y), (test_x, test_y) = example.load_digits(42)
    train = gluon.data.DataLoader(gluon.data.ArrayDataset(nd.array(train_x), nd.array(train_y)), batch_size=64,
                                  shuffle=True)
    net = example.build_net()
    net.initialize(mx.init.Xavier(magnitude=2.24))
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.002})
    if use_amp:
        amp.init_trainer(trainer)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(epochs):
        for data, label in train:
            with autograd.record():
                loss = loss_fn(net(data), label)
                if use_amp:
                    with amp.scale_loss(loss, trainer) as scaled:
                        autograd.backward(scaled)
                else:
                    loss.backward()
            trainer.step(data.shape[0])
    output = net(nd.array(test_x))
    predictions = output.astype("float32").asnumpy().argmax(1)
    return {"accuracy": float((predictions == test_y).mean()), "output_dtype": _name(output.dtype)}


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "dtypes":
        result = dtypes(sys.argv[2])
    elif mode == "scaling":
        result = scaling()
    else:
        result = digits(sys.argv[2], int(sys.argv[3]))
    print(json.dumps(result))
