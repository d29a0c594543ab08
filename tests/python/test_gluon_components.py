"""Losses against NumPy formulas, optimizers against NumPy re-implementations of MXNet's update
rules, initializers, learning-rate schedules and metrics."""

import math

import numpy as np
import pytest

import oxnet as mx
from oxnet import gluon

RNG = np.random.RandomState(0)
PRED = RNG.uniform(-2, 2, (4, 5)).astype(np.float32)
TARGET = RNG.uniform(-2, 2, (4, 5)).astype(np.float32)
SIGNS = np.sign(RNG.uniform(-1, 1, (4, 5))).astype(np.float32)
CLASSES = np.array([0, 3, 1, 4], np.float32)


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _softplus(x):
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


PROBS = np.exp(_log_softmax(TARGET))
LOSSES = [
    (gluon.loss.L2Loss(), (PRED, TARGET), (0.5 * (PRED - TARGET) ** 2).mean(1)),
    (gluon.loss.L1Loss(), (PRED, TARGET), np.abs(PRED - TARGET).mean(1)),
    (gluon.loss.SoftmaxCrossEntropyLoss(), (PRED, CLASSES), -_log_softmax(PRED)[np.arange(4), CLASSES.astype(int)]),
    (gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False), (PRED, PROBS), -(_log_softmax(PRED) * PROBS).sum(1)),
    (gluon.loss.SigmoidBinaryCrossEntropyLoss(), (PRED, (SIGNS > 0).astype(np.float32)),
     (_softplus(PRED) - PRED * (SIGNS > 0)).mean(1)),
    (gluon.loss.KLDivLoss(from_logits=False), (PRED, PROBS), (PROBS * (np.log(PROBS + 1e-12) - _log_softmax(PRED))).mean(1)),
    (gluon.loss.HuberLoss(rho=1.0), (PRED, TARGET),
     np.where(np.abs(PRED - TARGET) > 1, np.abs(PRED - TARGET) - 0.5, 0.5 * (PRED - TARGET) ** 2).mean(1)),
    (gluon.loss.HingeLoss(), (PRED, SIGNS), np.maximum(0, 1 - PRED * SIGNS).mean(1)),
    (gluon.loss.SquaredHingeLoss(), (PRED, SIGNS), (np.maximum(0, 1 - PRED * SIGNS) ** 2).mean(1)),
    (gluon.loss.LogisticLoss(), (PRED, SIGNS), np.log1p(np.exp(-PRED * SIGNS)).mean(1)),
    (gluon.loss.TripletLoss(), (PRED, TARGET, SIGNS),
     np.maximum(0, ((TARGET - PRED) ** 2 - (SIGNS - PRED) ** 2).sum(1) + 1)),
    (gluon.loss.PoissonNLLLoss(), (PRED, np.abs(TARGET)), np.mean(np.exp(PRED) - np.abs(TARGET) * PRED)),
]


@pytest.mark.parametrize("loss_fn,inputs,expected", LOSSES, ids=[type(l[0]).__name__ for l in LOSSES])
@pytest.mark.parametrize("hybrid", [False, True], ids=["imperative", "hybrid"])
def test_loss_matches_numpy(loss_fn, inputs, expected, hybrid):
    if hybrid:
        loss_fn.hybridize()
    got = loss_fn(*[mx.nd.array(a) for a in inputs]).asnumpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_cosine_embedding_loss():
    a, b = PRED, TARGET
    label = np.array([1, -1, 1, -1], np.float32)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    expected = np.where(label == 1, 1 - cos, np.maximum(0, cos))
    got = gluon.loss.CosineEmbeddingLoss()(mx.nd.array(a), mx.nd.array(b), mx.nd.array(label)).asnumpy()
    assert got.shape == (4, 1)  # MXNet 1.x returns a (batch, 1) column
    np.testing.assert_allclose(got[:, 0], expected, rtol=1e-5, atol=1e-6)


def _numpy_rules():
    """MXNet 1.x's update rules (python/mxnet/optimizer/optimizer.py and the update kernels)."""
    def sgd(w, g, s, t, lr=0.1, wd=0.01, momentum=0.9):
        s = momentum * s - lr * (g + wd * w)
        return w + s, s

    def nag(w, g, s, t, lr=0.1, wd=0.01, momentum=0.9):
        step = lr * (g + wd * w)
        s = momentum * s - step
        return w + momentum * s - step, s

    def adam(w, g, s, t, lr=0.01, wd=0.01, b1=0.9, b2=0.999, eps=1e-8):
        m, v = s
        g = g + wd * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        lr_t = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        return w - lr_t * m / (np.sqrt(v) + eps), (m, v)

    def rmsprop(w, g, s, t, lr=0.01, wd=0.01, g1=0.9, eps=1e-8):
        g = g + wd * w
        n = (1 - g1) * g * g + g1 * s
        return w - lr * g / np.sqrt(n + eps), n

    def adagrad(w, g, s, t, lr=0.1, wd=0.01, eps=1e-7):
        s = s + g * g
        return w - lr * (g / np.sqrt(s + eps) + wd * w), s

    def signum(w, g, s, t, lr=0.01, wd=0.01, momentum=0.9):
        s = momentum * s - (1 - momentum) * (g + wd * w)
        return w + lr * np.sign(s), s

    def ftrl(w, g, s, t, lr=0.1, wd=0.01, lamda1=0.01, beta=1.0):
        z, n = s
        z = z + g - (np.sqrt(n + g * g) - np.sqrt(n)) * w / lr
        n = n + g * g
        w = (np.sign(z) * lamda1 - z) / ((beta + np.sqrt(n)) / lr + wd) * (np.abs(z) > lamda1)
        return w, (z, n)

    zeros = lambda w: np.zeros_like(w)
    pair = lambda w: (np.zeros_like(w), np.zeros_like(w))
    return [
        ("sgd", {"learning_rate": 0.1, "wd": 0.01, "momentum": 0.9}, sgd, zeros),
        ("nag", {"learning_rate": 0.1, "wd": 0.01, "momentum": 0.9}, nag, zeros),
        ("adam", {"learning_rate": 0.01, "wd": 0.01}, adam, pair),
        ("rmsprop", {"learning_rate": 0.01, "wd": 0.01}, rmsprop, zeros),
        ("adagrad", {"learning_rate": 0.1, "wd": 0.01}, adagrad, zeros),
        ("signum", {"learning_rate": 0.01, "wd": 0.01}, signum, zeros),
        ("ftrl", {"learning_rate": 0.1, "wd": 0.01}, ftrl, pair),
    ]


@pytest.mark.parametrize("name,params,rule,init_state", _numpy_rules(), ids=[r[0] for r in _numpy_rules()])
def test_optimizer_matches_numpy_rule(name, params, rule, init_state):
    rng = np.random.RandomState(1)
    w_np = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    optimizer = mx.optimizer.create(name, **params)
    updater = mx.optimizer.get_updater(optimizer)
    weight = mx.nd.array(w_np)
    state = init_state(w_np)
    for t in range(1, 4):
        g = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
        updater(0, mx.nd.array(g), weight)
        w_np, state = rule(w_np, g, state, t)
    np.testing.assert_allclose(weight.asnumpy(), w_np, rtol=1e-4, atol=1e-6)


def test_optimizer_rescale_clip_and_multipliers():
    optimizer = mx.optimizer.SGD(learning_rate=1.0, rescale_grad=0.5, clip_gradient=0.2,
                                 param_idx2name={0: "fc_weight", 1: "fc_bias"})
    optimizer.set_lr_mult({"fc_weight": 0.5})
    weight = mx.nd.zeros((2,))
    optimizer.update(0, weight, mx.nd.array([1.0, -0.1]), None)
    np.testing.assert_allclose(weight.asnumpy(), [-0.1, 0.025], rtol=1e-6)
    with pytest.raises(ValueError, match="Cannot find optimizer"):
        mx.optimizer.create("nope")


def test_adamw_and_lamb_decrease_a_quadratic():
    for name in ("adamw", "lamb"):
        weight = mx.nd.array([3.0, -2.0])
        updater = mx.optimizer.get_updater(mx.optimizer.create(name, learning_rate=0.1, wd=0.01))
        for _ in range(50):
            updater(0, 2 * weight, weight)
        assert float(mx.nd.norm(weight).asscalar()) < 1.0, name


def test_initializers():
    mx.random.seed(0)
    w = mx.nd.zeros((50, 40))
    mx.init.Xavier(magnitude=3)("fc_weight", w)
    bound = math.sqrt(3.0 / 45)
    assert abs(w.asnumpy()).max() <= bound and abs(w.asnumpy()).max() > 0.8 * bound
    b = mx.nd.ones((4,))
    mx.init.Uniform()("fc_bias", b)
    assert (b.asnumpy() == 0).all()
    g = mx.nd.zeros((4,))
    mx.init.Normal()("bn_gamma", g)
    assert (g.asnumpy() == 1).all()
    o = mx.nd.zeros((4, 6))
    mx.init.Orthogonal(scale=1.0)("q_weight", o)
    np.testing.assert_allclose(o.asnumpy() @ o.asnumpy().T, np.eye(4), atol=1e-5)
    c = mx.nd.zeros((2, 2))
    mx.init.Constant(3.0)("c_weight", c)
    assert (c.asnumpy() == 3).all()
    assert mx.init.create(mx.init.Xavier().dumps()).rnd_type == "uniform"
    mixed = mx.init.Mixed([".*bias", ".*"], [mx.init.Zero(), mx.init.One()])
    m = mx.nd.zeros((3,))
    mixed("x_weight", m)
    assert (m.asnumpy() == 1).all()
    with pytest.raises(ValueError, match="Unknown initialization pattern"):
        mx.init.Uniform()("mystery", mx.nd.zeros((2,)))


def test_lr_schedulers():
    f = mx.lr_scheduler.FactorScheduler(step=10, factor=0.5, base_lr=1.0)
    assert [f(n) for n in (1, 11, 21)] == [1.0, 0.5, 0.25]
    m = mx.lr_scheduler.MultiFactorScheduler(step=[5, 8], factor=0.1, base_lr=1.0)
    assert [round(m(n), 6) for n in (1, 6, 9)] == [1.0, 0.1, 0.01]
    p = mx.lr_scheduler.PolyScheduler(max_update=10, base_lr=1.0, pwr=2)
    assert p(5) == pytest.approx(0.25)
    c = mx.lr_scheduler.CosineScheduler(max_update=10, base_lr=1.0, warmup_steps=2, warmup_begin_lr=0.0)
    assert c(1) == pytest.approx(0.5) and c(6) == pytest.approx(0.5)
    opt = mx.optimizer.SGD(learning_rate=1.0, lr_scheduler=mx.lr_scheduler.FactorScheduler(step=1, factor=0.5))
    w = mx.nd.zeros((1,))
    for _ in range(3):
        opt.update(0, w, mx.nd.ones((1,)), None)
    assert w.asscalar() == pytest.approx(-(1.0 + 0.5 + 0.25))


def test_metrics():
    pred = mx.nd.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    label = mx.nd.array([1, 1, 1])
    acc = mx.metric.create("acc")
    acc.update([label], [pred])
    assert acc.get() == ("accuracy", pytest.approx(2 / 3))
    top2 = mx.metric.TopKAccuracy(top_k=2)
    top2.update([mx.nd.array([2, 0])], [mx.nd.array([[0.1, 0.2, 0.7], [0.1, 0.5, 0.4]])])
    assert top2.get()[1] == pytest.approx(0.5)
    ce = mx.metric.CrossEntropy()
    ce.update([label], [pred])
    assert ce.get()[1] == pytest.approx(-np.log([0.9, 0.2, 0.7]).mean(), rel=1e-5)
    ppl = mx.metric.Perplexity(ignore_label=None)
    ppl.update([label], [pred])
    assert ppl.get()[1] == pytest.approx(np.exp(-np.log([0.9, 0.2, 0.7]).mean()), rel=1e-5)
    reg = mx.metric.create(["mae", "mse", "rmse"])
    reg.update([mx.nd.array([1.0, 2.0])], [mx.nd.array([2.0, 4.0])])
    names, values = reg.get()
    assert names == ["mae", "mse", "rmse"] and values == pytest.approx([1.5, 2.5, math.sqrt(2.5)])
    f1 = mx.metric.F1()
    f1.update([mx.nd.array([1, 0, 1, 1])], [mx.nd.array([[0.2, 0.8], [0.6, 0.4], [0.9, 0.1], [0.3, 0.7]])])
    assert f1.get()[1] == pytest.approx(0.8)
    custom = mx.metric.create(lambda l, p: float(np.abs(l - p).sum()))
    custom.update([mx.nd.array([1.0])], [mx.nd.array([3.0])])
    assert custom.get()[1] == 2.0


@pytest.mark.parametrize("name", ["sgd", "nag"])
def test_sgd_aggregated_and_multi_precision_updates_match_one_by_one(name):
    rng = np.random.RandomState(4)
    shapes = [(3, 2), (5,), (2, 2), (4,), (1, 3), (6,)]
    w0 = [rng.randn(*s).astype(np.float32) for s in shapes]
    grads = [[rng.randn(*s).astype(np.float32) for s in shapes] for _ in range(3)]

    def run(aggregate, dtype="float32", multi_precision=False):
        opt = mx.optimizer.create(name, learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5,
                                  multi_precision=multi_precision)
        opt.aggregate_num = aggregate
        opt.set_lr_mult({0: 2.0})
        updater = mx.optimizer.get_updater(opt)
        weights = [mx.nd.array(w, dtype=dtype) for w in w0]
        for step in grads:
            updater(list(range(len(shapes))), [mx.nd.array(g, dtype=dtype) for g in step], weights)
        return [w.asnumpy() for w in weights], updater

    one_by_one, _ = run(0)
    grouped, _ = run(4)
    for a, b in zip(grouped, one_by_one):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    half, updater = run(4, "float16", multi_precision=True)
    for i, (a, b) in enumerate(zip(half, one_by_one)):
        assert a.dtype == np.float16
        # MXNet's SGD-family layout: (momentum, float32 master weight).
        master = updater.states[i][1].asnumpy()
        np.testing.assert_allclose(a, master.astype(np.float16))
        # Float16 gradients are the only difference from the float32 run.
        np.testing.assert_allclose(master, b, rtol=2e-3, atol=2e-3)
