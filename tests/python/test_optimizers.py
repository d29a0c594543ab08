"""mx.optimizer: each optimizer's step against a NumPy reference of its update rule, the
MXNet 1.x state layouts, multipliers from symbol attributes, and Updater state round trips."""

import math
import pickle

import numpy as np
import pytest

import oxnet as mx


SHAPE = (3, 4)


def _arrays(seed=0, dtype="float32"):
    rng = np.random.RandomState(seed)
    weight = rng.uniform(-1, 1, SHAPE).astype(dtype)
    grads = [rng.uniform(-1, 1, SHAPE).astype(dtype) for _ in range(3)]
    return weight, grads


def _run(opt, weight, grads, dtype="float32"):
    """Three steps of `opt` through an Updater; the final weight as NumPy."""
    updater = mx.optimizer.get_updater(opt)
    w = mx.nd.array(weight, dtype=dtype)
    for g in grads:
        updater(0, mx.nd.array(g, dtype=dtype), w)
    return w.asnumpy(), updater


def _prepared(g, w, rescale, clip, wd=0.0):
    g = g * rescale + wd * w
    return np.clip(g, -clip, clip) if clip is not None else g


@pytest.mark.parametrize("clip", [None, 0.3])
def test_ftml_matches_reference(clip):
    weight, grads = _arrays(1)
    kwargs = dict(learning_rate=0.05, beta1=0.6, beta2=0.9, epsilon=1e-8, wd=0.02, rescale_grad=0.7)
    if clip is not None:
        kwargs["clip_gradient"] = clip
    got, _ = _run(mx.optimizer.FTML(**kwargs), weight, grads)

    w = weight.astype(np.float64)
    d = v = z = np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        g = _prepared(g, w, 0.7, clip, wd=0.02)
        v = 0.9 * v + 0.1 * g * g
        d_t = (1 - 0.6 ** t) / 0.05 * (np.sqrt(v / (1 - 0.9 ** t)) + 1e-8)
        z = 0.6 * z + 0.4 * g - (d_t - 0.6 * d) * w
        d = d_t
        w = -z / d_t
    np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)


def test_adamax_and_nadam_match_reference():
    weight, grads = _arrays(2)
    got, _ = _run(mx.optimizer.Adamax(learning_rate=0.01, wd=0.01, clip_gradient=0.5), weight, grads)
    w = weight.astype(np.float64)
    m = u = np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        g = _prepared(g, w, 1.0, 0.5, wd=0.01)
        m = 0.9 * m + 0.1 * g
        u = np.maximum(0.999 * u, np.abs(g))
        w = w - 0.01 / (1 - 0.9 ** t) * m / u
    np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)

    got, _ = _run(mx.optimizer.Nadam(learning_rate=0.01, schedule_decay=0.004), weight, grads)
    w = weight.astype(np.float64)
    m = v = np.zeros_like(w)
    schedule = 1.0
    for t, g in enumerate(grads, 1):
        mom_t = 0.9 * (1 - 0.5 * 0.96 ** (t * 0.004))
        mom_next = 0.9 * (1 - 0.5 * 0.96 ** ((t + 1) * 0.004))
        schedule *= mom_t
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        m_bar = (1 - mom_t) * g / (1 - schedule) + mom_next * m / (1 - schedule * mom_next)
        w = w - 0.01 * m_bar / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)


def test_dcasgd_and_sgld_match_reference():
    weight, grads = _arrays(3)
    got, _ = _run(mx.optimizer.DCASGD(learning_rate=0.1, momentum=0.9, lamda=0.5), weight, grads)
    w = weight.astype(np.float64)
    mom, previous = np.zeros_like(w), w.copy()
    for g in grads:
        mom = 0.9 * mom - 0.1 * (g + 0.5 * g * g * (w - previous))
        previous = w.copy()
        w = w + mom
    np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)

    # SGLD: half an SGD step plus N(0, lr) noise drawn from mx.random.
    mx.random.seed(7)
    got, _ = _run(mx.optimizer.SGLD(learning_rate=0.01, wd=0.1), weight, grads[:1])
    mx.random.seed(7)
    noise = mx.nd.random.normal(0, math.sqrt(0.01), shape=SHAPE).asnumpy()
    expected = weight - 0.005 * (grads[0] + 0.1 * weight) + noise
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, dtype, kwargs", [
    ("adam", "float32", dict(learning_rate=0.01, wd=0.01, clip_gradient=0.4)),
    ("adam", "float16", dict(learning_rate=0.01, wd=0.01, multi_precision=True)),
    ("adamw", "float32", dict(learning_rate=0.01, wd=0.1, eta=0.5)),
    ("adamw", "float16", dict(learning_rate=0.01, wd=0.1, eta=0.5, multi_precision=True)),
])
def test_adam_groups_update_as_one_weight_at_a_time(name, dtype, kwargs):
    """Adam and AdamW update a list of weights with one multi-weight operator; every weight ends
    bit for bit where updating it alone (the path of MXNet 1.x) puts it, over steps with
    per-weight learning-rate multipliers."""
    rng = np.random.RandomState(5)
    shapes = [(3, 4), (7,), (2, 2, 2), (1,), (5, 3)]
    weights = [rng.uniform(-1, 1, s).astype(dtype) for s in shapes]
    grads = [[rng.uniform(-1, 1, s).astype(dtype) for s in shapes] for _ in range(3)]

    def run(aggregate):
        opt = mx.optimizer.create(name, rescale_grad=0.5, **kwargs)
        assert opt.aggregate_num > 0
        opt.set_lr_mult({1: 0.5, 3: 2.0})
        if not aggregate:
            opt.aggregate_num = 0
        updater = mx.optimizer.get_updater(opt)
        ws = [mx.nd.array(w, dtype=dtype) for w in weights]
        for step in grads:
            updater(list(range(len(ws))), [mx.nd.array(g, dtype=dtype) for g in step], ws)
        return [w.asnumpy() for w in ws], updater

    grouped, updater = run(aggregate=True)
    alone, _ = run(aggregate=False)
    for got, expected in zip(grouped, alone):
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, expected)
    if dtype == "float16":
        for i, w in enumerate(grouped):
            np.testing.assert_array_equal(w, updater.states[i][0].asnumpy().astype(np.float16))


def test_adam_subclass_that_redefines_update_gets_one_weight_at_a_time():
    seen = []

    class Logged(mx.optimizer.Adam):
        def update(self, index, weight, grad, state):
            seen.append(index)
            super().update(index, weight, grad, state)

    opt = Logged(learning_rate=0.1)
    assert opt.aggregate_num == 0
    updater = mx.optimizer.get_updater(opt)
    updater([0, 1], [mx.nd.ones((2,)), mx.nd.ones((3,))], [mx.nd.zeros((2,)), mx.nd.zeros((3,))])
    assert seen == [0, 1]


def test_lamb_multi_precision_keeps_a_float32_master_and_matches_float32():
    weight, grads = _arrays(4)
    kwargs = dict(learning_rate=0.01, wd=0.01, lower_bound=1e-3, upper_bound=10.0)
    full, _ = _run(mx.optimizer.LAMB(**kwargs), weight, grads)
    half, updater = _run(mx.optimizer.LAMB(multi_precision=True, **kwargs), weight.astype(np.float16),
                         [g.astype(np.float16) for g in grads], dtype="float16")
    master, (mean, var) = updater.states[0]
    assert master.dtype == np.float32 and mean.dtype == np.float32 and half.dtype == np.float16
    np.testing.assert_array_equal(half, master.asnumpy().astype(np.float16))
    np.testing.assert_allclose(master.asnumpy(), full, rtol=2e-3, atol=2e-3)

    # The float32 run against LAMB's rule.
    w = weight.astype(np.float64)
    m = v = np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        direction = (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-6) + 0.01 * w
        r1 = min(max(np.linalg.norm(w), 1e-3), 10.0)
        w = w - 0.01 * r1 / np.linalg.norm(direction) * direction
    np.testing.assert_allclose(full, w, rtol=1e-5, atol=1e-6)


def test_lars_scales_weights_but_not_biases():
    rng = np.random.RandomState(5)
    weight, bias = rng.uniform(-1, 1, (4, 3)).astype(np.float32), rng.uniform(-1, 1, (4,)).astype(np.float32)
    gw, gb = rng.uniform(-1, 1, (4, 3)).astype(np.float32), rng.uniform(-1, 1, (4,)).astype(np.float32)
    opt = mx.optimizer.LARS(learning_rate=0.1, momentum=0.9, eta=0.01, eps=1e-9, wd=0.001, rescale_grad=0.5,
                            param_idx2name={0: "fc_weight", 1: "fc_bias"})
    updater = mx.optimizer.get_updater(opt)
    w, b = mx.nd.array(weight), mx.nd.array(bias)
    updater([0, 1], [mx.nd.array(gw), mx.nd.array(gb)], [w, b])

    w_norm, g_norm = np.linalg.norm(weight), np.linalg.norm(gw) * 0.5
    lr_w = 0.1 * 0.01 * w_norm / (g_norm + 0.001 * w_norm + 1e-9)
    # Biases take no weight decay by default and keep the plain rate.
    np.testing.assert_allclose(w.asnumpy(), weight - lr_w * (0.5 * gw + 0.001 * weight), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.asnumpy(), bias - 0.1 * 0.5 * gb, rtol=1e-5, atol=1e-6)


def test_multi_sum_sq_and_multi_lars_operators():
    a, b = mx.nd.array([[1.0, 2.0]]), mx.nd.array([3.0])
    sums = mx.nd.multi_sum_sq(a, b, num_arrays=2)
    assert sums.dtype == np.float32
    np.testing.assert_allclose(sums.asnumpy(), [5.0, 9.0])
    lrs = mx.nd.multi_lars(mx.nd.array([0.1, 0.2]), mx.nd.array([4.0, 0.0]), mx.nd.array([1.0, 1.0]),
                           mx.nd.array([0.5, 0.5]), eta=0.1, eps=0.0, rescale_grad=2.0)
    # Second layer: zero weight norm keeps its rate.
    np.testing.assert_allclose(lrs.asnumpy(), [0.1 * 0.1 * 2 / (2 + 0.5 * 2), 0.2], rtol=1e-6)


def test_sgd_and_nag_multi_precision_state_is_momentum_then_master():
    weight, grads = _arrays(6, "float16")
    for name in ("sgd", "nag"):
        opt = mx.optimizer.create(name, learning_rate=0.1, momentum=0.9, multi_precision=True)
        half, updater = _run(opt, weight, grads, dtype="float16")
        mom, master = updater.states[0]
        assert mom.dtype == np.float32 and master.dtype == np.float32
        np.testing.assert_array_equal(half, master.asnumpy().astype(np.float16))


def test_signum_and_test_optimizer_steps():
    weight, grads = _arrays(7)
    got, _ = _run(mx.optimizer.Signum(learning_rate=0.01, momentum=0.9, wd_lh=0.01), weight, grads[:1])
    mom = -0.1 * grads[0]
    np.testing.assert_allclose(got, (1 - 0.01 * 0.01) * weight + 0.01 * np.sign(mom), rtol=1e-6)

    got, updater = _run(mx.optimizer.Test(rescale_grad=0.5), weight, grads[:1])
    np.testing.assert_allclose(got, weight + 0.5 * grads[0], rtol=1e-6)
    np.testing.assert_allclose(updater.states[0].asnumpy(), got)


def test_group_adagrad_updates_rows():
    weight, grads = _arrays(8)
    got, _ = _run(mx.optimizer.contrib.GroupAdaGrad(learning_rate=0.1, eps=1e-5), weight, grads[:2])
    w, history = weight.astype(np.float64), np.zeros((SHAPE[0], 1))
    for g in grads[:2]:
        history += np.mean(g * g, axis=1, keepdims=True)
        w = w - 0.1 * g / np.sqrt(history + 1e-5)
    np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        _run(mx.optimizer.contrib.GroupAdaGrad(wd=0.1), weight, grads[:1])


def test_registry_create_and_register():
    assert isinstance(mx.optimizer.Optimizer.create_optimizer("FTML"), mx.optimizer.FTML)
    assert isinstance(mx.optimizer.create("ccsgd"), mx.optimizer.SGD)
    with pytest.raises(ValueError):
        mx.optimizer.create("no_such_optimizer")

    @mx.optimizer.Optimizer.register
    class MyTestOptimizer(mx.optimizer.Optimizer):
        pass
    assert type(mx.optimizer.create("mytestoptimizer")) is MyTestOptimizer
    del mx.optimizer.Optimizer.opt_registry["mytestoptimizer"]


def test_lr_and_wd_multipliers_come_from_symbol_attributes():
    data = mx.sym.Variable("data")
    bias = mx.sym.Variable("fc1_bias", lr_mult=1.0)
    fc1 = mx.sym.FullyConnected(data=data, bias=bias, name="fc1", num_hidden=10, lr_mult=0)
    fc2 = mx.sym.FullyConnected(data=fc1, name="fc2", num_hidden=10, wd_mult=0.5)
    # The operator's lr_mult/wd_mult reach the variables it created, not those passed in.
    attrs = fc2.attr_dict()
    assert attrs["fc1_weight"]["__lr_mult__"] == "0" and attrs["fc1_bias"]["__lr_mult__"] == "1.0"
    assert attrs["fc2_weight"]["__wd_mult__"] == "0.5" and "__wd_mult__" not in attrs.get("data", {})

    names = [n for n in fc2.list_arguments() if n != "data"]
    opt = mx.optimizer.SGD(sym=fc2, param_idx2name=dict(enumerate(names)), learning_rate=1.0, wd=0.1)
    assert opt.lr_mult == {"fc1_bias": 1.0, "fc1_weight": 0.0}
    assert opt.wd_mult == {"fc2_bias": 0.5, "fc2_weight": 0.5, "fc1_bias": 0.0}
    index = {n: i for i, n in enumerate(names)}
    assert opt._get_lr(index["fc1_weight"]) == 0.0
    assert opt._get_wd(index["fc2_bias"]) == pytest.approx(0.05)


def test_updater_states_round_trip_with_the_optimizer():
    weight, grads = _arrays(9)
    opt = mx.optimizer.Adam(learning_rate=0.01)
    _, updater = _run(opt, weight, grads)
    blob = updater.get_states(dump_optimizer=True)
    restored = mx.optimizer.get_updater(mx.optimizer.SGD())
    restored.set_states(blob)
    assert isinstance(restored.optimizer, mx.optimizer.Adam)
    assert restored.optimizer._index_update_count[0] == 3
    for a, b in zip(restored.states[0], updater.states[0]):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    # Without the optimizer: the states alone.
    assert set(pickle.loads(updater.get_states())) == {0}


def test_scheduler_and_explicit_learning_rate():
    sched = mx.lr_scheduler.FactorScheduler(step=1, base_lr=1024)
    assert mx.optimizer.Optimizer(lr_scheduler=sched).learning_rate == 1024
    opt = mx.optimizer.Optimizer(lr_scheduler=mx.lr_scheduler.FactorScheduler(step=1), learning_rate=0.3)
    assert opt.learning_rate == 0.3
    with pytest.raises(UserWarning):
        opt.set_learning_rate(0.5)


def test_two_scalar_helpers_and_dense_stype():
    assert mx.nd.power(0.9, 2) == pytest.approx(0.81)
    assert mx.nd.maximum(1, 3) == 3
    assert mx.nd.zeros((2,), stype="default").shape == (2,)
    assert mx.nd.zeros((2,), stype="row_sparse").stype == "row_sparse"
    with pytest.raises(mx.MXNetError, match="unknown storage type"):
        mx.nd.zeros((2,), stype="coo")
