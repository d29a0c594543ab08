"""Neural-network operators and optimizer updates against NumPy references, with gradient checks."""

import math

import numpy as np
import pytest

import oxnet as mx
from oxnet import autograd
from oxnet.test_utils import assert_almost_equal
from gradcheck import check_gradient, check_precisions

nd = mx.nd


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("flatten", [True, False])
@pytest.mark.parametrize("no_bias", [True, False])
def test_fully_connected(flatten, no_bias, ctx):
    rng = np.random.RandomState(0)
    x = rng.randn(4, 3, 5)
    features = 15 if flatten else 5
    w, b = rng.randn(6, features), rng.randn(6)
    args = [nd.array(x, ctx=ctx), nd.array(w, ctx=ctx)] + ([] if no_bias else [nd.array(b, ctx=ctx)])
    out = nd.FullyConnected(*args, num_hidden=6, no_bias=no_bias, flatten=flatten)
    xm = x.reshape(4, 15) if flatten else x
    expected = xm @ w.T + (0 if no_bias else b)
    assert_almost_equal(out.asnumpy(), expected, rtol=1e-4, atol=1e-5)
    shapes = [(4, 3, 5), (6, features)] + ([] if no_bias else [(6,)])
    check_gradient(lambda *a: nd.FullyConnected(*a, num_hidden=6, no_bias=no_bias, flatten=flatten), shapes, ctx)
    with pytest.raises(mx.MXNetError, match="weight has shape"):
        nd.FullyConnected(nd.ones((4, 15), ctx=ctx), nd.ones((6, 14), ctx=ctx), num_hidden=6, no_bias=True)


@pytest.mark.parametrize("batch", [1, 2, 7, 37, 300])
def test_fully_connected_with_large_weights(batch, ctx):
    """Weights of over a MiB take the row-dot kernels (small batches) or the packed GEMM
    (x * W^T): ragged row, column and k blocks, several k slices, bias added on top, and dot's
    transposed forms on the same data."""
    rng = np.random.RandomState(1)
    x, w, b = rng.randn(batch, 600), rng.randn(530, 600), rng.randn(530)
    out = nd.FullyConnected(nd.array(x, ctx=ctx), nd.array(w, ctx=ctx), nd.array(b, ctx=ctx), num_hidden=530)
    assert_almost_equal(out.asnumpy(), x @ w.T + b, rtol=1e-4, atol=1e-3)
    for transpose_a in (False, True):
        lhs = x.T.copy() if transpose_a else x
        got = nd.dot(nd.array(lhs, ctx=ctx), nd.array(w, ctx=ctx), transpose_a=transpose_a, transpose_b=True)
        assert_almost_equal(got.asnumpy(), x @ w.T, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("batch", [3, 64])
def test_bfloat16_products_match_float32_within_bfloat16_rounding(batch, ctx):
    """bfloat16 dot and FullyConnected (the AVX512-BF16 kernel where the CPU has it) accumulate in
    float32: against a float64 product of the same bfloat16 values, only the final rounding of
    the output to bfloat16 (2^-8 relative) may differ. Odd k leaves a half-filled pair."""
    rng = np.random.RandomState(2)
    x = nd.array(rng.randn(batch, 601), ctx=ctx).astype("bfloat16")
    w = nd.array(rng.randn(520, 601), ctx=ctx).astype("bfloat16")
    b = nd.array(rng.randn(520), ctx=ctx).astype("bfloat16")
    xs, ws, bs = (v.astype("float32").asnumpy().astype(np.float64) for v in (x, w, b))
    cases = [
        (nd.FullyConnected(x, w, b, num_hidden=520), xs @ ws.T + bs),
        (nd.dot(x, w, transpose_b=True), xs @ ws.T),
        (nd.dot(w, x, transpose_b=True), ws @ xs.T),
        (nd.dot(x.T, x), xs.T @ xs),
    ]
    for got, want in cases:
        assert got.dtype == x.dtype
        got = got.astype("float32").asnumpy()
        scale = np.abs(want).max()
        assert np.abs(got - want).max() <= 2 ** -8 * scale, np.abs(got - want).max() / scale


ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0), "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh,
    "softrelu": lambda x: np.log1p(np.exp(x)), "softsign": lambda x: x / (1 + np.abs(x)),
}


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_activation(act, ctx):
    x = np.random.RandomState(1).uniform(-2, 2, size=(3, 4))
    x[np.abs(x) < 0.1] = 0.5
    assert_almost_equal(nd.Activation(nd.array(x, ctx=ctx), act_type=act).asnumpy(), ACTIVATIONS[act](x), rtol=1e-5, atol=1e-6)
    check_gradient(lambda v: nd.Activation(v, act_type=act), [(3, 4)], ctx, (0.2, 2.0))
    with pytest.raises(mx.MXNetError, match="act_type"):
        nd.Activation(nd.array(x, ctx=ctx), act_type="swish")


LEAKY = {
    "leaky": lambda x, s: np.where(x > 0, x, s * x),
    "elu": lambda x, s: np.where(x > 0, x, s * np.expm1(x)),
    # MXNet's SELU constants are float32 values, whatever the dtype.
    "selu": lambda x, s: float(np.float32(1.0507009873554805)) * np.where(
        x > 0, x, float(np.float32(1.6732632423543772)) * np.expm1(x)),
    "gelu": lambda x, s: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
}


@pytest.mark.parametrize("act", sorted(LEAKY))
def test_leaky_relu(act, ctx):
    x = np.random.RandomState(2).uniform(-2, 2, size=(3, 4))
    out = nd.LeakyReLU(nd.array(x, ctx=ctx, dtype="float64"), act_type=act, slope=0.3)
    assert_almost_equal(out.asnumpy(), LEAKY[act](x, 0.3), rtol=1e-10)
    make = lambda rng: [np.where(np.abs(v) < 0.1, 0.5, v) for v in [rng.uniform(-2, 2, size=(3, 4))]]
    check_gradient(lambda v: nd.LeakyReLU(v, act_type=act, slope=0.3), None, ctx, make=make, dtypes=["float64", "float32"])


def test_prelu(ctx):
    rng = np.random.RandomState(3)
    x, gamma = rng.uniform(-2, 2, size=(2, 3, 4)), np.array([0.1, 0.2, 0.3])
    out = nd.LeakyReLU(nd.array(x, ctx=ctx), nd.array(gamma, ctx=ctx), act_type="prelu")
    assert_almost_equal(out.asnumpy(), np.where(x > 0, x, gamma[None, :, None] * x), rtol=1e-5)
    make = lambda rng: [np.where(np.abs(v) < 0.1, 0.5, v) for v in [rng.uniform(-2, 2, size=(2, 3, 4))]] + [np.array([0.1, 0.2, 0.3])]
    check_gradient(lambda v, g: nd.LeakyReLU(v, g, act_type="prelu"), None, ctx, make=make, dtypes=["float64"])


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_family(axis, ctx):
    x = np.random.RandomState(4).randn(3, 4, 5)
    a = nd.array(x, ctx=ctx, dtype="float64")
    assert_almost_equal(nd.softmax(a, axis=axis).asnumpy(), _softmax(x, axis), rtol=1e-10)
    assert_almost_equal(nd.softmax(a, axis=axis, temperature=2.0).asnumpy(), _softmax(x / 2, axis), rtol=1e-10)
    assert_almost_equal(nd.log_softmax(a, axis=axis).asnumpy(), np.log(_softmax(x, axis)), rtol=1e-10)
    assert_almost_equal(nd.softmin(a, axis=axis).asnumpy(), _softmax(-x, axis), rtol=1e-10)
    for op, kwargs in ((nd.softmax, {}), (nd.softmax, {"temperature": 2.0}), (nd.log_softmax, {}), (nd.softmin, {})):
        check_gradient(lambda v: op(v, axis=axis, **kwargs), [(3, 4, 5)], ctx, dtypes=["float64", "float32"])
    big = nd.array([[1000.0, 0.0]], ctx=ctx)
    assert np.isfinite(nd.softmax(big).asnumpy()).all() and np.isfinite(nd.log_softmax(big).asnumpy()).all()



@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_with_length(axis, ctx):
    rng = np.random.RandomState(6)
    x = rng.randn(2, 4, 3)
    lengths = rng.randint(0, x.shape[axis] + 1, size=np.delete(x.shape, axis % 3))
    lengths.flat[0] = x.shape[axis]
    expected = np.zeros_like(x)
    moved, out = np.moveaxis(x, axis, -1), np.moveaxis(expected, axis, -1)
    for idx in np.ndindex(*lengths.shape):
        n = lengths[idx]
        if n:
            out[idx][:n] = _softmax(moved[idx][:n])
    got = nd.softmax(nd.array(x, ctx=ctx, dtype="float64"), nd.array(lengths, ctx=ctx, dtype="int32"), axis=axis, use_length=True)
    assert_almost_equal(got.asnumpy(), expected, rtol=1e-10, atol=1e-12)
    lengths64 = nd.array(lengths, ctx=ctx, dtype="float64")
    for op in (nd.softmax, nd.softmin):
        check_gradient(lambda v: op(v, lengths64, axis=axis, use_length=True), [x.shape], ctx, dtypes=["float64", "float32"])
    with pytest.raises(mx.MXNetError, match="length has shape"):
        nd.softmax(nd.array(x, ctx=ctx), nd.ones((5,), ctx=ctx), axis=axis, use_length=True)
    with pytest.raises(mx.MXNetError, match="not a whole number"):
        nd.softmax(nd.array(x, ctx=ctx), lengths64 + 0.5, axis=axis, use_length=True).asnumpy()


def test_rrelu_random_slopes_while_training(ctx):
    x = nd.array(np.linspace(-2, 2, 4000).reshape(40, 100), ctx=ctx)
    lower, upper = 0.1, 0.4
    inference = nd.LeakyReLU(x, act_type="rrelu", lower_bound=lower, upper_bound=upper).asnumpy()
    xs = x.asnumpy()
    assert_almost_equal(inference, np.where(xs > 0, xs, 0.25 * xs), rtol=1e-6)
    x.attach_grad()
    with autograd.record():
        y = nd.LeakyReLU(x, act_type="rrelu", lower_bound=lower, upper_bound=upper)
    y.backward()
    ys, grad = y.asnumpy(), x.grad.asnumpy()
    negative = xs < 0
    slopes = ys[negative] / xs[negative]
    assert lower <= slopes.min() and slopes.max() <= upper and slopes.std() > 0.05
    # The gradient uses the very slopes the forward pass drew.
    assert_almost_equal(grad[negative], slopes, rtol=1e-5)
    assert (grad[xs > 0] == 1).all()
    with pytest.raises(mx.MXNetError, match="must not exceed"):
        nd.LeakyReLU(x, act_type="rrelu", lower_bound=0.5, upper_bound=0.1)

def test_softmax_activation(ctx):
    x = np.random.RandomState(5).randn(2, 3, 4)
    a = nd.array(x, ctx=ctx, dtype="float64")
    assert_almost_equal(nd.SoftmaxActivation(a).asnumpy(), _softmax(x.reshape(2, -1), 1).reshape(2, 3, 4), rtol=1e-10)
    assert_almost_equal(nd.SoftmaxActivation(a, mode="channel").asnumpy(), _softmax(x, 1), rtol=1e-10)
    check_gradient(lambda v: nd.SoftmaxActivation(v), [(2, 3, 4)], ctx, dtypes=["float64"])


def _softmax_output_grad(data, label, normalization="null", grad_scale=1.0, use_ignore=False, ignore_label=-1):
    p = _softmax(data.reshape(data.shape[0], -1), 1)
    target = np.eye(p.shape[1])[label.astype(int).clip(0)]
    g = (p - target) * grad_scale
    keep = ~(use_ignore & (label == ignore_label))
    g *= keep[:, None]
    norm = {"null": 1.0, "batch": data.shape[0], "valid": max(keep.sum(), 1)}[normalization]
    return p, g / norm


@pytest.mark.parametrize("normalization", ["null", "batch", "valid"])
def test_softmax_output(normalization, ctx):
    rng = np.random.RandomState(6)
    x, label = rng.randn(5, 4), np.array([0, 3, -1, 2, 1], dtype=np.float64)
    data = nd.array(x, ctx=ctx, dtype="float64")
    data.attach_grad()
    with autograd.record():
        out = nd.SoftmaxOutput(data, nd.array(label, ctx=ctx, dtype="float64"), normalization=normalization,
                               grad_scale=2.0, use_ignore=True, ignore_label=-1)
    out.backward()
    p, g = _softmax_output_grad(x, label, normalization, 2.0, True, -1)
    assert_almost_equal(out.asnumpy(), p, rtol=1e-10)
    assert_almost_equal(data.grad.asnumpy(), g, rtol=1e-10)


def test_softmax_output_multi_output_and_preserve_shape(ctx):
    rng = np.random.RandomState(7)
    x, label = rng.randn(2, 3, 4), rng.randint(0, 3, size=(2, 4)).astype(np.float64)
    data = nd.array(x, ctx=ctx, dtype="float64")
    data.attach_grad()
    with autograd.record():
        out = nd.SoftmaxOutput(data, nd.array(label, ctx=ctx, dtype="float64"), multi_output=True)
    out.backward()
    p = _softmax(x, 1)
    target = np.moveaxis(np.eye(3)[label.astype(int)], -1, 1)
    assert_almost_equal(out.asnumpy(), p, rtol=1e-10)
    assert_almost_equal(data.grad.asnumpy(), p - target, rtol=1e-10)
    out = nd.SoftmaxOutput(data, nd.array(label[:, :3], ctx=ctx), preserve_shape=True)
    assert_almost_equal(out.asnumpy(), _softmax(x, -1), rtol=1e-10)


@pytest.mark.parametrize("name", ["LinearRegressionOutput", "LogisticRegressionOutput", "MAERegressionOutput"])
def test_regression_outputs(name, ctx):
    rng = np.random.RandomState(8)
    x, label = rng.randn(4, 3), rng.randn(4, 3)
    data = nd.array(x, ctx=ctx, dtype="float64")
    data.attach_grad()
    with autograd.record():
        out = getattr(nd, name)(data, nd.array(label, ctx=ctx, dtype="float64"), grad_scale=3.0)
    out.backward()
    pred = 1 / (1 + np.exp(-x)) if name.startswith("Logistic") else x
    diff = np.sign(pred - label) if name.startswith("MAE") else pred - label
    assert_almost_equal(out.asnumpy(), pred, rtol=1e-10)
    assert_almost_equal(data.grad.asnumpy(), 3.0 * diff / 3, rtol=1e-10)


def test_make_loss(ctx):
    x = nd.array([[1.0, -2.0], [3.0, 0.5]], ctx=ctx)
    x.attach_grad()
    with autograd.record():
        loss = nd.MakeLoss(x * 2, grad_scale=0.5, normalization="batch")
    loss.backward()
    assert_almost_equal(x.grad.asnumpy(), np.full((2, 2), 0.5))


def test_dropout_training_inference_and_axes(ctx):
    x = nd.ones((200, 300), ctx=ctx)
    assert (nd.Dropout(x, p=0.5).asnumpy() == 1).all()
    mx.random.seed(11)
    x.attach_grad()
    with autograd.record():
        y = nd.Dropout(x, p=0.4)
    y.backward()
    out = y.asnumpy()
    kept = out != 0
    assert abs(kept.mean() - 0.6) < 0.01 and np.allclose(out[kept], 1 / 0.6)
    assert_almost_equal(x.grad.asnumpy(), out)
    with autograd.record():
        shared = nd.Dropout(x, p=0.5, axes=(1,)).asnumpy()
    assert ((shared == 0).all(axis=1) | (shared != 0).all(axis=1)).all()
    assert not (nd.Dropout(x, p=0.5, mode="always").asnumpy() == 1).all()
    with pytest.raises(mx.MXNetError, match="p must be"):
        nd.Dropout(x, p=1.5)


# ---- optimizer updates against NumPy re-implementations of MXNet's rules ------------------------

def _clip(g, c):
    return np.clip(g, -c, c) if c >= 0 else g


def test_sgd_family_updates(ctx):
    rng = np.random.RandomState(9)
    w, g, m = rng.randn(5), rng.randn(5) * 3, rng.randn(5)
    lr, wd, rs, clip, mom = 0.1, 0.01, 0.5, 1.0, 0.9
    weight = nd.array(w, ctx=ctx, dtype="float64")
    nd.sgd_update(weight, nd.array(g, ctx=ctx, dtype="float64"), lr=lr, wd=wd, rescale_grad=rs, clip_gradient=clip, out=weight)
    assert_almost_equal(weight.asnumpy(), w - lr * (_clip(g * rs, clip) + wd * w), rtol=1e-12)

    weight, state = nd.array(w, ctx=ctx, dtype="float64"), nd.array(m, ctx=ctx, dtype="float64")
    nd.sgd_mom_update(weight, nd.array(g, ctx=ctx, dtype="float64"), state, lr=lr, momentum=mom, wd=wd,
                      rescale_grad=rs, clip_gradient=clip, out=weight)
    m_ref = mom * m - lr * wd * w - lr * _clip(g * rs, clip)
    assert_almost_equal(state.asnumpy(), m_ref, rtol=1e-12)
    assert_almost_equal(weight.asnumpy(), w + m_ref, rtol=1e-12)

    weight, state = nd.array(w, ctx=ctx, dtype="float64"), nd.array(m, ctx=ctx, dtype="float64")
    nd.nag_mom_update(weight, nd.array(g, ctx=ctx, dtype="float64"), state, lr=lr, momentum=mom, wd=wd, out=weight)
    step = lr * (g + wd * w)
    m_ref = mom * m - step
    assert_almost_equal(state.asnumpy(), m_ref, rtol=1e-12)
    assert_almost_equal(weight.asnumpy(), w + mom * m_ref - step, rtol=1e-12)

    weight = nd.array(w, ctx=ctx, dtype="float64")
    nd.signsgd_update(weight, nd.array(g, ctx=ctx, dtype="float64"), lr=lr, wd=wd, out=weight)
    assert_almost_equal(weight.asnumpy(), (1 - lr * wd) * w - lr * np.sign(g), rtol=1e-12)

    weight, state = nd.array(w, ctx=ctx, dtype="float64"), nd.array(m, ctx=ctx, dtype="float64")
    nd.signum_update(weight, nd.array(g, ctx=ctx, dtype="float64"), state, lr=lr, momentum=mom, wd=wd, wd_lh=0.01, out=weight)
    m_ref = mom * m - (1 - mom) * (wd * w + g)
    assert_almost_equal(weight.asnumpy(), (1 - lr * 0.01) * w + lr * np.sign(m_ref), rtol=1e-12)


def test_adaptive_updates(ctx):
    rng = np.random.RandomState(10)
    w, g = rng.randn(6), rng.randn(6)
    s1, s2, s3 = np.abs(rng.randn(6)), np.abs(rng.randn(6)), rng.randn(6)
    arr = lambda v: nd.array(v, ctx=ctx, dtype="float64")  # noqa: E731
    lr, wd, eps = 0.01, 0.1, 1e-8

    weight, mean, var = arr(w), arr(s3), arr(s1)
    nd.adam_update(weight, arr(g), mean, var, lr=lr, beta1=0.9, beta2=0.99, epsilon=eps, wd=wd, out=weight)
    gr = g + wd * w
    m_ref, v_ref = 0.9 * s3 + 0.1 * gr, 0.99 * s1 + 0.01 * gr ** 2
    assert_almost_equal(weight.asnumpy(), w - lr * m_ref / (np.sqrt(v_ref) + eps), rtol=1e-12)
    assert_almost_equal(mean.asnumpy(), m_ref, rtol=1e-12)

    weight, n = arr(w), arr(s1)
    nd.rmsprop_update(weight, arr(g), n, lr=lr, gamma1=0.9, wd=wd, out=weight)
    n_ref = 0.1 * gr ** 2 + 0.9 * s1
    assert_almost_equal(weight.asnumpy(), w - lr * gr / np.sqrt(n_ref + eps), rtol=1e-12)

    weight, n, gs, delta = arr(w), arr(s1), arr(s3 * 0.1), arr(s2)
    nd.rmspropalex_update(weight, arr(g), n, gs, delta, lr=lr, gamma1=0.9, gamma2=0.8, wd=wd, out=weight)
    n_ref = 0.1 * gr ** 2 + 0.9 * s1
    g_ref = 0.1 * gr + 0.9 * s3 * 0.1
    d_ref = 0.8 * s2 - lr * gr / np.sqrt(n_ref - g_ref ** 2 + eps)
    assert_almost_equal(weight.asnumpy(), w + d_ref, rtol=1e-12)

    weight, z, n = arr(w), arr(s3), arr(s1)
    nd.ftrl_update(weight, arr(g), z, n, lr=lr, lamda1=0.01, beta=1.0, wd=wd, out=weight)
    z_ref = s3 + g - (np.sqrt(s1 + g ** 2) - np.sqrt(s1)) * w / lr
    n_ref = s1 + g ** 2
    w_ref = np.where(np.abs(z_ref) > 0.01, (np.sign(z_ref) * 0.01 - z_ref) / ((1 + np.sqrt(n_ref)) / lr + wd), 0)
    assert_almost_equal(weight.asnumpy(), w_ref, rtol=1e-12)



def test_multi_precision_and_multi_weight_updates(ctx):
    rng = np.random.RandomState(11)
    lr, wd, mom, rs = 0.1, 0.01, 0.9, 0.5
    w32, g, m = rng.randn(7).astype(np.float32), rng.randn(7).astype(np.float16), rng.randn(7).astype(np.float32)
    weight, master, state = nd.array(w32, ctx=ctx, dtype="float16"), nd.array(w32, ctx=ctx), nd.array(m, ctx=ctx)
    nd.mp_sgd_mom_update(weight, nd.array(g, ctx=ctx, dtype="float16"), state, master, lr=lr, momentum=mom, wd=wd,
                         rescale_grad=rs, out=weight)
    m_ref = mom * m - lr * wd * w32 - lr * rs * g.astype(np.float32)
    assert_almost_equal(state.asnumpy(), m_ref, rtol=1e-6)
    assert_almost_equal(master.asnumpy(), w32 + m_ref, rtol=1e-6)
    assert weight.dtype == np.float16
    assert_almost_equal(weight.asnumpy(), (w32 + m_ref).astype(np.float16), rtol=0, atol=0)

    ws, gs, moms = [rng.randn(3, 2) for _ in range(3)], [rng.randn(3, 2) for _ in range(3)], [rng.randn(3, 2) for _ in range(3)]
    lrs, wds = (0.1, 0.2, 0.3), (0.0, 0.01, 0.02)
    weights = [nd.array(w, ctx=ctx) for w in ws]
    states = [nd.array(v, ctx=ctx) for v in moms]
    args = [a for trio in zip(weights, [nd.array(v, ctx=ctx) for v in gs], states) for a in trio]
    nd.multi_sgd_mom_update(*args, out=weights, lrs=lrs, wds=wds, momentum=mom, clip_gradient=0.5, num_weights=3)
    for w, gr, v, wt, st, lr_i, wd_i in zip(ws, gs, moms, weights, states, lrs, wds):
        v_ref = mom * v - lr_i * wd_i * w - lr_i * np.clip(gr, -0.5, 0.5)
        assert_almost_equal(st.asnumpy(), v_ref, rtol=1e-5, atol=1e-6)
        assert_almost_equal(wt.asnumpy(), w + v_ref, rtol=1e-5, atol=1e-6)
    weights = [nd.array(w, ctx=ctx) for w in ws]
    nd.multi_sgd_update(*[a for pair in zip(weights, [nd.array(v, ctx=ctx) for v in gs]) for a in pair], out=weights,
                        lrs=lrs, wds=wds, num_weights=3)
    for w, gr, wt, lr_i, wd_i in zip(ws, gs, weights, lrs, wds):
        assert_almost_equal(wt.asnumpy(), w - lr_i * (gr + wd_i * w), rtol=1e-5, atol=1e-6)
    with pytest.raises(mx.MXNetError, match="one value per weight"):
        nd.multi_sgd_update(*args[:4], lrs=(0.1,), wds=(0.0, 0.0), num_weights=2)
    with pytest.raises(mx.MXNetError, match="states and weight32 must be float32"):
        nd.mp_sgd_update(nd.ones((2,), ctx=ctx, dtype="float16"), nd.ones((2,), ctx=ctx, dtype="float16"),
                         nd.ones((2,), ctx=ctx, dtype="float16"), lr=0.1)


def test_adamw_and_lamb_update_ops(ctx):
    rng = np.random.RandomState(12)
    w, g, m, v = rng.randn(6), rng.randn(6), rng.randn(6) * 0.1, np.abs(rng.randn(6)) * 0.1
    arr = lambda a: nd.array(a, ctx=ctx, dtype="float64")  # noqa: E731
    lr, wd, eta, eps, rs = 0.01, 0.1, 0.5, 1e-8, 2.0
    weight, mean, var = arr(w), arr(m), arr(v)
    nd.contrib.adamw_update(weight, arr(g), mean, var, arr([rs]), lr=lr, wd=wd, eta=eta, epsilon=eps, out=weight)
    m_ref, v_ref = 0.9 * m + 0.1 * g * rs, 0.999 * v + 0.001 * (g * rs) ** 2
    assert_almost_equal(weight.asnumpy(), w - eta * (lr * m_ref / (np.sqrt(v_ref) + eps) + wd * w), rtol=1e-12)
    assert_almost_equal(var.asnumpy(), v_ref, rtol=1e-12)
    for skip in (0.0, np.inf, np.nan):  # a loss scaler's overflow signal: the step is skipped
        weight, mean = arr(w), arr(m)
        nd.contrib.adamw_update(weight, arr(g), mean, arr(v), arr([skip]), lr=lr, eta=eta, out=weight)
        assert_almost_equal(weight.asnumpy(), w, rtol=0, atol=0)
        assert_almost_equal(mean.asnumpy(), m, rtol=0, atol=0)

    t, b1, b2, lamb_eps = 3, 0.9, 0.999, 1e-6
    weight, mean, var = arr(w), arr(m), arr(v)
    direction = nd.lamb_update_phase1(weight, arr(g), mean, var, t=t, wd=wd, rescale_grad=rs, clip_gradient=1.5)
    gc = np.clip(g * rs, -1.5, 1.5)
    m_ref, v_ref = b1 * m + (1 - b1) * gc, b2 * v + (1 - b2) * gc ** 2
    d_ref = (m_ref / (1 - b1 ** t)) / (np.sqrt(v_ref / (1 - b2 ** t)) + lamb_eps) + wd * w
    assert_almost_equal(direction.asnumpy(), d_ref, rtol=1e-12)
    assert_almost_equal(weight.asnumpy(), w, rtol=0, atol=0)
    r1, r2 = nd.norm(weight), nd.norm(direction)
    nd.lamb_update_phase2(weight, direction, r1, r2, lr=lr, lower_bound=3.0, out=weight)
    ratio = max(np.linalg.norm(w), 3.0) / np.linalg.norm(d_ref)
    assert_almost_equal(weight.asnumpy(), w - lr * ratio * d_ref, rtol=1e-12)

def test_multi_adam_updates_step_each_weight_as_its_single_update(ctx):
    """multi_adam_update and contrib.multi_adamw_update (operator _multi_adamw_update): every weight and state exactly as
    adam_update / adamw_update with that weight's own lr, wd (and eta) leave them."""
    rng = np.random.RandomState(16)
    shapes = [(4, 3), (5,), (1,)]
    lrs, wds, etas = (0.01, 0.02, 0.03), (0.0, 0.1, 0.2), (1.0, 0.5, 0.25)
    arr = lambda a: nd.array(a, ctx=ctx)  # noqa: E731
    ws, gs = [rng.randn(*s) for s in shapes], [rng.randn(*s) for s in shapes]
    ms, vs = [rng.randn(*s) * 0.1 for s in shapes], [np.abs(rng.randn(*s)) * 0.1 for s in shapes]
    adam = dict(beta1=0.8, beta2=0.99, epsilon=1e-6, clip_gradient=0.7)

    def fresh():
        return [arr(w) for w in ws], [arr(m) for m in ms], [arr(v) for v in vs]

    def assert_same(got, expected):
        for group_got, group_expected in zip(got, expected):
            for a, b in zip(group_got, group_expected):
                np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())

    weights, means, variances = fresh()
    nd.multi_adam_update(*[a for four in zip(weights, map(arr, gs), means, variances) for a in four], out=weights,
                         lrs=lrs, wds=wds, rescale_grad=0.5, num_weights=3, **adam)
    alone = fresh()
    for i in range(3):
        nd.adam_update(alone[0][i], arr(gs[i]), alone[1][i], alone[2][i], out=alone[0][i], lr=lrs[i], wd=wds[i],
                       rescale_grad=0.5, **adam)
    assert_same((weights, means, variances), alone)

    weights, means, variances = fresh()
    nd.contrib.multi_adamw_update(weights, list(map(arr, gs)), means, variances, 2.0, lrs=lrs, wds=wds, etas=etas,
                                  out=weights, **adam)
    alone = fresh()
    for i in range(3):
        nd.contrib.adamw_update(alone[0][i], arr(gs[i]), alone[1][i], alone[2][i], arr([2.0]), out=alone[0][i],
                                lr=lrs[i], wd=wds[i], eta=etas[i], **adam)
    assert_same((weights, means, variances), alone)
    for skip in (0.0, np.nan):  # a loss scaler's overflow signal skips every weight's step
        weights, means, variances = fresh()
        nd.contrib.multi_adamw_update(weights, list(map(arr, gs)), means, variances, arr([skip]), lrs=lrs, wds=wds,
                                      etas=etas, out=weights)
        assert_same((weights, means), (fresh()[0], fresh()[1]))

    with pytest.raises(mx.MXNetError, match="one value per weight"):
        nd.multi_adam_update(*[a for four in zip(weights, map(arr, gs), means, variances) for a in four],
                             lrs=(0.1,), wds=wds, num_weights=3)
    with pytest.raises(mx.MXNetError, match="etas"):
        nd.contrib.multi_adamw_update(weights, list(map(arr, gs)), means, variances, 1.0, lrs=lrs, wds=wds,
                                      etas=(1.0,))


def test_ftml_update(ctx):
    rng = np.random.RandomState(13)
    w, g, d, z = rng.randn(6), rng.randn(6), np.abs(rng.randn(6)), rng.randn(6)
    v = np.abs(rng.randn(6)) * 0.1
    arr = lambda a: nd.array(a, ctx=ctx, dtype="float64")  # noqa: E731
    lr, b1, b2, eps, t, wd, rs, clip = 0.05, 0.6, 0.9, 1e-8, 3, 0.02, 0.7, 0.5
    weight, d_state, v_state, z_state = arr(w), arr(d), arr(v), arr(z)
    nd.ftml_update(weight, arr(g), d_state, v_state, z_state, lr=lr, beta1=b1, beta2=b2, epsilon=eps, t=t, wd=wd,
                   rescale_grad=rs, clip_grad=clip, out=weight)
    gr = np.clip(g * rs + wd * w, -clip, clip)
    v_ref = b2 * v + (1 - b2) * gr ** 2
    d_ref = (1 - b1 ** t) / lr * (np.sqrt(v_ref / (1 - b2 ** t)) + eps)
    z_ref = b1 * z + (1 - b1) * gr - (d_ref - b1 * d) * w
    for got, expected in ((v_state, v_ref), (d_state, d_ref), (z_state, z_ref), (weight, -z_ref / d_ref)):
        assert_almost_equal(got.asnumpy(), expected, rtol=1e-12)


# Multi-precision update -> (its float32 form, states per weight, number of weights, parameters). The
# mp form must step its float32 master as the float32 form (checked against NumPy above) steps a
# float32 weight, and give the weight the master's float16 cast.
MP_UPDATES = {
    "mp_sgd_update": ("sgd_update", 0, 1, dict(lr=0.1, wd=0.01, rescale_grad=0.5, clip_gradient=1.0)),
    "mp_nag_mom_update": ("nag_mom_update", 1, 1, dict(lr=0.1, momentum=0.9, wd=0.01)),
    "_contrib_mp_adamw_update": ("_contrib_adamw_update", 2, 1, dict(lr=0.01, eta=0.5, wd=0.1, clip_gradient=2.0)),
    "multi_mp_sgd_update": ("multi_sgd_update", 0, 2, dict(lrs=(0.1, 0.2), wds=(0.0, 0.01), num_weights=2)),
    "multi_mp_adam_update": ("multi_adam_update", 2, 2, dict(lrs=(0.1, 0.2), wds=(0.0, 0.01), num_weights=2)),
    "_multi_mp_adamw_update": ("_multi_adamw_update", 2, 2,
                               dict(lrs=(0.1, 0.2), wds=(0.0, 0.01), etas=(1.0, 0.5), num_weights=2)),
    "multi_mp_sgd_mom_update": ("multi_sgd_mom_update", 1, 2,
                                dict(lrs=(0.1, 0.2), wds=(0.0, 0.01), momentum=0.9, num_weights=2)),
}


@pytest.mark.parametrize("name", sorted(MP_UPDATES))
def test_multi_precision_updates_step_the_master_as_the_float32_update(name, ctx):
    single, n_states, n_weights, params = MP_UPDATES[name]
    rng = np.random.RandomState(14)
    weights = [rng.randn(7).astype(np.float32) for _ in range(n_weights)]
    grads = [rng.randn(7).astype(np.float16) for _ in range(n_weights)]
    states = [[np.abs(rng.randn(7)).astype(np.float32) * 0.1 for _ in range(n_states)] for _ in range(n_weights)]
    f32 = lambda a: nd.array(a, ctx=ctx, dtype="float32")  # noqa: E731
    # AdamW takes the rescale factor as an array after the weights.
    extra = [f32([2.0])] if "adamw" in name else []

    ref_weights, ref_states = [f32(w) for w in weights], [[f32(s) for s in group] for group in states]
    ref_inputs = [a for w, g, st in zip(ref_weights, grads, ref_states) for a in [w, f32(g.astype(np.float32)), *st]]
    getattr(nd, single)(*ref_inputs, *extra, out=ref_weights if n_weights > 1 else ref_weights[0], **params)

    half = [nd.array(w, ctx=ctx, dtype="float16") for w in weights]
    masters, mp_states = [f32(w) for w in weights], [[f32(s) for s in group] for group in states]
    inputs = [a for w, g, st, m in zip(half, grads, mp_states, masters)
              for a in [w, nd.array(g, ctx=ctx, dtype="float16"), *st, m]]
    getattr(nd, name)(*inputs, *extra, out=half if n_weights > 1 else half[0], **params)
    for i in range(n_weights):
        assert_almost_equal(masters[i].asnumpy(), ref_weights[i].asnumpy(), rtol=1e-6, atol=1e-7)
        for got, expected in zip(mp_states[i], ref_states[i]):
            assert_almost_equal(got.asnumpy(), expected.asnumpy(), rtol=1e-6, atol=1e-7)
        assert half[i].dtype == np.float16
        np.testing.assert_array_equal(half[i].asnumpy(), masters[i].asnumpy().astype(np.float16))


def test_multi_precision_lamb_phases_step_the_master_as_the_float32_phases(ctx):
    rng = np.random.RandomState(15)
    w, g = rng.randn(6).astype(np.float32), rng.randn(6).astype(np.float16)
    m, v = rng.randn(6).astype(np.float32) * 0.1, np.abs(rng.randn(6)).astype(np.float32) * 0.1
    f32 = lambda a: nd.array(a, ctx=ctx, dtype="float32")  # noqa: E731
    params = dict(t=2, wd=0.1, rescale_grad=2.0, clip_gradient=1.5)
    ref_mean, ref_var = f32(m), f32(v)
    ref_direction = nd.lamb_update_phase1(f32(w), f32(g.astype(np.float32)), ref_mean, ref_var, **params)
    weight, master, mean, var = nd.array(w, ctx=ctx, dtype="float16"), f32(w), f32(m), f32(v)
    direction = nd.mp_lamb_update_phase1(weight, nd.array(g, ctx=ctx, dtype="float16"), mean, var, master, **params)
    assert direction.dtype == np.float32
    for got, expected in ((direction, ref_direction), (mean, ref_mean), (var, ref_var)):
        assert_almost_equal(got.asnumpy(), expected.asnumpy(), rtol=1e-6, atol=1e-7)

    r1, r2 = nd.norm(master), nd.norm(direction)
    ref_weight = f32(w)
    nd.lamb_update_phase2(ref_weight, direction, r1, r2, lr=0.01, lower_bound=1e-3, out=ref_weight)
    nd.mp_lamb_update_phase2(weight, direction, r1, r2, master, lr=0.01, lower_bound=1e-3, out=weight)
    assert_almost_equal(master.asnumpy(), ref_weight.asnumpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(weight.asnumpy(), master.asnumpy().astype(np.float16))


# Preloaded update -> (the update that takes its rates as parameters, states per weight, master copies).
PRELOADED_UPDATES = {
    "preloaded_multi_sgd_update": ("multi_sgd_update", 0, False),
    "preloaded_multi_sgd_mom_update": ("multi_sgd_mom_update", 1, False),
    "preloaded_multi_mp_sgd_update": ("multi_mp_sgd_update", 0, True),
    "preloaded_multi_mp_sgd_mom_update": ("multi_mp_sgd_mom_update", 1, True),
}


@pytest.mark.parametrize("name", sorted(PRELOADED_UPDATES))
def test_preloaded_updates_read_their_rates_from_arrays(name, ctx):
    plain, n_states, master = PRELOADED_UPDATES[name]
    rng = np.random.RandomState(16)
    lrs, wds = (0.1, 0.3), (0.02, 0.0)
    dtype = "float16" if master else "float32"
    weights = [rng.randn(5).astype(np.float32) for _ in range(2)]
    grads = [rng.randn(5).astype(dtype) for _ in range(2)]
    states = [[rng.randn(5).astype(np.float32) for _ in range(n_states)] for _ in range(2)]

    def run(op, *rates, **params):
        ws = [nd.array(w, ctx=ctx, dtype=dtype) for w in weights]
        state_arrays = [[nd.array(s, ctx=ctx) for s in group] for group in states]
        masters = [[nd.array(w, ctx=ctx)] if master else [] for w in weights]
        inputs = [a for w, g, st, m in zip(ws, grads, state_arrays, masters)
                  for a in [w, nd.array(g, ctx=ctx, dtype=dtype), *st, *m]]
        getattr(nd, op)(*inputs, *rates, out=ws, momentum=0.9, clip_gradient=0.8, num_weights=2, **params)
        return [a.asnumpy() for a in ws + [s for group in state_arrays + masters for s in group]]

    expected = run(plain, lrs=lrs, wds=wds)
    # The rates arrive as float32 arrays rather than as float64 parameters: equal to rounding.
    got = run(name, nd.array(lrs, ctx=ctx), nd.array(wds, ctx=ctx))
    for g, e in zip(got, expected):
        assert_almost_equal(g, e, rtol=1e-3 if g.dtype == np.float16 else 1e-6, atol=1e-7)


def test_update_shape_mismatch_is_an_error(ctx):
    with pytest.raises(mx.MXNetError, match="sgd_update"):
        nd.sgd_update(nd.ones((3,), ctx=ctx), nd.ones((4,), ctx=ctx), lr=0.1)


# ---- convolution and pooling --------------------------------------------------------------------

def _conv_reference(x, w, b, stride, pad, dilate, groups):
    """Direct N-d convolution (channels first) by explicit summation over windows."""
    rank = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    n, c = x.shape[:2]
    f = w.shape[0]
    k = w.shape[2:]
    out_sp = [(xp.shape[2 + a] - (dilate[a] * (k[a] - 1) + 1)) // stride[a] + 1 for a in range(rank)]
    out = np.zeros((n, f) + tuple(out_sp))
    cpg, fpg = c // groups, f // groups
    for o in np.ndindex(*out_sp):
        window = tuple(slice(o[a] * stride[a], o[a] * stride[a] + dilate[a] * (k[a] - 1) + 1, dilate[a]) for a in range(rank))
        for grp in range(groups):
            patch = xp[(slice(None), slice(grp * cpg, (grp + 1) * cpg)) + window]
            wg = w[grp * fpg:(grp + 1) * fpg]
            out[(slice(None), slice(grp * fpg, (grp + 1) * fpg)) + o] = np.tensordot(patch, wg, axes=(list(range(1, rank + 2)), list(range(1, rank + 2))))
    if b is not None:
        out += b.reshape((1, f) + (1,) * rank)
    return out


CONV_CASES = [
    # (data shape, num_filter, kernel, stride, pad, dilate, groups, no_bias)
    ((2, 3, 7, 6), 4, (3, 3), (1, 1), (0, 0), (1, 1), 1, False),
    # Unpadded, unit stride: 16-bit data gradients sum each input row's taps in one register
    # (rows of at most 16, LeNet's 5x5 layer) or line by line (wider rows).
    ((2, 4, 12, 12), 6, (5, 5), (1, 1), (0, 0), (1, 1), 1, False),
    ((2, 3, 6, 21), 4, (3, 3), (1, 1), (0, 0), (1, 1), 1, True),
    ((2, 4, 8, 7), 6, (3, 2), (2, 1), (1, 2), (1, 1), 2, False),
    ((1, 2, 9, 9), 2, (3, 3), (1, 2), (2, 1), (2, 2), 1, True),
    ((2, 3, 10), 5, (4,), (2,), (1,), (1,), 1, False),
    ((1, 2, 5, 4, 6), 3, (2, 3, 2), (1, 1, 2), (1, 0, 1), (1, 1, 1), 1, False),
    # Strided columns are gathered from the rows split into stride phases: a stem-like 7x7
    # stride 2 over one image (channels filled by the threads) and stride 3 over odd widths.
    ((1, 3, 15, 17), 4, (7, 7), (2, 2), (3, 3), (1, 1), 1, False),
    ((3, 2, 8, 13), 4, (3, 4), (1, 3), (1, 2), (1, 2), 1, True),
    # Rows narrower than the stride, and taps that read only padding on a line.
    ((2, 2, 1), 3, (1,), (3,), (0,), (1,), 1, False),
    ((1, 2, 5, 2), 3, (7, 7), (2, 2), (3, 3), (1, 1), 1, True),
    # im2col reads lines of a padded, stride-phased copy: small outputs put several images in a
    # chunk (grouped, padded, strided), lines of whole vectors plus a masked rest (19 wide), and
    # 3-D phases along depth with dilation.
    ((6, 4, 5, 5), 10, (3, 3), (2, 2), (1, 1), (1, 1), 2, False),
    ((2, 3, 9, 40), 4, (3, 5), (1, 2), (2, 1), (1, 1), 1, True),
    ((2, 3, 5, 6, 9), 4, (3, 2, 3), (2, 1, 2), (1, 0, 1), (1, 1, 2), 1, False),
    # Stride 1 with 16+ channels per group: float32 takes the padded-image kernel (conv_shifted),
    # checked against the reference and, through check_gradient, against float64's im2col path.
    ((3, 16, 6, 5), 20, (3, 3), (1, 1), (1, 1), (1, 1), 1, False),
    ((2, 32, 7, 6), 16, (3, 2), (1, 1), (2, 1), (2, 1), 2, True),
    ((2, 16, 40), 9, (3,), (1,), (1,), (1,), 1, False),
    ((2, 16, 5, 6), 64, (3, 3), (1, 1), (1, 1), (1, 1), 1, False),
    ((1, 20, 6, 6), 32, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),
    ((1, 16, 2, 6, 7), 8, (1, 3, 3), (1, 1, 1), (0, 1, 1), (1, 1, 1), 1, False),
    # Lines of whole vectors (16 wide, 32 wide in 1-D) are computed straight into place; several
    # images a chunk; the unpadded case does so only forward (its input lines are 18 wide).
    ((5, 16, 4, 16), 24, (3, 3), (1, 1), (1, 1), (1, 1), 1, False),
    ((4, 32, 3, 16), 16, (3, 3), (1, 1), (1, 1), (1, 1), 2, True),
    ((3, 16, 32), 8, (3,), (1,), (1,), (1,), 1, False),
    ((3, 16, 5, 18), 16, (3, 3), (1, 1), (0, 0), (1, 1), 1, True),
    # One image (fewer than the threads): the chunk's filter tiles are split over the threads,
    # forward and (16-wide lines) data gradient, a partial last tile of filters in the second.
    ((1, 16, 14, 14), 32, (3, 3), (1, 1), (1, 1), (1, 1), 1, False),
    ((1, 16, 8, 16), 20, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),
    # 1x1, unit stride, no padding: one image's product reads the image itself (no column matrix),
    # per group; several images a chunk copy as usual.
    ((1, 8, 5, 6), 12, (1, 1), (1, 1), (0, 0), (1, 1), 1, False),
    ((1, 8, 4, 4), 6, (1, 1), (1, 1), (0, 0), (1, 1), 2, True),
    ((3, 8, 5, 6), 12, (1, 1), (1, 1), (0, 0), (1, 1), 1, False),
    # Depthwise (one channel per group): float32 takes the stencil over stride-phased planes
    # (op/stencil.rs); odd and even padding at stride 2, stride 3 with dilation, a channel
    # multiplier, 1-D and 3-D, and planes narrower than a vector.
    ((2, 8, 13, 17), 8, (3, 3), (2, 2), (1, 1), (1, 1), 8, False),
    ((2, 6, 40), 6, (3,), (2,), (2,), (1,), 6, False),
    ((3, 5, 20, 31), 5, (5, 5), (3, 3), (2, 2), (2, 2), 5, False),
    ((1, 4, 9, 10), 8, (3, 3), (1, 1), (0, 0), (1, 1), 4, True),
    ((1, 3, 5, 6, 7), 6, (2, 3, 3), (2, 1, 2), (1, 1, 0), (1, 2, 1), 3, True),
    ((2, 16, 7, 7), 16, (3, 3), (1, 1), (1, 1), (1, 1), 16, False),
    # Unit stride, one filter per channel: the gradients run on the stencil too (the data
    # gradient a stencil of the output gradient with mirrored taps).
    ((2, 6, 9, 11), 6, (3, 3), (1, 1), (2, 0), (2, 1), 6, True),
    ((2, 5, 30), 5, (5,), (1,), (2,), (1,), 5, False),
    ((1, 3, 4, 5, 6), 3, (2, 3, 3), (1, 1, 1), (1, 1, 0), (1, 2, 1), 3, False),
]


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_convolution(case, ctx):
    shape, nf, kernel, stride, pad, dilate, groups, no_bias = CONV_CASES[case]
    rng = np.random.RandomState(case)
    x = rng.randn(*shape)
    w = rng.randn(nf, shape[1] // groups, *kernel) * 0.3
    b = None if no_bias else rng.randn(nf)
    kwargs = dict(kernel=kernel, stride=stride, pad=pad, dilate=dilate, num_filter=nf, num_group=groups, no_bias=no_bias)
    args = [nd.array(x, ctx=ctx), nd.array(w, ctx=ctx)] + ([] if no_bias else [nd.array(b, ctx=ctx)])
    out = nd.Convolution(*args, **kwargs)
    assert_almost_equal(out.asnumpy(), _conv_reference(x, w, b, stride, pad, dilate, groups), rtol=1e-4, atol=1e-4)
    small = [(1,) + shape[1:], w.shape] + ([] if no_bias else [(nf,)])
    check_gradient(lambda *a: nd.Convolution(*a, **kwargs), small, ctx, dtypes=["float64", "float32"])
    # The whole batch too: the weight gradient sums over every chunk of images; the 16-bit
    # floats' outputs and gradients within their rounding of float64's.
    check_precisions(lambda *a: nd.Convolution(*a, **kwargs), [x, w] + ([] if no_bias else [b]), ctx,
                     dtypes=["float32", "float16", "bfloat16"])


def test_convolution_of_empty_images_reads_only_padding(ctx):
    w = nd.ones((4, 2, 1, 1), ctx=ctx)
    for shape in [(1, 2, 3, 0), (2, 2, 0, 0)]:
        out = nd.Convolution(nd.ones(shape, ctx=ctx), w, kernel=(1, 1), pad=(1, 1), num_filter=4, no_bias=True)
        assert out.shape == (shape[0], 4, shape[2] + 2, shape[3] + 2)
        assert not out.asnumpy().any()


def test_convolution_errors(ctx):
    x = nd.ones((1, 3, 5, 5), ctx=ctx)
    with pytest.raises(mx.MXNetError, match="weight has shape"):
        nd.Convolution(x, nd.ones((4, 2, 3, 3), ctx=ctx), kernel=(3, 3), num_filter=4, no_bias=True)
    with pytest.raises(mx.MXNetError, match="4-D data"):
        nd.Convolution(nd.ones((3, 5, 5), ctx=ctx), nd.ones((4, 3, 3, 3), ctx=ctx), kernel=(3, 3), num_filter=4, no_bias=True)
    with pytest.raises(mx.MXNetError, match="larger than"):
        nd.Convolution(x, nd.ones((4, 3, 7, 7), ctx=ctx), kernel=(7, 7), num_filter=4, no_bias=True)



def _deconv_reference(x, w, b, stride, pad, dilate, adj, groups):
    """Direct transposed convolution: every input value scatters its kernel-weighted copy."""
    rank = x.ndim - 2
    n, c = x.shape[:2]
    fpg, k = w.shape[1], w.shape[2:]
    full = [stride[a] * (x.shape[2 + a] - 1) + dilate[a] * (k[a] - 1) + 1 + adj[a] for a in range(rank)]
    out = np.zeros((n, fpg * groups) + tuple(full))
    cpg = c // groups
    for i in np.ndindex(*x.shape[2:]):
        window = tuple(slice(i[a] * stride[a], i[a] * stride[a] + dilate[a] * (k[a] - 1) + 1, dilate[a]) for a in range(rank))
        for grp in range(groups):
            contribution = np.tensordot(x[(slice(None), slice(grp * cpg, (grp + 1) * cpg)) + i], w[grp * cpg:(grp + 1) * cpg], axes=(1, 0))
            out[(slice(None), slice(grp * fpg, (grp + 1) * fpg)) + window] += contribution
    out = out[(slice(None), slice(None)) + tuple(slice(pad[a], full[a] - pad[a]) for a in range(rank))]
    if b is not None:
        out += b.reshape((1, -1) + (1,) * rank)
    return out


DECONV_CASES = [
    # (data shape, num_filter, kernel, stride, pad, dilate, adj, groups, no_bias)
    ((2, 3, 4, 5), 4, (3, 3), (1, 1), (0, 0), (1, 1), (0, 0), 1, False),
    ((2, 4, 3, 4), 6, (3, 2), (2, 3), (1, 0), (1, 1), (1, 2), 2, False),
    ((1, 2, 4, 3), 2, (3, 3), (2, 1), (2, 1), (2, 2), (1, 0), 1, True),
    ((2, 3, 5), 2, (4,), (3,), (1,), (1,), (2,), 1, False),
    ((1, 2, 2, 3, 2), 3, (2, 3, 2), (2, 1, 2), (1, 0, 0), (1, 1, 1), (0, 0, 1), 1, False),
    ((2, 16, 5, 6), 16, (3, 3), (1, 1), (1, 1), (1, 1), (0, 0), 1, False),
]


@pytest.mark.parametrize("case", range(len(DECONV_CASES)))
def test_deconvolution(case, ctx):
    shape, nf, kernel, stride, pad, dilate, adj, groups, no_bias = DECONV_CASES[case]
    rng = np.random.RandomState(case)
    x = rng.randn(*shape)
    w = rng.randn(shape[1], nf // groups, *kernel) * 0.3
    b = None if no_bias else rng.randn(nf)
    kwargs = dict(kernel=kernel, stride=stride, pad=pad, dilate=dilate, adj=adj, num_filter=nf, num_group=groups, no_bias=no_bias)
    args = [nd.array(x, ctx=ctx), nd.array(w, ctx=ctx)] + ([] if no_bias else [nd.array(b, ctx=ctx)])
    out = nd.Deconvolution(*args, **kwargs)
    assert_almost_equal(out.asnumpy(), _deconv_reference(x, w, b, stride, pad, dilate, adj, groups), rtol=1e-4, atol=1e-4)
    small = [(1,) + shape[1:], w.shape] + ([] if no_bias else [(nf,)])
    check_gradient(lambda *a: nd.Deconvolution(*a, **kwargs), small, ctx, dtypes=["float64", "float32"])


def test_deconvolution_and_bilinear_upsampling_match_mxnet():
    ref = nd.load(str(EXTRA / "deconv-ops.params"))
    kwargs = {
        "d2": dict(kernel=(3, 3), num_filter=3, no_bias=False),
        "d2s": dict(kernel=(3, 2), stride=(2, 3), pad=(1, 0), adj=(1, 2), num_filter=3, no_bias=False),
        "d2g": dict(kernel=(3, 3), stride=(2, 2), dilate=(2, 1), pad=(1, 1), num_filter=2, num_group=2),
        "d2t": dict(kernel=(4, 4), stride=(2, 2), target_shape=(7, 6), num_filter=3),
        "d1": dict(kernel=(3,), stride=(2,), pad=(1,), num_filter=2, no_bias=False),
        "d3": dict(kernel=(2, 2, 2), stride=(2, 1, 2), num_filter=2, no_bias=False),
        "up": dict(scale=2, sample_type="bilinear", num_filter=3),
    }
    for name, kw in kwargs.items():
        suffixes = ["_x", "_w"] + (["_b"] if name + "_b" in ref else [])
        inputs = [ref[name + s].copy() for s in suffixes]
        for v in inputs:
            v.attach_grad()
        with autograd.record():
            out = nd.UpSampling(*inputs, **kw) if name == "up" else nd.Deconvolution(*inputs, **kw)
        out.backward(ref[name + "_hg"])
        assert_almost_equal(out.asnumpy(), ref[name].asnumpy(), rtol=1e-4, atol=1e-5)
        for v, s in zip(inputs, suffixes):
            assert_almost_equal(v.grad.asnumpy(), ref[name + "_d" + s[1:]].asnumpy(), rtol=1e-4, atol=1e-4)


def test_deconvolution_shapes_and_errors(ctx):
    sym = mx.sym.Deconvolution(mx.sym.var("data"), kernel=(4, 4), stride=(2, 2), pad=(1, 1), num_filter=8, name="up")
    assert sym.list_arguments() == ["data", "up_weight"]
    arg_shapes, out_shapes, _ = sym.infer_shape(data=(2, 3, 5, 5))
    assert arg_shapes == [(2, 3, 5, 5), (3, 8, 4, 4)] and out_shapes == [(2, 8, 10, 10)]
    x = nd.ones((1, 3, 4, 4), ctx=ctx)
    with pytest.raises(mx.MXNetError, match="weight has shape"):
        nd.Deconvolution(x, nd.ones((3, 2, 3, 3), ctx=ctx), kernel=(3, 3), num_filter=4)
    with pytest.raises(mx.MXNetError, match="adj .* must be smaller than stride"):
        nd.Deconvolution(x, nd.ones((3, 4, 3, 3), ctx=ctx), kernel=(3, 3), num_filter=4, adj=(1, 1))
    with pytest.raises(mx.MXNetError, match="target_shape"):
        nd.Deconvolution(x, nd.ones((3, 4, 3, 3), ctx=ctx), kernel=(3, 3), num_filter=4, target_shape=(9, 9))
    with pytest.raises(mx.MXNetError, match="num_filter"):
        nd.UpSampling(x, scale=2, sample_type="bilinear")

def _pool_reference(x, kernel, stride, pad, pool_type, convention="valid", count_include_pad=True):
    rank = x.ndim - 2
    sp = x.shape[2:]
    if convention == "full":
        out_sp = [int(np.ceil((sp[a] + 2 * pad[a] - kernel[a]) / stride[a])) + 1 for a in range(rank)]
    else:
        out_sp = [(sp[a] + 2 * pad[a] - kernel[a]) // stride[a] + 1 for a in range(rank)]
    out = np.zeros(x.shape[:2] + tuple(out_sp))
    for o in np.ndindex(*out_sp):
        starts = [o[a] * stride[a] - pad[a] for a in range(rank)]
        ends = [min(starts[a] + kernel[a], sp[a] + pad[a]) for a in range(rank)]
        padded = np.prod([ends[a] - starts[a] for a in range(rank)])
        window = tuple(slice(max(starts[a], 0), min(ends[a], sp[a])) for a in range(rank))
        patch = x[(slice(None), slice(None)) + window].reshape(x.shape[0], x.shape[1], -1)
        if pool_type == "max":
            v = patch.max(-1)
        elif pool_type == "sum":
            v = patch.sum(-1)
        else:
            v = patch.sum(-1) / (padded if count_include_pad else patch.shape[-1])
        out[(slice(None), slice(None)) + o] = v
    return out


POOL_CASES = [
    ((2, 3, 7, 6), (2, 2), (2, 2), (0, 0), "valid"),
    ((2, 2, 7, 7), (3, 3), (2, 2), (1, 1), "valid"),
    ((1, 2, 7, 6), (3, 2), (2, 2), (0, 0), "full"),
    ((2, 3, 9), (3,), (2,), (1,), "valid"),
    ((1, 2, 4, 5, 6), (2, 2, 3), (2, 1, 3), (0, 1, 0), "valid"),
    ((2, 2, 5, 6, 7), (2, 3, 2), (2, 3, 2), (0, 0, 0), "valid"),
    # Overlapping windows: float32 max pooling runs as a stencil over stride-phased planes.
    ((1, 3, 14, 15), (3, 3), (2, 2), (1, 1), "valid"),
    ((2, 2, 11, 9), (3, 3), (3, 3), (2, 2), "valid"),
    ((1, 2, 5, 7), (3, 3), (1, 1), (1, 1), "valid"),
]


@pytest.mark.parametrize("pool_type", ["max", "avg", "sum"])
@pytest.mark.parametrize("case", range(len(POOL_CASES)))
def test_pooling(pool_type, case, ctx):
    shape, kernel, stride, pad, convention = POOL_CASES[case]
    x = np.random.RandomState(case).randn(*shape)
    kwargs = dict(kernel=kernel, stride=stride, pad=pad, pool_type=pool_type, pooling_convention=convention)
    expected = _pool_reference(x, kernel, stride, pad, pool_type, convention)
    for dtype, rtol in (("float64", 1e-10), ("float32", 1e-5)):
        out = nd.Pooling(nd.array(x, ctx=ctx, dtype=dtype), **kwargs)
        assert_almost_equal(out.asnumpy(), expected, rtol=rtol, atol=rtol)
    check_gradient(lambda v: nd.Pooling(v, **kwargs), [shape], ctx, dtypes=["float64", "float32", "float16", "bfloat16"])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kernel", [(2, 2), (3, 2)])
def test_max_pooling_gradient_goes_to_the_first_maximum_of_each_window(kernel, dtype, ctx):
    # Windows that tile the input take a dedicated path; ties must still go to the first cell.
    rng = np.random.RandomState(5)
    x = rng.randint(0, 3, size=(2, 3, 7, 8)).astype(np.float32)
    x[0, 0, 0, 1] = np.nan
    head_nd = nd.array(rng.randn(2, 3, 7 // kernel[0], 8 // kernel[1]), ctx=ctx, dtype=dtype)
    head = head_nd.astype("float32").asnumpy()
    a = nd.array(x, ctx=ctx, dtype=dtype)
    a.attach_grad()
    with autograd.record():
        y = nd.Pooling(a, kernel=kernel, stride=kernel, pool_type="max")
    y.backward(head_nd)
    y, grad = y.astype("float32"), a.grad.astype("float32")
    expected_grad = np.zeros_like(x)
    expected_out = np.zeros_like(head)
    for n, c, i, j in np.ndindex(*head.shape):
        window = x[n, c, i * kernel[0]:(i + 1) * kernel[0], j * kernel[1]:(j + 1) * kernel[1]]
        flat = window.reshape(-1)
        first = int(np.argmax(np.isnan(flat))) if np.isnan(flat).any() else int(np.argmax(flat))
        expected_out[n, c, i, j] = flat[first]
        di, dj = divmod(first, kernel[1])
        expected_grad[n, c, i * kernel[0] + di, j * kernel[1] + dj] = head[n, c, i, j]
    np.testing.assert_array_equal(y.asnumpy(), expected_out)
    np.testing.assert_array_equal(grad.asnumpy(), expected_grad)


def test_overlapping_max_pooling_ignores_padding_and_keeps_nan(ctx):
    # All values negative: a padding value of zero would show at the borders.
    x = -1 - np.random.RandomState(8).rand(2, 3, 9, 10).astype(np.float32)
    x[1, 2, 4, 4] = np.nan
    for dtype in ("float32", "float64"):
        out = nd.Pooling(nd.array(x, ctx=ctx, dtype=dtype), kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max").asnumpy()
        expected = _pool_reference(np.nan_to_num(x, nan=-np.inf), (3, 3), (2, 2), (1, 1), "max")
        expected[1, 2, 2, 2] = np.nan  # the one window covering (4, 4): padded rows and columns 4..6
        np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_global_and_lp_pooling_and_pad_counting(ctx):
    x = np.random.RandomState(3).randn(2, 3, 5, 4)
    a = nd.array(x, ctx=ctx, dtype="float64")
    assert_almost_equal(nd.Pooling(a, global_pool=True, pool_type="avg").asnumpy(), x.mean(axis=(2, 3), keepdims=True), rtol=1e-10)
    assert_almost_equal(nd.Pooling(a, global_pool=True, kernel=(1, 1), pool_type="max").asnumpy(), x.max(axis=(2, 3), keepdims=True), rtol=1e-10)
    lp = nd.Pooling(a, kernel=(2, 2), stride=(2, 2), pool_type="lp", p_value=2).asnumpy()
    ref = np.sqrt(_pool_reference(x ** 2, (2, 2), (2, 2), (0, 0), "sum"))
    assert_almost_equal(lp, ref, rtol=1e-10)
    excl = nd.Pooling(a, kernel=(3, 3), stride=(1, 1), pad=(1, 1), pool_type="avg", count_include_pad=False).asnumpy()
    assert_almost_equal(excl, _pool_reference(x, (3, 3), (1, 1), (1, 1), "avg", count_include_pad=False), rtol=1e-10)
    check_gradient(lambda v: nd.Pooling(v, kernel=(2, 2), stride=(2, 2), pool_type="lp", p_value=2), [(1, 2, 4, 4)], ctx,
                   dtypes=["float64"])
    with pytest.raises(mx.MXNetError, match="pool_type"):
        nd.Pooling(a, kernel=(2, 2), pool_type="median")


# ---- normalization and embedding ----------------------------------------------------------------

@pytest.mark.parametrize("fix_gamma", [True, False])
def test_batch_norm_training_and_inference(fix_gamma, ctx):
    rng = np.random.RandomState(12)
    x, gamma, beta = rng.randn(4, 3, 5), rng.rand(3) + 0.5, rng.randn(3)
    mm, mv = rng.randn(3), rng.rand(3) + 0.5
    arr = lambda v: nd.array(v, ctx=ctx, dtype="float64")  # noqa: E731
    data, moving_mean, moving_var = arr(x), arr(mm), arr(mv)
    g = 1.0 if fix_gamma else gamma[None, :, None]
    with autograd.record():
        out = nd.BatchNorm(data, arr(gamma), arr(beta), moving_mean, moving_var, fix_gamma=fix_gamma, eps=1e-3, momentum=0.8)
    mean, var = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
    expected = (x - mean[None, :, None]) / np.sqrt(var[None, :, None] + 1e-3) * g + beta[None, :, None]
    assert_almost_equal(out.asnumpy(), expected, rtol=1e-10)
    assert_almost_equal(moving_mean.asnumpy(), 0.8 * mm + 0.2 * mean, rtol=1e-10)
    assert_almost_equal(moving_var.asnumpy(), 0.8 * mv + 0.2 * var, rtol=1e-10)
    infer = nd.BatchNorm(data, arr(gamma), arr(beta), arr(mm), arr(mv), fix_gamma=fix_gamma, eps=1e-3)
    expected = (x - mm[None, :, None]) / np.sqrt(mv[None, :, None] + 1e-3) * g + beta[None, :, None]
    assert_almost_equal(infer.asnumpy(), expected, rtol=1e-10)
    outs = nd.BatchNorm(data, arr(gamma), arr(beta), arr(mm), arr(mv), output_mean_var=True)
    assert len(outs) == 3

    def train_bn(v, gm, bt):
        with autograd.train_mode():
            return nd.BatchNorm(v, gm, bt, arr(mm), arr(mv), fix_gamma=fix_gamma)
    check_gradient(train_bn, [(4, 3, 5), (3,), (3,)], ctx, dtypes=["float64"])


def test_layer_norm(ctx):
    rng = np.random.RandomState(13)
    x, gamma, beta = rng.randn(3, 4, 5), rng.rand(5) + 0.5, rng.randn(5)
    out = nd.LayerNorm(nd.array(x, ctx=ctx, dtype="float64"), nd.array(gamma, ctx=ctx, dtype="float64"),
                       nd.array(beta, ctx=ctx, dtype="float64"), eps=1e-5)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    assert_almost_equal(out.asnumpy(), (x - mean) / np.sqrt(var + 1e-5) * gamma + beta, rtol=1e-10)
    check_gradient(lambda v, gm, bt: nd.LayerNorm(v, gm, bt), [(3, 4, 5), (5,), (5,)], ctx, dtypes=["float64"])
    check_gradient(lambda v, gm, bt: nd.LayerNorm(v, gm, bt, axis=1), [(3, 4, 5), (4,), (4,)], ctx, dtypes=["float64"])


def test_embedding(ctx):
    rng = np.random.RandomState(14)
    weight = rng.randn(6, 3)
    idx = np.array([[0, 5, 2], [2, 2, 1]])
    out = nd.Embedding(nd.array(idx, ctx=ctx), nd.array(weight, ctx=ctx), input_dim=6, output_dim=3)
    assert_almost_equal(out.asnumpy(), weight[idx], rtol=1e-6)
    w = nd.array(weight, ctx=ctx, dtype="float64")
    w.attach_grad()
    with autograd.record():
        y = nd.Embedding(nd.array(idx, ctx=ctx), w, input_dim=6, output_dim=3)
    y.backward()
    expected = np.zeros((6, 3))
    np.add.at(expected, idx.reshape(-1), np.ones(3))
    assert_almost_equal(w.grad.asnumpy(), expected)


def test_convolution_weight_gradient_without_data_gradient(ctx):
    rng = np.random.RandomState(15)
    x, w = nd.array(rng.randn(2, 3, 6, 6), ctx=ctx, dtype="float64"), rng.randn(4, 3, 3, 3)
    grads = []
    for attach_data in (False, True):
        weight = nd.array(w, ctx=ctx, dtype="float64")
        weight.attach_grad()
        data = x.copy()
        if attach_data:
            data.attach_grad()
        with autograd.record():
            y = nd.Convolution(data, weight, kernel=(3, 3), num_filter=4, no_bias=True)
        y.backward()
        grads.append(weight.grad.asnumpy())
    assert_almost_equal(grads[0], grads[1], rtol=1e-12)


@pytest.mark.parametrize("sigma", [1.0, 2.5])
def test_smooth_l1(sigma, ctx):
    x = np.random.RandomState(5).uniform(-2, 2, size=(4, 6))
    x[np.abs(np.abs(x) - 1 / sigma ** 2) < 0.05] = 0.9 / sigma ** 2
    s2 = sigma * sigma
    expected = np.where(np.abs(x) < 1 / s2, 0.5 * s2 * x * x, np.abs(x) - 0.5 / s2)
    assert_almost_equal(nd.smooth_l1(nd.array(x, ctx=ctx), scalar=sigma).asnumpy(), expected, rtol=1e-5, atol=1e-6)

    def make(rng):
        v = rng.uniform(-2, 2, size=(3, 5))
        v[np.abs(np.abs(v) - 1 / s2) < 0.05] = 0.5 / s2
        return [v]
    check_gradient(lambda v: nd.smooth_l1(v, scalar=sigma), None, ctx, make=make, dtypes=["float64", "float32"])
    with pytest.raises(mx.MXNetError, match="positive"):
        nd.smooth_l1(nd.array(x, ctx=ctx), scalar=0.0)


def test_softmax_cross_entropy(ctx):
    rng = np.random.RandomState(6)
    x = rng.randn(5, 4)
    label = np.array([0, 3, 1, 1, 2])
    logp = np.log(_softmax(x))
    out = nd.softmax_cross_entropy(nd.array(x, ctx=ctx), nd.array(label, ctx=ctx))
    assert out.shape == (1,)
    assert_almost_equal(out.asnumpy(), [-logp[np.arange(5), label].sum()], rtol=1e-5, atol=1e-6)

    check_gradient(lambda v: nd.softmax_cross_entropy(v, nd.array(label, dtype=v.dtype, ctx=ctx)), [(5, 4)], ctx,
                   dtypes=["float64", "float32"])
    with pytest.raises(mx.MXNetError, match="one class index per row"):
        nd.softmax_cross_entropy(nd.array(x, ctx=ctx), nd.array(label[:3], ctx=ctx))
    with pytest.raises(mx.MXNetError, match="not a class index"):
        nd.softmax_cross_entropy(nd.array(x, ctx=ctx), nd.array([0, 9, 1, 1, 2], ctx=ctx)).asnumpy()


EXTRA = __import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures" / "extra"


def _norm_cases(ref):
    return [
        ("gn", lambda a, g, b: nd.GroupNorm(a, g, b, num_groups=2), [ref["g2"], ref["b2"]]),
        ("in", lambda a, g, b: nd.InstanceNorm(a, g, b), [ref["g6"], ref["b6"]]),
    ] + [("l2" + m, (lambda mode: lambda a: nd.L2Normalization(a, mode=mode))(m), []) for m in ("instance", "channel", "spatial")]


def test_group_instance_l2_normalization_match_mxnet():
    ref = nd.load(str(EXTRA / "norm-ops.params"))
    for name, fn, params in _norm_cases(ref):
        inputs = [ref["x"].copy()] + [p.copy() for p in params]
        for v in inputs:
            v.attach_grad()
        with autograd.record():
            out = fn(*inputs)
        out.backward(ref["hg"])
        assert_almost_equal(out.asnumpy(), ref[name].asnumpy(), rtol=1e-5, atol=1e-6)
        for v, suffix in zip(inputs, ["_dx", "_dg", "_db"]):
            assert_almost_equal(v.grad.asnumpy(), ref[name + suffix].asnumpy(), rtol=1e-4, atol=1e-5)


def test_group_instance_l2_normalization_gradients_and_errors(ctx):
    check_gradient(lambda a, g, b: nd.GroupNorm(a, g, b, num_groups=3), [(2, 6, 4), (3,), (3,)], ctx, dtypes=["float64"])
    check_gradient(lambda a, g, b: nd.InstanceNorm(a, g, b), [(2, 3, 5), (3,), (3,)], ctx, dtypes=["float64"])
    for mode in ("instance", "channel", "spatial"):
        check_gradient(lambda a: nd.L2Normalization(a, mode=mode), [(2, 3, 4)], ctx, dtypes=["float64"])
    with pytest.raises(mx.MXNetError, match="cannot be split into 4 groups"):
        nd.GroupNorm(nd.ones((2, 6, 3), ctx=ctx), nd.ones((4,), ctx=ctx), nd.ones((4,), ctx=ctx), num_groups=4)
    with pytest.raises(mx.MXNetError, match=r"invalid value 'pixel' for parameter 'mode' \(\{'instance', 'channel', 'spatial'\}\)"):
        nd.L2Normalization(nd.ones((2, 3), ctx=ctx), mode="pixel")
    sym = mx.sym.GroupNorm(mx.sym.var("data"), num_groups=2, name="gn")
    assert sym.infer_shape(data=(2, 6, 4, 4))[0] == [(2, 6, 4, 4), (2,), (2,)]


def test_lrn_and_upsampling_match_mxnet():
    ref = nd.load(str(EXTRA / "local-ops.params"))
    for name, fn, head in [("lrn", lambda a: nd.LRN(a, nsize=3, alpha=0.01, beta=0.75, knorm=2), "hg"),
                           ("up", lambda a: nd.UpSampling(a, scale=2, sample_type="nearest"), "hg2")]:
        a = ref["x"].copy()
        a.attach_grad()
        with autograd.record():
            out = fn(a)
        out.backward(ref[head])
        assert_almost_equal(out.asnumpy(), ref[name].asnumpy(), rtol=1e-5, atol=1e-6)
        assert_almost_equal(a.grad.asnumpy(), ref[name + "_dx"].asnumpy(), rtol=1e-4, atol=1e-5)


def test_lrn_and_upsampling_gradients_and_errors(ctx):
    check_gradient(lambda a: nd.LRN(a, nsize=5, alpha=0.1), [(2, 6, 3)], ctx, dtypes=["float64"])
    check_gradient(lambda a: nd.UpSampling(a, scale=3, sample_type="nearest"), [(1, 2, 2, 3)], ctx, dtypes=["float64"])
    with pytest.raises(mx.MXNetError, match="odd"):
        nd.LRN(nd.ones((1, 4, 2), ctx=ctx), nsize=2)
    with pytest.raises(mx.MXNetError, match=r"invalid value 'cubic' for parameter 'sample_type' \(\{'nearest', 'bilinear'\}\)"):
        nd.UpSampling(nd.ones((1, 1, 2, 2), ctx=ctx), scale=2, sample_type="cubic")
