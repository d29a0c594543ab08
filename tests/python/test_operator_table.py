"""Every registered operator of the foundation, against NumPy, for every dtype it supports."""

import json
import math

import numpy as np
import pytest

import oxnet as mx
from oxnet.test_utils import assert_almost_equal

FLOATS = ["float32", "float64", "float16", "bfloat16"]
INTS = ["int32", "int64", "int8", "uint8"]
ALL = FLOATS + INTS


def _np_dtype(dtype):
    """NumPy stand-in for reference math: bfloat16 values are held (exactly) in float32."""
    return "float32" if dtype == "bfloat16" else dtype


def _to_bf16_grid(x):
    """Round float32 values to the nearest bfloat16 (ties to even), kept as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def _data(shape, dtype, low=-2.0, high=2.0, seed=0):
    rng = np.random.RandomState(seed)
    if dtype in INTS:
        lo = 0 if dtype == "uint8" else -5
        return rng.randint(lo, 6, size=shape).astype(dtype)
    x = rng.uniform(low, high, size=shape).astype(_np_dtype(dtype))
    return _to_bf16_grid(x) if dtype == "bfloat16" else x


def _check(out, expected, dtype):
    expected = np.asarray(expected)
    assert out.shape == expected.shape, (out.shape, expected.shape)
    assert out.dtype == (mx.base.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)), (out.dtype, dtype)
    if dtype == "bfloat16":
        out = out.astype("float32")
    rtol, atol = {"float16": (2e-2, 2e-2), "bfloat16": (2e-2, 3e-2), "float32": (1e-4, 1e-5),
                  "float64": (1e-10, 1e-12)}.get(dtype, (0, 0))
    assert_almost_equal(out.asnumpy().astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)


def _digamma(x):
    """digamma: the recurrence psi(x) = psi(x + 1) - 1/x up to x >= 8, then the asymptotic series."""
    x, shift = float(x), 0.0
    while x < 8:
        shift -= 1 / x
        x += 1
    inv2 = 1 / (x * x)
    series = inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 * (1 / 252 - inv2 * (1 / 240 - inv2 / 132))))
    return shift + math.log(x) - 0.5 / x - series


# name: (numpy reference, input domain (low, high), dtypes)
UNARY = {
    "abs": (np.abs, (-2, 2), ALL),
    "sign": (np.sign, (-2, 2), ALL),
    "round": (lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5), (-3, 3), FLOATS),
    "rint": (np.rint, (-3, 3), FLOATS),
    "ceil": (np.ceil, (-3, 3), FLOATS),
    "floor": (np.floor, (-3, 3), FLOATS),
    "trunc": (np.trunc, (-3, 3), FLOATS),
    "fix": (np.fix, (-3, 3), FLOATS),
    "square": (np.square, (-2, 2), ALL),
    "sqrt": (np.sqrt, (0.1, 4), FLOATS),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.1, 4), FLOATS),
    "cbrt": (np.cbrt, (-4, 4), FLOATS),
    "rcbrt": (lambda x: 1 / np.cbrt(x), (0.1, 4), FLOATS),
    "exp": (np.exp, (-2, 2), FLOATS),
    "expm1": (np.expm1, (-1, 1), FLOATS),
    "log": (np.log, (0.1, 4), FLOATS),
    "log10": (np.log10, (0.1, 4), FLOATS),
    "log2": (np.log2, (0.1, 4), FLOATS),
    "log1p": (np.log1p, (-0.5, 2), FLOATS),
    "sin": (np.sin, (-3, 3), FLOATS),
    "cos": (np.cos, (-3, 3), FLOATS),
    "tan": (np.tan, (-1, 1), FLOATS),
    "arcsin": (np.arcsin, (-0.9, 0.9), FLOATS),
    "arccos": (np.arccos, (-0.9, 0.9), FLOATS),
    "arctan": (np.arctan, (-3, 3), FLOATS),
    "sinh": (np.sinh, (-2, 2), FLOATS),
    "cosh": (np.cosh, (-2, 2), FLOATS),
    "tanh": (np.tanh, (-2, 2), FLOATS),
    "arcsinh": (np.arcsinh, (-2, 2), FLOATS),
    "arccosh": (np.arccosh, (1.1, 3), FLOATS),
    "arctanh": (np.arctanh, (-0.9, 0.9), FLOATS),
    "degrees": (np.degrees, (-3, 3), FLOATS),
    "radians": (np.radians, (-90, 90), FLOATS),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), (-4, 4), FLOATS),
    "relu": (lambda x: np.maximum(x, 0), (-2, 2), ALL),
    "softsign": (lambda x: x / (1 + np.abs(x)), (-2, 2), FLOATS),
    "reciprocal": (np.reciprocal, (0.5, 3), FLOATS),
    "negative": (np.negative, (-2, 2), ["float32", "float64", "float16", "int32", "int64", "int8"]),
    "logical_not": (lambda x: (x == 0).astype(x.dtype), (-2, 2), ALL),
    "erf": (np.vectorize(math.erf), (-2, 2), FLOATS),
    "gamma": (np.vectorize(math.gamma), (0.2, 4), FLOATS),
    "gammaln": (np.vectorize(math.lgamma), (0.2, 6), FLOATS),
    "_digamma": (np.vectorize(_digamma), (0.2, 6), FLOATS),
    "_softrelu": (lambda x: np.log1p(np.exp(x)), (-4, 4), FLOATS),
    "_copy": (np.copy, (-2, 2), ALL),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name, ctx):
    ref, (low, high), dtypes = UNARY[name]
    for dtype in dtypes:
        x = _data((3, 17), dtype, low, high)
        if dtype in INTS and name in ("abs", "sign", "square", "relu", "negative"):
            x = np.clip(x, -5, 5).astype(dtype)
        out = getattr(mx.nd, name)(mx.nd.array(x, ctx=ctx, dtype=dtype))
        expected = ref(x.astype(np.float64) if dtype in ("float16", "bfloat16") else x)
        _check(out, expected.astype(dtype) if dtype in INTS else expected, dtype)


BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "mod": np.mod,
    "power": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "hypot": np.hypot,
    "equal": lambda a, b: (a == b).astype(a.dtype),
    "not_equal": lambda a, b: (a != b).astype(a.dtype),
    "greater": lambda a, b: (a > b).astype(a.dtype),
    "greater_equal": lambda a, b: (a >= b).astype(a.dtype),
    "lesser": lambda a, b: (a < b).astype(a.dtype),
    "lesser_equal": lambda a, b: (a <= b).astype(a.dtype),
    "logical_and": lambda a, b: np.logical_and(a, b).astype(a.dtype),
    "logical_or": lambda a, b: np.logical_or(a, b).astype(a.dtype),
    "logical_xor": lambda a, b: np.logical_xor(a, b).astype(a.dtype),
}
# The same-shape form of each broadcast operator.
ELEMWISE_NAME = {"add": "elemwise_add", "sub": "elemwise_sub", "mul": "elemwise_mul", "div": "elemwise_div",
                 **{name: "_" + name for name in BINARY if name not in ("add", "sub", "mul", "div")}}
BROADCAST_SHAPES = [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 1, 5), (3, 1)), ((1,), (2, 2)), ((2, 1, 3), (2, 4, 1)),
                    ((0, 3), (1, 3)), ((5, 70000), (5, 1))]


def _binary_inputs(name, sa, sb, dtype):
    a, b = _data(sa, dtype, seed=1), _data(sb, dtype, seed=2)
    if name in ("div", "mod"):
        b = np.where(b == 0, 1, b).astype(_np_dtype(dtype))
        if dtype in FLOATS:
            b = np.where(np.abs(b) < 0.25, 0.5, b).astype(_np_dtype(dtype))
    if name == "power":
        a = np.abs(a).astype(_np_dtype(dtype)) + (1 if dtype in INTS else 0.5)
        b = (np.abs(b) % 3).astype(_np_dtype(dtype))
    if name in ("equal", "not_equal", "greater_equal", "lesser_equal") and sa == sb:
        b[..., 0] = a[..., 0]  # make some elements equal
    return a, b


@pytest.mark.parametrize("name", sorted(BINARY))
def test_broadcast_binary(name, ctx):
    dtypes = ALL if name not in ("hypot",) else FLOATS
    for dtype in dtypes:
        if dtype == "uint8" and name in ("sub", "mod", "power"):
            continue  # NumPy's uint8 wrap-around / promotion differs from a same-dtype reference
        for sa, sb in BROADCAST_SHAPES:
            a, b = _binary_inputs(name, sa, sb, dtype)
            ref = BINARY[name]
            if dtype in INTS and name == "div":
                ref = lambda x, y: np.trunc(x / y)  # noqa: E731 (MXNet truncates integer division)
            low_precision = dtype in ("float16", "bfloat16")
            expected = ref(a.astype(np.float64), b.astype(np.float64)) if low_precision else ref(a, b)
            out = getattr(mx.nd, "broadcast_" + name)(mx.nd.array(a, ctx=ctx, dtype=dtype), mx.nd.array(b, ctx=ctx, dtype=dtype))
            _check(out, np.asarray(expected).astype(_np_dtype(dtype)), dtype)


@pytest.mark.parametrize("dtype", ALL)
def test_backward_relu(dtype, ctx):
    """relu's gradient from its output: ograd where y > 0, else 0."""
    g, y = _data((3, 5), dtype, seed=1), _data((3, 5), dtype, seed=2)
    if dtype != "uint8":
        y[0, :2] = 0  # exactly zero passes nothing through
    out = mx.nd._backward_relu(mx.nd.array(g, ctx=ctx, dtype=dtype), mx.nd.array(y, ctx=ctx, dtype=dtype))
    _check(out, np.where(y > 0, g, 0).astype(_np_dtype(dtype)), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_nan_propagates_through_maximum_minimum_and_relu(dtype, ctx):
    """A NaN on either side of maximum/minimum, or into relu, stays NaN (as NumPy and MXNet), and
    relu's gradient at a NaN is NaN rather than a silent 0."""
    a, b = _data((4, 6), dtype, seed=3), _data((4, 6), dtype, seed=4)
    a[0, :3] = np.nan
    b[1, 2:] = np.nan
    a_nd, b_nd = mx.nd.array(a, ctx=ctx, dtype=dtype), mx.nd.array(b, ctx=ctx, dtype=dtype)
    for name, ref in (("maximum", np.maximum), ("minimum", np.minimum)):
        _check(getattr(mx.nd, name)(a_nd, b_nd), ref(a, b), dtype)
        _check(getattr(mx.nd, name)(b_nd, a_nd), ref(b, a), dtype)
        _check(getattr(mx.nd, "broadcast_" + name)(a_nd, b_nd[:1]), ref(a, b[:1]), dtype)
    _check(mx.nd.relu(a_nd), np.maximum(a, 0), dtype)
    _check(mx.nd.Activation(a_nd, act_type="relu"), np.maximum(a, 0), dtype)
    a_nd.attach_grad()
    with mx.autograd.record():
        y = mx.nd.relu(a_nd)
    y.backward()
    _check(a_nd.grad, np.where(np.isnan(a), np.nan, (a > 0).astype(np.float32)), dtype)


@pytest.mark.parametrize("name", sorted(ELEMWISE_NAME))
def test_elemwise_requires_equal_shapes(name, ctx):
    a, b = _binary_inputs(name, (3, 4), (3, 4), "float32")
    out = getattr(mx.nd, ELEMWISE_NAME[name])(mx.nd.array(a, ctx=ctx), mx.nd.array(b, ctx=ctx))
    _check(out, BINARY[name](a, b), "float32")
    with pytest.raises(mx.MXNetError, match=r"same shape.*\(3, 4\).*\(4,\)"):
        getattr(mx.nd, ELEMWISE_NAME[name])(mx.nd.array(a, ctx=ctx), mx.nd.ones((4,), ctx=ctx))


SCALAR = {
    "_plus_scalar": lambda x, s: x + s,
    "_minus_scalar": lambda x, s: x - s,
    "_rminus_scalar": lambda x, s: s - x,
    "_mul_scalar": lambda x, s: x * s,
    "_div_scalar": lambda x, s: x / s,
    "_rdiv_scalar": lambda x, s: s / x,
    "_mod_scalar": lambda x, s: np.mod(x, s),
    "_rmod_scalar": lambda x, s: np.mod(s, x),
    "_power_scalar": lambda x, s: np.power(x, s),
    "_rpower_scalar": lambda x, s: np.power(s, x),
    "_maximum_scalar": np.maximum,
    "_minimum_scalar": np.minimum,
    "_hypot_scalar": np.hypot,
    "_equal_scalar": lambda x, s: (x == s).astype(x.dtype),
    "_not_equal_scalar": lambda x, s: (x != s).astype(x.dtype),
    "_greater_scalar": lambda x, s: (x > s).astype(x.dtype),
    "_greater_equal_scalar": lambda x, s: (x >= s).astype(x.dtype),
    "_lesser_scalar": lambda x, s: (x < s).astype(x.dtype),
    "_lesser_equal_scalar": lambda x, s: (x <= s).astype(x.dtype),
    "_logical_and_scalar": lambda x, s: np.logical_and(x, s).astype(x.dtype),
    "_logical_or_scalar": lambda x, s: np.logical_or(x, s).astype(x.dtype),
    "_logical_xor_scalar": lambda x, s: np.logical_xor(x, s).astype(x.dtype),
}


@pytest.mark.parametrize("name", sorted(SCALAR))
def test_scalar_ops(name, ctx):
    for dtype in FLOATS + ["int32", "int64"]:
        x = _data((4, 5), dtype, 0.5, 3.0)
        if dtype in INTS:
            x = np.abs(x).astype(_np_dtype(dtype)) + 1
        s = 2.0
        out = getattr(mx.nd._internal, name)(mx.nd.array(x, ctx=ctx, dtype=dtype), scalar=s)
        expected = SCALAR[name](x.astype(np.float64), s)
        if dtype in INTS:
            if name == "_rdiv_scalar":
                expected = np.trunc(s / x.astype(np.float64))
            if name == "_div_scalar":
                expected = np.trunc(x / s)
        _check(out, expected.astype(_np_dtype(dtype)), dtype)


def test_python_operators_match_numpy(ctx):
    a = _data((3, 4), "float32", 0.5, 2.0)
    b = _data((4,), "float32", 0.5, 2.0, seed=3)
    x, y = mx.nd.array(a, ctx=ctx), mx.nd.array(b, ctx=ctx)
    cases = [
        (x + y, a + b), (x - y, a - b), (x * y, a * b), (x / y, a / b), (x % y, np.mod(a, b)), (x ** y, a ** b),
        (x + 1, a + 1), (1 + x, 1 + a), (3 - x, 3 - a), (2 * x, 2 * a), (2 / x, 2 / a), (x ** 2, a ** 2),
        (2 ** x, 2 ** a), (-x, -a), (abs(-x), a), (x > 1, (a > 1).astype("float32")), (x == x, np.ones_like(a)),
        (x < y, (a < b).astype("float32")), (x != 1, (a != 1).astype("float32")),
    ]
    for out, expected in cases:
        _check(out, expected, "float32")


def test_inplace_operators_write_into_the_same_array(ctx):
    a = _data((3, 4), "float32")
    x = mx.nd.array(a, ctx=ctx)
    handle = x.handle
    x += 1
    x *= mx.nd.array(np.full((4,), 2.0), ctx=ctx)
    x -= 0.5
    x /= 2
    assert x.handle is handle
    _check(x, ((a + 1) * 2 - 0.5) / 2, "float32")
    with pytest.raises(mx.MXNetError, match="out"):
        y = mx.nd.ones((4,), ctx=ctx)
        y += mx.nd.ones((3, 4), ctx=ctx)


REDUCE = {"sum": np.sum, "mean": np.mean, "prod": np.prod, "max": np.max, "min": np.min,
          "nansum": np.nansum, "nanprod": np.nanprod}
AXES = [None, 0, 1, -1, (0, 2), (1, 2), ()]


@pytest.mark.parametrize("name", sorted(REDUCE))
def test_reductions(name, ctx):
    for dtype in ["float32", "float64", "float16", "bfloat16", "int32", "int64"]:
        x = _data((3, 4, 5), dtype, 0.5, 1.5)
        for axis in AXES:
            for keepdims in (False, True):
                for exclude in ((False, True) if axis not in (None, ()) else (False,)):
                    kwargs = dict(keepdims=keepdims, exclude=exclude)
                    if axis is not None:
                        kwargs["axis"] = axis
                    out = getattr(mx.nd, name)(mx.nd.array(x, ctx=ctx, dtype=dtype), **kwargs)
                    np_axis = None if axis in (None, ()) else axis
                    if exclude:
                        given = {a % 3 for a in (axis if isinstance(axis, tuple) else (axis,))}
                        np_axis = tuple(a for a in range(3) if a not in given)
                    expected = REDUCE[name](x.astype(np.float64), axis=np_axis, keepdims=keepdims)
                    expected = np.asarray(expected)
                    if expected.ndim == 0:
                        expected = expected.reshape(1)  # MXNet 1.x full reductions have shape (1,)
                    if dtype in INTS:
                        expected = np.trunc(expected)
                    _check(out, expected.astype(_np_dtype(dtype)), dtype)


def test_large_reductions_are_accurate(ctx):
    x = np.random.RandomState(0).uniform(0, 1, size=(1 << 22,)).astype(np.float32)
    out = mx.nd.sum(mx.nd.array(x, ctx=ctx))
    assert abs(out.asscalar() - x.astype(np.float64).sum()) / x.sum() < 1e-6
    m = x.reshape(64, -1)
    _check(mx.nd.max(mx.nd.array(m, ctx=ctx), axis=1), m.max(axis=1), "float32")
    _check(mx.nd.sum(mx.nd.array(m, ctx=ctx), axis=0), m.astype(np.float64).sum(axis=0), "float32")


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"])
def test_dot(dtype, ctx):
    cases = [((3, 4), (4, 5), False, False), ((4, 3), (4, 5), True, False), ((3, 4), (5, 4), False, True),
             ((4, 3), (5, 4), True, True), ((7,), (7,), False, False), ((2, 3, 4), (4, 6), False, False),
             ((3, 4), (4, 2, 2), False, False), ((4, 2, 3), (4, 5), True, False), ((130, 70), (70, 90), False, False),
             # x * W^T large enough to split into column bands of W as stored (ragged last
             # band), with a plain and a transposed left operand.
             ((130, 70), (83, 70), False, True), ((70, 133), (90, 70), True, True),
             # Few outputs over a long k: float32 row-dot kernel, blocks ragged on both sides
             # and a k tail shorter than a vector.
             ((7, 1037), (13, 1037), False, True)]
    for sa, sb, ta, tb in cases:
        if dtype == "uint8" and max(sa) > 1000:
            continue  # sums of a thousand uint8 products overflow
        a, b = _data(sa, dtype, -1, 1, seed=4), _data(sb, dtype, -1, 1, seed=5)
        if dtype == "uint8":
            a, b = a % 3, b % 3
        out = mx.nd.dot(mx.nd.array(a, ctx=ctx, dtype=dtype), mx.nd.array(b, ctx=ctx, dtype=dtype),
                        transpose_a=ta, transpose_b=tb)
        a2 = a.reshape(a.shape[0], -1).T if ta else a.reshape(-1, a.shape[-1])
        b2 = b.reshape(-1, b.shape[-1]).T if tb else b.reshape(b.shape[0], -1)
        if a.ndim == 1 and b.ndim == 1:
            expected = np.array([np.dot(a.astype(np.float64), b.astype(np.float64))])
        else:
            oshape = (a.shape[1:] if ta else a.shape[:-1]) + (b.shape[:-1] if tb else b.shape[1:])
            expected = (a2.astype(np.float64) @ b2.astype(np.float64)).reshape(oshape)
        if dtype in ("float16", "bfloat16"):
            got = (out.astype("float32") if dtype == "bfloat16" else out).asnumpy().astype(np.float64)
            assert_almost_equal(got, expected, rtol=2e-2, atol=1e-1)
        else:
            _check(out, expected.astype(dtype), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_batch_dot(dtype, ctx):
    for ta in (False, True):
        for tb in (False, True):
            a = _data((3, 5, 4) if ta else (3, 4, 5), dtype, -1, 1, seed=6)
            b = _data((3, 6, 5) if tb else (3, 5, 6), dtype, -1, 1, seed=7)
            out = mx.nd.batch_dot(mx.nd.array(a, ctx=ctx, dtype=dtype), mx.nd.array(b, ctx=ctx, dtype=dtype),
                                  transpose_a=ta, transpose_b=tb)
            at = a.transpose(0, 2, 1) if ta else a
            bt = b.transpose(0, 2, 1) if tb else b
            _check(out, np.matmul(at.astype(np.float64), bt.astype(np.float64)).astype(dtype), dtype)


@pytest.mark.parametrize("dtype", ALL + ["bool"])
def test_transpose(dtype, ctx):
    for shape, axes in [((3, 4), None), ((2, 3, 4), (1, 0, 2)), ((2, 3, 4), (2, 0, 1)), ((70, 90), (1, 0)),
                        ((3, 40, 50), (0, 2, 1)), ((2, 3, 4, 5), (3, 1, 0, 2))]:
        x = (_data(shape, "int32") % 2).astype(dtype) if dtype == "bool" else _data(shape, dtype)
        kwargs = {} if axes is None else {"axes": axes}
        _check(mx.nd.transpose(mx.nd.array(x, ctx=ctx, dtype=dtype), **kwargs), np.transpose(x, axes), dtype)


def test_concat_and_split(ctx):
    for dtype in ["float32", "int64", "float16", "bfloat16"]:
        a, b, c = (_data((2, k, 3), dtype, seed=k) for k in (1, 2, 3))
        out = mx.nd.concat(*(mx.nd.array(v, ctx=ctx, dtype=dtype) for v in (a, b, c)), dim=1)
        _check(out, np.concatenate([a, b, c], axis=1), dtype)
        out0 = mx.nd.Concat(mx.nd.array(a, ctx=ctx, dtype=dtype), mx.nd.array(a, ctx=ctx, dtype=dtype), dim=0)
        _check(out0, np.concatenate([a, a], axis=0), dtype)
        x = _data((4, 6, 2), dtype)
        parts = mx.nd.split(mx.nd.array(x, ctx=ctx, dtype=dtype), num_outputs=3, axis=1)
        for p, e in zip(parts, np.split(x, 3, axis=1)):
            _check(p, e, dtype)
        sq = mx.nd.SliceChannel(mx.nd.array(x, ctx=ctx, dtype=dtype), num_outputs=4, axis=0, squeeze_axis=True)
        for p, e in zip(sq, x):
            _check(p, e, dtype)
    with pytest.raises(mx.MXNetError, match="Concat"):
        mx.nd.concat(mx.nd.ones((2, 3), ctx=ctx), mx.nd.ones((3, 3), ctx=ctx), dim=1)
    with pytest.raises(mx.MXNetError, match="cannot be split"):
        mx.nd.split(mx.nd.ones((2, 5), ctx=ctx), num_outputs=2, axis=1)


@pytest.mark.parametrize("src", ALL + ["bool"])
def test_cast(src, ctx):
    x = _data((3, 5), "float32", -3, 3) if src in FLOATS else _data((3, 5), "int32")
    if src == "uint8":
        x = np.abs(x)
    x = _to_bf16_grid(x) if src == "bfloat16" else x.astype(src)
    for dst in ALL + ["bool"]:
        src_arr, xs = mx.nd.array(x, ctx=ctx, dtype=src), x
        if dst == "uint8" and src in FLOATS:
            src_arr, xs = mx.nd.abs(src_arr), np.abs(x)
        out = mx.nd.cast(src_arr, dtype=dst)
        if dst in INTS and src in FLOATS:
            expected = np.trunc(xs.astype(np.float64)).astype(dst)
        elif dst == "bfloat16":
            expected = _to_bf16_grid(xs.astype(np.float32))
        else:
            expected = xs.astype(dst)
        assert out.dtype == (mx.base.bfloat16 if dst == "bfloat16" else np.dtype(dst))
        got = out.astype("float32") if dst == "bfloat16" else out
        np.testing.assert_array_equal(got.asnumpy().astype(np.float64), expected.astype(np.float64))


AMP_FLOATS = ["float32", "float16", "bfloat16"]


@pytest.mark.parametrize("src", ALL)
def test_amp_cast(src, ctx):
    x = _data((3, 5), src)
    arr = mx.nd.array(x, ctx=ctx, dtype=src)
    for dst in AMP_FLOATS:
        out = mx.nd.amp_cast(arr, dtype=dst)
        if src in AMP_FLOATS:
            expected = _to_bf16_grid(x.astype(np.float32)) if dst == "bfloat16" else x.astype(dst)
            _check(out, expected, dst)
        else:
            # AMP casts only between its float types: float64 and integers pass through.
            _check(out, x, src)
    sym = mx.sym.amp_cast(mx.sym.var("x"), dtype="bfloat16")
    assert sym.infer_type(x=src)[1][0] == (mx.base.bfloat16 if src in AMP_FLOATS else np.dtype(src))


# (input dtypes, cast_narrow, output dtypes)
MULTICAST = [
    (["float16", "float32"], False, ["float32", "float32"]),
    (["bfloat16", "float16"], False, ["bfloat16", "bfloat16"]),
    (["float32", "bfloat16", "int32"], False, ["float32", "float32", "int32"]),
    (["float64", "float16"], False, ["float64", "float16"]),
    (["float32", "float16"], True, ["float16", "float16"]),
    (["bfloat16", "float32", "float32"], True, ["bfloat16", "bfloat16", "bfloat16"]),
    (["float32", "float32"], True, ["float32", "float32"]),
]


@pytest.mark.parametrize("case", range(len(MULTICAST)))
def test_amp_multicast(case, ctx):
    dtypes, narrow, expected_dtypes = MULTICAST[case]
    xs = [_data((2, 3), dtype, seed=i) for i, dtype in enumerate(dtypes)]
    arrays = [mx.nd.array(x, ctx=ctx, dtype=dtype) for x, dtype in zip(xs, dtypes)]
    outs = mx.nd.amp_multicast(*arrays, num_outputs=len(arrays), cast_narrow=narrow)
    for out, x, dtype in zip(outs, xs, expected_dtypes):
        expected = _to_bf16_grid(x.astype(np.float32)) if dtype == "bfloat16" else x.astype(_np_dtype(dtype))
        _check(out, expected, dtype)
    sym = mx.sym.amp_multicast(*[mx.sym.var("x%d" % i) for i in range(len(dtypes))], num_outputs=len(dtypes),
                               cast_narrow=narrow)
    assert sym.list_arguments() == ["x%d" % i for i in range(len(dtypes))]
    _, out_types, _ = sym.infer_type(**{"x%d" % i: d for i, d in enumerate(dtypes)})
    assert [t if t == mx.base.bfloat16 else np.dtype(t).name for t in out_types] == [
        mx.base.bfloat16 if d == "bfloat16" else d for d in expected_dtypes]


def test_all_finite_and_multi_all_finite(ctx):
    finite = _data((3, 4), "float32")
    for dtype in FLOATS:
        arr = mx.nd.array(finite, ctx=ctx).astype(dtype)
        assert mx.nd.all_finite(arr).asnumpy().tolist() == [1.0]
        for bad in (np.inf, -np.inf, np.nan):
            broken = finite.copy()
            broken[2, 1] = bad
            assert mx.nd.all_finite(mx.nd.array(broken, ctx=ctx).astype(dtype)).asnumpy().tolist() == [0.0]
    # Checked in float32, as MXNet does: a float64 beyond float32's range is an overflow.
    assert mx.nd.all_finite(mx.nd.array([1e300], ctx=ctx, dtype="float64")).asnumpy().tolist() == [0.0]
    a, b = mx.nd.array(finite, ctx=ctx), mx.nd.array([1.0, np.inf], ctx=ctx)
    out = mx.nd.multi_all_finite(a, a, num_arrays=2)
    assert out.dtype == np.float32 and out.shape == (1,) and out.asnumpy().tolist() == [1.0]
    assert mx.nd.multi_all_finite(a, b, num_arrays=2).asnumpy().tolist() == [0.0]
    # Without init_output a check only ever lowers the output: verdicts accumulate.
    for start, arrays, expected in [(1.0, [a], 1.0), (0.0, [a], 0.0), (1.0, [a, b], 0.0)]:
        verdict = mx.nd.array([start], ctx=ctx)
        mx.nd.multi_all_finite(*arrays, num_arrays=len(arrays), init_output=False, out=verdict)
        assert verdict.asnumpy().tolist() == [expected]
    with pytest.raises(mx.MXNetError, match="floating point"):
        mx.nd.all_finite(mx.nd.ones((2,), ctx=ctx, dtype="int32")).wait_to_read()


def test_random_uniform_normal_are_seeded_and_distributed(ctx):
    mx.random.seed(123)
    u1 = mx.nd.random.uniform(-1, 3, shape=(200, 500), ctx=ctx)
    n1 = mx.nd.random.normal(2, 0.5, shape=(200, 500), ctx=ctx, dtype="float64")
    mx.random.seed(123)
    u2 = mx.nd.random.uniform(-1, 3, shape=(200, 500), ctx=ctx)
    n2 = mx.nd.random.normal(2, 0.5, shape=(200, 500), ctx=ctx, dtype="float64")
    assert np.array_equal(u1.asnumpy(), u2.asnumpy()) and np.array_equal(n1.asnumpy(), n2.asnumpy())
    u, n = u1.asnumpy(), n1.asnumpy()
    assert u.dtype == np.float32 and n.dtype == np.float64
    assert u.min() >= -1 and u.max() < 3 and abs(u.mean() - 1) < 0.02 and abs(u.var() - 16 / 12) < 0.03
    assert abs(n.mean() - 2) < 0.01 and abs(n.std() - 0.5) < 0.01
    u3 = mx.random.uniform(shape=(200, 500), ctx=ctx)
    assert not np.array_equal(u3.asnumpy(), u)
    for dtype in ["float16", "float64"]:
        assert mx.nd.random.uniform(shape=(3,), dtype=dtype, ctx=ctx).dtype == np.dtype(dtype)


def test_creation_ops(ctx):
    for dtype in ALL:
        ref = _np_dtype(dtype)
        _check(mx.nd.zeros((2, 3), ctx=ctx, dtype=dtype), np.zeros((2, 3), ref), dtype)
        _check(mx.nd.ones((4,), ctx=ctx, dtype=dtype), np.ones((4,), ref), dtype)
        _check(mx.nd.full((2, 2), 7, ctx=ctx, dtype=dtype), np.full((2, 2), 7, ref), dtype)
    _check(mx.nd.arange(5, ctx=ctx), np.arange(5, dtype="float32"), "float32")
    _check(mx.nd.arange(1, 3, 0.5, ctx=ctx, dtype="float64"), np.arange(1, 3, 0.5), "float64")
    _check(mx.nd.arange(0, 3, repeat=2, ctx=ctx), np.repeat(np.arange(3, dtype="float32"), 2), "float32")
    x = mx.nd.array(_data((2, 3), "int32"), ctx=ctx, dtype="int32")
    _check(mx.nd.zeros_like(x), np.zeros((2, 3), "int32"), "int32")
    _check(mx.nd.ones_like(x), np.ones((2, 3), "int32"), "int32")
    assert mx.nd.empty((3, 0), ctx=ctx).shape == (3, 0)


def test_shape_ops(ctx):
    x = _data((2, 3, 4), "float32")
    a = mx.nd.array(x, ctx=ctx)
    _check(mx.nd.reshape(a, shape=(4, -1)), x.reshape(4, -1), "float32")
    _check(mx.nd.Reshape(a, shape=(-3, 0)), x.reshape(6, 4), "float32")
    _check(mx.nd.flatten(a), x.reshape(2, 12), "float32")
    _check(mx.nd.expand_dims(a, axis=1), x[:, None], "float32")
    _check(mx.nd.slice(a, begin=(0, 1), end=(2, 3)), x[0:2, 1:3], "float32")
    _check(mx.nd.slice(a, begin=(None, None, 3), end=(None, None, 0), step=(1, 2, -2)), x[:, ::2, 3:0:-2], "float32")
    _check(mx.nd.slice_axis(a, axis=2, begin=1, end=None), x[:, :, 1:], "float32")
    idx = np.array([[2, 0], [1, 1]])
    _check(mx.nd.take(a, mx.nd.array(idx, ctx=ctx), axis=1), np.take(x, idx, axis=1), "float32")
    _check(mx.nd.take(a, mx.nd.array([5, -1], ctx=ctx)), x[[1, 0]], "float32")  # clip mode
    _check(mx.nd.take(a, mx.nd.array([5, -1], ctx=ctx), mode="wrap"), np.take(x, [5, -1], axis=0, mode="wrap"), "float32")


def test_slice_assign_and_identity_with_attr_like_rhs(ctx):
    x, v = _data((4, 5), "float32"), _data((2, 2), "float32", seed=1)
    a = mx.nd.array(x, ctx=ctx)
    out = mx.nd._internal._slice_assign(a, mx.nd.array(v, ctx=ctx), begin=(1, 0), end=(3, 4), step=(1, 2))
    expected = x.copy()
    expected[1:3, 0:4:2] = v
    _check(out, expected, "float32")
    out = mx.nd._internal._slice_assign_scalar(a, scalar=2.5, begin=(None, 3), end=(None, None))
    expected = x.copy()
    expected[:, 3:] = 2.5
    _check(out, expected, "float32")
    _check(a, x, "float32")  # both return a new array and leave lhs as it was
    _check(mx.nd._internal._identity_with_attr_like_rhs(a, mx.nd.zeros((4, 5), ctx=ctx)), x, "float32")
    with pytest.raises(mx.MXNetError, match="must have the shape of rhs"):
        mx.nd._internal._identity_with_attr_like_rhs(a, mx.nd.zeros((5, 4), ctx=ctx))


REARRANGE = [
    ("reverse", dict(axis=1), lambda x: np.flip(x, 1)),
    ("flip", dict(axis=(0, 2)), lambda x: np.flip(x, (0, 2))),
    ("swapaxes", dict(dim1=0, dim2=2), lambda x: np.swapaxes(x, 0, 2)),
    ("SwapAxis", dict(dim1=1, dim2=-1), lambda x: np.swapaxes(x, 1, -1)),
    ("tile", dict(reps=(2, 1, 3)), lambda x: np.tile(x, (2, 1, 3))),
    ("tile", dict(reps=(2,)), lambda x: np.tile(x, (2,))),
    ("tile", dict(reps=(2, 1, 1, 2)), lambda x: np.tile(x, (2, 1, 1, 2))),
    ("repeat", dict(repeats=2, axis=1), lambda x: np.repeat(x, 2, axis=1)),
    ("repeat", dict(repeats=3), lambda x: np.repeat(x, 3)),
    ("squeeze", dict(), lambda x: np.squeeze(x[:, :1, :]), lambda x: x[:, :1, :]),
    ("squeeze", dict(axis=1), lambda x: np.squeeze(x[:, :1, :], 1), lambda x: x[:, :1, :]),
    ("broadcast_to", dict(shape=(2, 4, 0)), lambda x: np.broadcast_to(x[:, :1, :], (2, 4, 4)), lambda x: x[:, :1, :]),
    ("broadcast_axis", dict(axis=(0, 1), size=(3, 5)), lambda x: np.broadcast_to(x[:1, :1, :], (3, 5, 4)),
     lambda x: x[:1, :1, :]),
]


@pytest.mark.parametrize("case", range(len(REARRANGE)))
def test_rearranging_ops(case, ctx):
    name, kwargs, ref = REARRANGE[case][:3]
    prepare = REARRANGE[case][3] if len(REARRANGE[case]) > 3 else (lambda x: x)
    for dtype in ALL + ["bool"]:
        x = prepare((_data((2, 3, 4), "int32") % 2).astype("bool") if dtype == "bool" else _data((2, 3, 4), dtype))
        out = getattr(mx.nd, name)(mx.nd.array(x, ctx=ctx, dtype=dtype), **kwargs)
        _check(out, ref(x), dtype)


def test_stack_and_broadcast_like(ctx):
    a, b = _data((2, 3), "float32", seed=1), _data((2, 3), "float32", seed=2)
    for axis in (0, 1, 2, -1):
        out = mx.nd.stack(mx.nd.array(a, ctx=ctx), mx.nd.array(b, ctx=ctx), axis=axis)
        _check(out, np.stack([a, b], axis=axis), "float32")
    like = mx.nd.broadcast_like(mx.nd.array(a[:1], ctx=ctx), mx.nd.zeros((5, 3), ctx=ctx))
    _check(like, np.broadcast_to(a[:1], (5, 3)), "float32")
    with pytest.raises(mx.MXNetError, match="same shape"):
        mx.nd.stack(mx.nd.ones((2,), ctx=ctx), mx.nd.ones((3,), ctx=ctx))
    with pytest.raises(mx.MXNetError, match="cannot broadcast"):
        mx.nd.broadcast_to(mx.nd.ones((2, 3), ctx=ctx), shape=(4, 3))
    with pytest.raises(mx.MXNetError, match="squeeze: axis 0"):
        mx.nd.squeeze(mx.nd.ones((2, 1), ctx=ctx), axis=0)


def test_erfinv_inverts_erf_and_flags(ctx):
    y = np.linspace(-0.999, 0.999, 101)
    x = mx.nd.erfinv(mx.nd.array(y, ctx=ctx, dtype="float64")).asnumpy()
    np.testing.assert_allclose(np.vectorize(math.erf)(x), y, rtol=1e-12, atol=1e-14)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, 1.5], np.float32)
    a = mx.nd.array(special, ctx=ctx)
    _check(mx.nd.isnan(a), np.isnan(special).astype("float32"), "float32")
    _check(mx.nd.isinf(a), np.isinf(special).astype("float32"), "float32")
    _check(mx.nd.isfinite(a), np.isfinite(special).astype("float32"), "float32")


def test_clip_where_add_n(ctx):
    for dtype in ["float32", "float64", "int32", "float16"]:
        x = _data((3, 4), dtype, -3, 3)
        _check(mx.nd.clip(mx.nd.array(x, ctx=ctx, dtype=dtype), -1, 2), np.clip(x, -1, 2), dtype)
        y = _data((3, 4), dtype, -3, 3, seed=9)
        cond = (_data((3, 4), "int32") > 0).astype(dtype)
        arr = lambda v: mx.nd.array(v, ctx=ctx, dtype=dtype)  # noqa: E731
        _check(mx.nd.where(arr(cond), arr(x), arr(y)), np.where(cond != 0, x, y), dtype)
        rows = np.array([1, 0, 1], dtype)
        _check(mx.nd.where(arr(rows), arr(x), arr(y)), np.where(rows[:, None] != 0, x, y), dtype)
        parts = [_data((2, 5), dtype, seed=k) for k in range(4)]
        _check(mx.nd.add_n(*(arr(p) for p in parts)), sum(p.astype(np.float64) for p in parts).astype(dtype), dtype)
        _check(mx.nd.ElementWiseSum(arr(parts[0])), parts[0], dtype)
    with pytest.raises(mx.MXNetError, match="a_min"):
        mx.nd.clip(mx.nd.ones((2,), ctx=ctx), 3, 1)
    with pytest.raises(mx.MXNetError, match="where: condition"):
        mx.nd.where(mx.nd.ones((2,), ctx=ctx), mx.nd.ones((3, 2), ctx=ctx), mx.nd.ones((3, 2), ctx=ctx))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "float16"])
def test_argmax_argmin(dtype, ctx):
    x = _data((3, 4, 5), dtype, -5, 5)
    for fn, ref in (("argmax", np.argmax), ("argmin", np.argmin)):
        for axis in (0, 1, 2, -1):
            for keepdims in (False, True):
                out = getattr(mx.nd, fn)(mx.nd.array(x, ctx=ctx, dtype=dtype), axis=axis, keepdims=keepdims)
                exp = ref(x, axis=axis)
                if keepdims:
                    exp = np.expand_dims(exp, axis)
                _check(out, exp.astype(dtype), dtype)
        _check(getattr(mx.nd, fn)(mx.nd.array(x, ctx=ctx, dtype=dtype)), np.array([ref(x)]).astype(dtype), dtype)
    m = x.reshape(3, 20)
    _check(mx.nd.argmax_channel(mx.nd.array(m, ctx=ctx, dtype=dtype)), np.argmax(m, axis=1).astype(dtype), dtype)


def test_one_hot_shape_array_reshape_like(ctx):
    idx = np.array([[0, 2], [1, 5]])
    out = mx.nd.one_hot(mx.nd.array(idx, ctx=ctx), depth=3, on_value=2, off_value=-1, dtype="int32")
    expected = np.where(np.arange(3) == idx[..., None], 2, -1).astype("int32")
    _check(out, expected, "int32")
    x = mx.nd.ones((2, 3, 4), ctx=ctx)
    _check(mx.nd.shape_array(x), np.array([2, 3, 4], "int64"), "int64")
    _check(mx.nd.size_array(x), np.array([24], "int64"), "int64")
    _check(mx.nd.reshape_like(x, mx.nd.zeros((4, 6), ctx=ctx)), np.ones((4, 6), "float32"), "float32")


SAMPLERS = [
    # (function, kwargs, expected mean, expected variance, dtype)
    ("randint", dict(low=-3, high=7), 1.5, (10 ** 2 - 1) / 12, "int32"),
    ("exponential", dict(scale=0.5), 0.5, 0.25, "float32"),
    ("gamma", dict(alpha=3.0, beta=2.0), 6.0, 12.0, "float32"),
    ("gamma", dict(alpha=0.5, beta=1.0), 0.5, 0.5, "float32"),
    ("poisson", dict(lam=4.0), 4.0, 4.0, "float32"),
    ("poisson", dict(lam=50.0), 50.0, 50.0, "float32"),
    ("negative_binomial", dict(k=3, p=0.4), 3 * 0.6 / 0.4, 3 * 0.6 / 0.16, "float32"),
]


@pytest.mark.parametrize("case", range(len(SAMPLERS)))
def test_samplers_moments_and_seeding(case, ctx):
    name, kwargs, mean, var, dtype = SAMPLERS[case]
    fn = getattr(mx.nd.random, name)
    mx.random.seed(7)
    a = fn(shape=(400, 500), ctx=ctx, **kwargs).asnumpy()
    mx.random.seed(7)
    b = fn(shape=(400, 500), ctx=ctx, **kwargs).asnumpy()
    assert a.dtype == np.dtype(dtype) and np.array_equal(a, b)
    assert abs(a.mean() - mean) < 0.02 * max(1.0, mean), (a.mean(), mean)
    assert abs(a.var() - var) < 0.05 * max(1.0, var), (a.var(), var)
    if name == "randint":
        assert a.min() == -3 and a.max() == 6


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "float16"])
def test_sort_argsort_topk(dtype, ctx):
    x = _data((3, 6, 4), dtype, -10, 10)
    arr = mx.nd.array(x, ctx=ctx, dtype=dtype)
    for axis in (0, 1, -1):
        _check(mx.nd.sort(arr, axis=axis), np.sort(x, axis=axis, kind="stable"), dtype)
        _check(mx.nd.sort(arr, axis=axis, is_ascend=False), -np.sort(-x.astype(np.float64), axis=axis, kind="stable"), dtype)
        _check(mx.nd.argsort(arr, axis=axis), np.argsort(x, axis=axis, kind="stable").astype("float32"), "float32")
    _check(mx.nd.sort(arr, axis=None), np.sort(x, axis=None), dtype)
    desc = np.argsort(-x.astype(np.float64), axis=1, kind="stable")[:, :2]
    _check(mx.nd.topk(arr, axis=1, k=2), desc.astype("float32"), "float32")
    _check(mx.nd.topk(arr, axis=1, k=2, ret_typ="value"), np.take_along_axis(x, desc, axis=1), dtype)
    vals, idx = mx.nd.topk(arr, axis=1, k=2, ret_typ="both", dtype="int64")
    _check(vals, np.take_along_axis(x, desc, axis=1), dtype)
    _check(idx, desc.astype("int64"), "int64")
    mask = np.zeros_like(x)
    np.put_along_axis(mask, desc, 1, axis=1)
    _check(mx.nd.topk(arr, axis=1, k=2, ret_typ="mask"), mask, dtype)
    asc = np.argsort(x, axis=-1, kind="stable")[..., :1]
    _check(mx.nd.topk(arr, k=1, is_ascend=True), asc.astype("float32"), "float32")
    with pytest.raises(mx.MXNetError, match="ret_typ"):
        mx.nd.topk(arr, ret_typ="values")
    with pytest.raises(mx.MXNetError, match="exceeds"):
        mx.nd.topk(arr, k=9)


def test_eye_linspace_stop_gradient(ctx):
    for n, m, k in [(3, 0, 0), (3, 5, 1), (4, 2, -1), (2, 3, 5)]:
        _check(mx.nd.eye(n, m, k, ctx=ctx), np.eye(n, m or n, k, dtype="float32"), "float32")
    _check(mx.nd.eye(2, dtype="int64", ctx=ctx), np.eye(2, dtype="int64"), "int64")
    _check(mx.nd.linspace(0, 1, 5, ctx=ctx), np.linspace(0, 1, 5, dtype="float32"), "float32")
    _check(mx.nd.linspace(2, 3, 4, endpoint=False, ctx=ctx, dtype="float64"), np.linspace(2, 3, 4, endpoint=False), "float64")
    x = _data((2, 3), "float32")
    _check(mx.nd.BlockGrad(mx.nd.array(x, ctx=ctx)), x, "float32")
    _check(mx.nd.stop_gradient(mx.nd.array(x, ctx=ctx)), x, "float32")


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "float16"])
def test_pick_batch_take_gather_scatter(dtype, ctx):
    x = _data((3, 4, 5), dtype)
    arr = mx.nd.array(x, ctx=ctx, dtype=dtype)
    idx = np.array([[0, 3, 1, 2, 9], [1, 1, 0, 3, -2], [2, 0, 3, 3, 0]])
    expected = np.take_along_axis(x, np.clip(idx, 0, 3)[:, None, :], axis=1)[:, 0, :]
    _check(mx.nd.pick(arr, mx.nd.array(idx, ctx=ctx), axis=1), expected, dtype)
    wrapped = np.take_along_axis(x, np.mod(idx, 4)[:, None, :], axis=1)
    _check(mx.nd.pick(arr, mx.nd.array(idx, ctx=ctx), axis=1, keepdims=True, mode="wrap"), wrapped, dtype)
    m = x[:, :, 0]
    rows = np.array([3, 0, 2])
    _check(mx.nd.batch_take(mx.nd.array(m, ctx=ctx, dtype=dtype), mx.nd.array(rows, ctx=ctx, dtype="int32")),
           m[np.arange(3), rows], dtype)
    gidx = np.array([[0, 2, 1], [3, 0, 1]])
    _check(mx.nd.gather_nd(arr, mx.nd.array(gidx, ctx=ctx, dtype="int32")), x[gidx[0], gidx[1]], dtype)
    vals = _data((3, 5), dtype)
    scattered = np.zeros((3, 4, 5), dtype=_np_dtype(dtype))
    scattered[gidx[0], gidx[1]] = vals
    _check(mx.nd.scatter_nd(mx.nd.array(vals, ctx=ctx, dtype=dtype), mx.nd.array(gidx, ctx=ctx, dtype="int32"),
                            shape=(3, 4, 5)), scattered, dtype)
    # Index values are only seen by the kernel: the error surfaces at the next sync point.
    with pytest.raises(mx.MXNetError, match="out of bounds"):
        mx.nd.gather_nd(arr, mx.nd.array([[5], [0]], ctx=ctx)).asnumpy()


def test_slice_like_diag_boolean_mask(ctx):
    x = _data((4, 5, 6), "float32")
    arr = mx.nd.array(x, ctx=ctx)
    like = mx.nd.zeros((2, 3), ctx=ctx)
    _check(mx.nd.slice_like(arr, like), x[:2, :3], "float32")
    _check(mx.nd.slice_like(arr, mx.nd.zeros((3, 1, 2), ctx=ctx), axes=(0, 2)), x[:3, :, :2], "float32")
    for k in (0, 1, -2):
        _check(mx.nd.diag(arr, k=k), np.diagonal(x, offset=k, axis1=0, axis2=1), "float32")
        _check(mx.nd.diag(arr, k=k, axis1=1, axis2=2), np.diagonal(x, offset=k, axis1=1, axis2=2), "float32")
        v = x[0, 0, :4]
        _check(mx.nd.diag(mx.nd.array(v, ctx=ctx), k=k), np.diag(v, k), "float32")
    mask = np.array([1, 0, 1, 1])
    _check(mx.nd.boolean_mask(arr, mx.nd.array(mask, ctx=ctx)), x[mask == 1], "float32")
    _check(mx.nd.contrib.boolean_mask(arr, mx.nd.array([0, 1, 0, 0, 1], ctx=ctx), axis=1), x[:, [1, 4]], "float32")
    assert mx.nd.boolean_mask(arr, mx.nd.zeros((4,), ctx=ctx)).shape == (0, 5, 6)
    with pytest.raises(mx.MXNetError, match="index must be 1-D"):
        mx.nd.boolean_mask(arr, mx.nd.ones((3,), ctx=ctx))


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad(mode, ctx):
    x = _data((2, 3, 4, 5), "float32")
    width = (0, 0, 1, 0, 2, 1, 1, 3)
    kwargs = {"constant_values": 1.5} if mode == "constant" else {}
    expected = np.pad(x, [(0, 0), (1, 0), (2, 1), (1, 3)], mode=mode, **kwargs)
    out = mx.nd.pad(mx.nd.array(x, ctx=ctx), mode=mode, pad_width=width, constant_value=1.5)
    _check(out, expected, "float32")
    with pytest.raises(mx.MXNetError, match="pad_width"):
        mx.nd.pad(mx.nd.array(x, ctx=ctx), mode=mode, pad_width=(1, 1))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_norm_and_moments(dtype, ctx):
    x = _data((3, 4, 5), dtype)
    arr = mx.nd.array(x, ctx=ctx, dtype=dtype)
    ref = x.astype(np.float64)
    _check(mx.nd.norm(arr), np.array([np.sqrt((ref ** 2).sum())]), dtype)
    for axis in (0, (1, 2), -1):
        _check(mx.nd.norm(arr, axis=axis), np.sqrt((ref ** 2).sum(axis=axis)), dtype)
        _check(mx.nd.norm(arr, ord=1, axis=axis, keepdims=True), np.abs(ref).sum(axis=axis, keepdims=True), dtype)
        mean, var = mx.nd.moments(arr, axes=axis)
        _check(mean, ref.mean(axis=axis), dtype)
        _check(var, ref.var(axis=axis), dtype)
    with pytest.raises(mx.MXNetError, match="ord"):
        mx.nd.norm(arr, ord=3)


@pytest.mark.parametrize("dtype", ALL)
def test_allclose(dtype, ctx):
    # Spread over several parallel pieces, with the one far element in the last.
    b = _data((70001,), dtype)
    a = b.copy()
    cases = [(a, b, {}), (a, b, {"rtol": 0, "atol": 0})]
    far = a.copy()
    far[-1] = far[-1] + (3 if dtype in INTS else 0.5)
    cases += [(far, b, {}), (far, b, {"atol": 4.0})]
    if dtype not in INTS:
        special = np.array([np.inf, -np.inf, np.nan, 1.0], dtype=_np_dtype(dtype))
        cases += [(special, special, {}), (special, special, {"equal_nan": False}),
                  (np.array([1.0, np.inf], dtype=_np_dtype(dtype)), np.array([np.inf, np.inf], dtype=_np_dtype(dtype)), {"rtol": 1.0})]
    for x, y, kwargs in cases:
        expected = np.allclose(x.astype(np.float64), y.astype(np.float64), **{"equal_nan": True, **kwargs})
        out = mx.nd.contrib.allclose(mx.nd.array(x, ctx=ctx, dtype=dtype), mx.nd.array(y, ctx=ctx, dtype=dtype), **kwargs)
        _check(out, np.array([expected], dtype=np.uint8), "uint8")
    with pytest.raises(mx.MXNetError, match=r"allclose.*\(2, 3\).*\(3, 2\)"):
        mx.nd.contrib.allclose(mx.nd.zeros((2, 3), ctx=ctx), mx.nd.zeros((3, 2), ctx=ctx))
    with pytest.raises(mx.MXNetError, match="allclose.*dtype"):
        mx.nd.contrib.allclose(mx.nd.zeros((2,), ctx=ctx), mx.nd.zeros((2,), ctx=ctx, dtype="float64"))
    with pytest.raises(mx.MXNetError, match="allclose.*negative"):
        mx.nd.contrib.allclose(mx.nd.zeros((2,), ctx=ctx), mx.nd.zeros((2,), ctx=ctx), rtol=-1)


def test_depth_to_space_and_back(ctx):
    x = _data((2, 8, 3, 5), "float32")
    b = 2
    n, c, h, w = x.shape
    expected = x.reshape(n, b, b, c // 4, h, w).transpose(0, 3, 4, 1, 5, 2).reshape(n, c // 4, h * b, w * b)
    d2s = mx.nd.depth_to_space(mx.nd.array(x, ctx=ctx), block_size=b)
    _check(d2s, expected, "float32")
    _check(mx.nd.space_to_depth(d2s, block_size=b), x, "float32")
    with pytest.raises(mx.MXNetError, match="block_size"):
        mx.nd.depth_to_space(mx.nd.array(x, ctx=ctx), block_size=3)


def test_array_parameter_samplers_multinomial_shuffle(ctx):
    mx.random.seed(3)
    low = mx.nd.array([0.0, 10.0], ctx=ctx)
    high = mx.nd.array([1.0, 20.0], ctx=ctx)
    u = mx.nd.random.uniform(low, high, shape=(5000,)).asnumpy()
    assert u.shape == (2, 5000)
    assert 0 <= u[0].min() and u[0].max() < 1 and 10 <= u[1].min() and u[1].max() < 20
    assert abs(u[1].mean() - 15) < 0.2
    n = mx.nd.random.normal(mx.nd.array([0.0, 5.0], ctx=ctx), mx.nd.array([1.0, 0.1], ctx=ctx), shape=4000).asnumpy()
    assert abs(n[1].mean() - 5) < 0.01 and abs(n[0].std() - 1) < 0.05
    for fn, args, mean in [(mx.nd.random.gamma, (mx.nd.array([2.0], ctx=ctx), mx.nd.array([3.0], ctx=ctx)), 6.0),
                           (mx.nd.random.poisson, (mx.nd.array([7.0], ctx=ctx),), 7.0),
                           (mx.nd.random.exponential, (mx.nd.array([0.5], ctx=ctx),), 0.5),
                           (mx.nd.random.negative_binomial, (mx.nd.array([3.0], ctx=ctx), mx.nd.array([0.5], ctx=ctx)), 3.0),
                           (mx.nd.random.generalized_negative_binomial,
                            (mx.nd.array([4.0], ctx=ctx), mx.nd.array([0.3], ctx=ctx)), 4.0)]:
        s = fn(*args, shape=20000).asnumpy()
        assert abs(s.mean() - mean) < 0.05 * mean, (fn.__name__, s.mean())
    probs = mx.nd.array([[0.1, 0.0, 0.9], [0.5, 0.5, 0.0]], ctx=ctx)
    draws, logp = mx.nd.random.multinomial(probs, shape=3000, get_prob=True)
    d = draws.asnumpy()
    assert d.shape == (2, 3000) and d.dtype == np.int32
    assert abs((d[0] == 2).mean() - 0.9) < 0.03 and not (d[0] == 1).any() and not (d[1] == 2).any()
    assert_almost_equal(logp.asnumpy()[0][d[0] == 2], np.full((d[0] == 2).sum(), np.log(0.9)), rtol=1e-5)
    x = mx.nd.arange(20, ctx=ctx).reshape((10, 2))
    y = mx.nd.random.shuffle(x).asnumpy()
    assert sorted(y[:, 0].tolist()) == list(range(0, 20, 2)) and (y[:, 1] == y[:, 0] + 1).all()
    mx.random.seed(5)
    a = mx.nd.random.shuffle(x).asnumpy()
    mx.random.seed(5)
    assert np.array_equal(a, mx.nd.random.shuffle(x).asnumpy())


# AlexNet's PCA lighting basis, which MXNet's lighting operators use.
LIGHTING_EIGVAL = np.array([55.46, 4.794, 1.148])
LIGHTING_EIGVEC = np.array([[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]])


def test_random_image_augmentations_draw_within_their_ranges(ctx):
    image = _data((4, 5, 3), "float32", 0.1, 1.0)
    x = mx.nd.array(image, ctx=ctx)
    mx.random.seed(4)
    flipped = {mx.nd.image.random_flip_top_bottom(x).asnumpy().tobytes() for _ in range(40)}
    assert flipped == {image.tobytes(), image[::-1].tobytes()}
    # Brightness alone: the image times one factor drawn from [1 - 0.3, 1 + 0.3].
    factors = []
    for _ in range(20):
        ratio = mx.nd.image.random_color_jitter(x, brightness=0.3, contrast=0, saturation=0, hue=0).asnumpy() / image
        assert np.ptp(ratio) < 1e-5
        factors.append(ratio.mean())
    assert 0.7 <= min(factors) < max(factors) <= 1.3
    # PCA lighting: one RGB offset for all pixels, (eigvec * alpha) @ eigval with alpha ~ N(0, 0.1).
    offsets = np.stack([(mx.nd.image.random_lighting(x, alpha_std=0.1).asnumpy() - image).reshape(-1, 3)
                        for _ in range(300)])
    assert np.ptp(offsets, axis=1).max() < 1e-4
    alphas = np.linalg.solve(LIGHTING_EIGVEC, offsets[:, 0].T).T / LIGHTING_EIGVAL
    assert np.all(np.abs(alphas.std(axis=0) - 0.1) < 0.02) and np.all(np.abs(alphas.mean(axis=0)) < 0.02)


# MXNet 1.x's legacy and public aliases (old Symbol JSON files name operators this way): alias,
# canonical name, scalar argument or None for a two-input operator.
ALIASES = [
    ("_Plus", "elemwise_add", None), ("_grad_add", "elemwise_add", None), ("_Minus", "elemwise_sub", None),
    ("_Mul", "elemwise_mul", None), ("_Div", "elemwise_div", None), ("_Mod", "_mod", None),
    ("_Power", "_power", None), ("_Maximum", "_maximum", None), ("_Minimum", "_minimum", None),
    ("_Hypot", "_hypot", None), ("_Equal", "_equal", None), ("_Not_Equal", "_not_equal", None),
    ("_Greater", "_greater", None), ("_Greater_Equal", "_greater_equal", None), ("_Lesser", "_lesser", None),
    ("_Lesser_Equal", "_lesser_equal", None), ("_Logical_And", "_logical_and", None),
    ("_Logical_Or", "_logical_or", None), ("_Logical_Xor", "_logical_xor", None),
    ("_PlusScalar", "_plus_scalar", 1.5), ("_MinusScalar", "_minus_scalar", 1.5), ("_MulScalar", "_mul_scalar", 1.5),
    ("_DivScalar", "_div_scalar", 1.5), ("_EqualScalar", "_equal_scalar", 1.0),
    ("_NotEqualScalar", "_not_equal_scalar", 1.0), ("_GreaterScalar", "_greater_scalar", 1.0),
    ("_GreaterEqualScalar", "_greater_equal_scalar", 1.0), ("_LesserScalar", "_lesser_scalar", 1.0),
    ("_LesserEqualScalar", "_lesser_equal_scalar", 1.0), ("_LogicalAndScalar", "_logical_and_scalar", 1.0),
    ("_LogicalOrScalar", "_logical_or_scalar", 0.0), ("_LogicalXorScalar", "_logical_xor_scalar", 1.0),
]


@pytest.mark.parametrize("alias,canonical,scalar", ALIASES, ids=[a[0] for a in ALIASES])
def test_legacy_aliases_run_their_operator(alias, canonical, scalar, ctx):
    a = np.round(_data((3, 4), "float32", 0.0, 3.0))
    b = np.round(_data((3, 4), "float32", 0.5, 3.0, seed=1))
    inputs = [mx.nd.array(a, ctx=ctx)] + ([] if scalar is not None else [mx.nd.array(b, ctx=ctx)])
    kwargs = {} if scalar is None else {"scalar": scalar}
    expected = getattr(mx.nd, canonical)(*inputs, **kwargs).asnumpy()
    _check(getattr(mx.nd, alias)(*inputs, **kwargs), expected, "float32")
    # The same alias as an operator of a legacy (pre-1.0) Symbol JSON graph.
    nodes = [{"op": "null", "name": "x", "inputs": []}, {"op": "null", "name": "y", "inputs": []}]
    param = {} if scalar is None else {"scalar": str(scalar)}
    nodes.append({"op": alias, "name": "out", "param": param,
                  "inputs": [[0, 0]] if scalar is not None else [[0, 0], [1, 0]]})
    graph = {"nodes": nodes, "arg_nodes": [0, 1], "heads": [[2, 0]]}
    sym = mx.sym.load_json(json.dumps(graph))
    feed = {"x": inputs[0]} if scalar is not None else {"x": inputs[0], "y": inputs[1]}
    _check(sym.eval(ctx=ctx, **feed)[0], expected, "float32")


@pytest.mark.parametrize("public", ["sample_uniform", "sample_normal", "sample_gamma", "sample_exponential",
                                    "sample_poisson", "sample_negative_binomial",
                                    "sample_generalized_negative_binomial"])
def test_public_sample_names_draw_as_the_internal_samplers(public, ctx):
    params = {"sample_uniform": [[0.0, 2.0], [1.0, 3.0]], "sample_normal": [[0.0, 5.0], [1.0, 0.5]],
              "sample_gamma": [[2.0, 3.0], [1.0, 0.5]], "sample_exponential": [[0.5, 2.0]],
              "sample_poisson": [[3.0, 7.0]], "sample_negative_binomial": [[3.0, 2.0], [0.5, 0.4]],
              "sample_generalized_negative_binomial": [[4.0, 2.0], [0.3, 0.1]]}[public]
    arrays = [mx.nd.array(p, ctx=ctx) for p in params]
    draws = []
    for name in (public, "_" + public):
        mx.random.seed(11)
        draws.append(getattr(mx.nd, name)(*arrays, shape=(64,)).asnumpy())
    assert draws[0].shape == (2, 64)
    np.testing.assert_array_equal(draws[0], draws[1])


# Dense linear algebra (mx.nd.linalg): name -> (call on NDArrays, NumPy reference in float64, input makers).
def _spd(rng, shape):
    """Symmetric positive-definite matrices of `shape` (..., n, n)."""
    x = rng.uniform(-1, 1, size=shape)
    return x @ np.swapaxes(x, -1, -2) + shape[-1] * np.eye(shape[-1])


def _well_conditioned(rng, shape):
    return rng.uniform(-1, 1, size=shape) + 3 * np.eye(shape[-1])


def _uniform(shape):
    return lambda rng: rng.uniform(-1, 1, size=shape)


def _tril_positions(side, k, upper):
    """(rows, cols) of a packed triangle in MXNet's order: lower row by row, upper column by column."""
    r, c = np.tril_indices(side)
    return (c, r + k) if upper else (r + k, c)


def _extracttrian(a, offset=0, lower=True):
    k, side = abs(offset), a.shape[-1] - abs(offset)
    rows, cols = _tril_positions(side, k, offset > 0 or (offset == 0 and not lower))
    return a[..., rows, cols]


def _maketrian(v, offset=0, lower=True):
    m = v.shape[-1]
    side = int((np.sqrt(8 * m + 1) - 1) / 2)
    n = side + abs(offset)
    out = np.zeros(v.shape[:-1] + (n, n))
    rows, cols = _tril_positions(side, abs(offset), offset > 0 or (offset == 0 and not lower))
    out[..., rows, cols] = v
    return out


def _eigh_mxnet(a):
    """MXNet's syevd: eigenvectors as rows, each with its largest-magnitude entry positive."""
    w, v = np.linalg.eigh(a)
    u = np.swapaxes(v, -1, -2)
    largest = np.take_along_axis(u, np.abs(u).argmax(axis=-1)[..., None], axis=-1)
    return [u * np.sign(largest), w]


def _lq(a):
    """LQ from NumPy's (LAPACK's) QR of A^T, whose Householder signs gelqf shares."""
    q, r = np.linalg.qr(np.swapaxes(a, -1, -2))
    return [np.swapaxes(q, -1, -2), np.swapaxes(r, -1, -2)]


def _per_matrix(values):
    return values.reshape(values.shape or (1,)) if np.ndim(values) == 0 else values


def _swap(x):
    return np.swapaxes(x, -1, -2)


LINALG = {
    "gemm": (lambda a, b, c: mx.nd.linalg.gemm(a, b, c, transpose_b=True, alpha=2.0, beta=0.5),
             lambda a, b, c: 2 * a @ _swap(b) + 0.5 * c, [_uniform((2, 3, 4)), _uniform((2, 5, 4)), _uniform((2, 3, 5))]),
    "gemm_axis": (lambda a, b, c: mx.nd.linalg.gemm(a, b, c, transpose_a=True, axis=1),
                  lambda a, b, c: np.swapaxes(_swap(np.swapaxes(a, 1, 2)) @ np.swapaxes(b, 1, 2), 1, 2) + c,
                  [_uniform((2, 4, 3, 5)), _uniform((2, 4, 3, 6)), _uniform((2, 5, 3, 6))]),
    "gemm2": (lambda a, b: mx.nd.linalg.gemm2(a, b, transpose_a=True, alpha=-1.5),
              lambda a, b: -1.5 * _swap(a) @ b, [_uniform((4, 3)), _uniform((4, 5))]),
    "gemm2_large": (lambda a, b: mx.nd.linalg_gemm2(a, b), lambda a, b: a @ b, [_uniform((130, 70)), _uniform((70, 90))]),
    "potrf": (lambda a: mx.nd.linalg.potrf(a), np.linalg.cholesky, [lambda rng: _spd(rng, (3, 4, 4))]),
    "potrf_upper": (lambda a: mx.nd.linalg.potrf(a, lower=False), lambda a: _swap(np.linalg.cholesky(a)),
                    [lambda rng: _spd(rng, (4, 4))]),
    "potri": (lambda a: mx.nd.linalg.potri(a), lambda l: np.linalg.inv(l @ _swap(l)),
              [lambda rng: np.linalg.cholesky(_spd(rng, (2, 4, 4)))]),
    "potri_upper": (lambda a: mx.nd.linalg.potri(a, lower=False), lambda u: np.linalg.inv(_swap(u) @ u),
                    [lambda rng: _swap(np.linalg.cholesky(_spd(rng, (4, 4))))]),
    "trmm": (lambda a, b: mx.nd.linalg.trmm(a, b, alpha=2.0), lambda a, b: 2 * np.tril(a) @ b,
             [_uniform((2, 3, 3)), _uniform((2, 3, 4))]),
    "trmm_right_transposed_upper": (lambda a, b: mx.nd.linalg.trmm(a, b, rightside=True, transpose=True, lower=False),
                                    lambda a, b: b @ _swap(np.triu(a)), [_uniform((3, 3)), _uniform((5, 3))]),
    "trsm": (lambda a, b: mx.nd.linalg.trsm(a, b, alpha=0.5), lambda a, b: np.linalg.solve(np.tril(a), 0.5 * b),
             [lambda rng: _well_conditioned(rng, (2, 4, 4)), _uniform((2, 4, 3))]),
    "trsm_transposed": (lambda a, b: mx.nd.linalg.trsm(a, b, transpose=True),
                        lambda a, b: np.linalg.solve(_swap(np.tril(a)), b),
                        [lambda rng: _well_conditioned(rng, (4, 4)), _uniform((4, 3))]),
    "trsm_right_upper": (lambda a, b: mx.nd.linalg.trsm(a, b, rightside=True, lower=False),
                         lambda a, b: b @ np.linalg.inv(np.triu(a)),
                         [lambda rng: _well_conditioned(rng, (2, 4, 4)), _uniform((2, 3, 4))]),
    "sumlogdiag": (lambda a: mx.nd.linalg.sumlogdiag(a),
                   lambda a: _per_matrix(np.log(np.diagonal(a, axis1=-2, axis2=-1)).sum(-1)),
                   [lambda rng: _spd(rng, (3, 3))]),
    "sumlogdiag_batch": (lambda a: mx.nd.linalg.sumlogdiag(a), lambda a: np.log(np.diagonal(a, axis1=-2, axis2=-1)).sum(-1),
                         [lambda rng: _spd(rng, (2, 2, 3, 3))]),
    "syrk": (lambda a: mx.nd.linalg.syrk(a, alpha=0.5), lambda a: 0.5 * a @ _swap(a), [_uniform((2, 3, 5))]),
    "syrk_transposed": (lambda a: mx.nd.linalg.syrk(a, transpose=True), lambda a: _swap(a) @ a, [_uniform((3, 5))]),
    "gelqf": (lambda a: mx.nd.linalg.gelqf(a), _lq, [_uniform((2, 3, 5))]),
    "syevd": (lambda a: mx.nd.linalg.syevd(a), _eigh_mxnet, [lambda rng: _spd(rng, (2, 5, 5)) - 5 * np.eye(5)]),
    "inverse": (lambda a: mx.nd.linalg.inverse(a), np.linalg.inv, [_uniform((3, 4, 4))]),
    "det": (lambda a: mx.nd.linalg.det(a), lambda a: _per_matrix(np.linalg.det(a)), [_uniform((4, 4))]),
    "det_batch": (lambda a: mx.nd.linalg.det(a), np.linalg.det, [_uniform((2, 3, 4, 4))]),
    "slogdet": (lambda a: mx.nd.linalg.slogdet(a), lambda a: list(np.linalg.slogdet(a)), [_uniform((3, 4, 4))]),
    "extractdiag": (lambda a: mx.nd.linalg.extractdiag(a, offset=-1),
                    lambda a: np.diagonal(a, offset=-1, axis1=-2, axis2=-1), [_uniform((2, 4, 4))]),
    "makediag": (lambda a: mx.nd.linalg.makediag(a, offset=2), lambda a: np.stack([np.diag(v, 2) for v in a]),
                 [_uniform((2, 3))]),
    "extracttrian": (lambda a: mx.nd.linalg.extracttrian(a), _extracttrian, [_uniform((2, 4, 4))]),
    "extracttrian_upper": (lambda a: mx.nd.linalg.extracttrian(a, lower=False),
                           lambda a: _extracttrian(a, lower=False), [_uniform((4, 4))]),
    "extracttrian_offset": (lambda a: mx.nd.linalg.extracttrian(a, offset=1),
                            lambda a: _extracttrian(a, offset=1), [_uniform((2, 4, 4))]),
    "maketrian": (lambda a: mx.nd.linalg.maketrian(a, offset=-1), lambda a: _maketrian(a, offset=-1),
                  [_uniform((2, 6))]),
    "maketrian_upper": (lambda a: mx.nd.linalg.maketrian(a, lower=False), lambda a: _maketrian(a, lower=False),
                        [_uniform((10,))]),
}


@pytest.mark.parametrize("name", sorted(LINALG))
def test_linalg(name, ctx):
    call, reference, makers = LINALG[name]
    rng = np.random.RandomState(3)
    inputs = [make(rng) for make in makers]
    for dtype in ("float32", "float64"):
        cast = [x.astype(dtype) for x in inputs]
        outs = call(*[mx.nd.array(x, ctx=ctx, dtype=dtype) for x in cast])
        expected = reference(*[x.astype(np.float64) for x in cast])
        outs, expected = (outs, expected) if isinstance(expected, list) else ([outs], [expected])
        assert len(outs) == len(expected)
        for out, exp in zip(outs, expected):
            _check(out, exp, dtype)
    with pytest.raises(mx.MXNetError, match="float32 and float64"):
        call(*[mx.nd.array(x, ctx=ctx, dtype="float16") for x in inputs])


def test_linalg_values_as_mxnet_documents(ctx):
    nd = mx.nd
    q, l = nd.linalg.gelqf(nd.array([[1., 2., 3.], [4., 5., 6.]], ctx=ctx))
    _check(q, [[-0.26726124, -0.53452248, -0.80178373], [0.87287156, 0.21821789, -0.43643578]], "float32")
    _check(l, [[-3.74165739, 0.], [-8.55235974, 1.96396101]], "float32")
    u, w = nd.linalg.syevd(nd.array([[1., 2.], [2., 4.]], ctx=ctx))
    _check(u, [[0.89442719, -0.4472136], [0.4472136, 0.89442719]], "float32")
    _check(w, [0., 5.], "float32")
    sign, logabsdet = nd.linalg.slogdet(nd.array([[[2., 3.], [1., 4.]], [[1., 2.], [2., 4.]], [[1., 2.], [4., 3.]]], ctx=ctx))
    _check(sign, [1., 0., -1.], "float32")
    assert np.signbit(sign.asnumpy()[1]) == 0  # +0 for a singular matrix, as MXNet
    _check(logabsdet, [np.log(5), -np.inf, np.log(5)], "float32")
    _check(nd.linalg.potri(nd.array([[2., 0], [0.5, 2.]], ctx=ctx)), [[0.265625, -0.0625], [-0.0625, 0.25]], "float32")


def test_linalg_failures_name_the_operator_and_matrix(ctx):
    not_positive_definite = mx.nd.array([[[4., 1.], [1., 4.]], [[1., 2.], [2., 1.]]], ctx=ctx)
    with pytest.raises(mx.MXNetError, match=r"_linalg_potrf: matrix 1 of the batch is not symmetric positive definite"):
        mx.nd.linalg.potrf(not_positive_definite).asnumpy()
    with pytest.raises(mx.MXNetError, match=r"_linalg_inverse: matrix 0 of the batch is singular"):
        mx.nd.linalg.inverse(mx.nd.array([[1., 2.], [2., 4.]], ctx=ctx)).asnumpy()
    with pytest.raises(mx.MXNetError, match="incompatible matrix dimensions"):
        mx.nd.linalg.gemm2(mx.nd.ones((2, 3), ctx=ctx), mx.nd.ones((2, 3), ctx=ctx))
    with pytest.raises(mx.MXNetError, match="at most as many rows as columns"):
        mx.nd.linalg.gelqf(mx.nd.ones((3, 2), ctx=ctx))
    with pytest.raises(mx.MXNetError, match="not a triangular number"):
        mx.nd.linalg.maketrian(mx.nd.ones((4,), ctx=ctx))


def test_linalg_symbols_infer_shapes_and_run(ctx):
    a, b = mx.sym.var("a"), mx.sym.var("b")
    _, outs, _ = mx.sym.linalg.gemm2(a, b, transpose_b=True).infer_shape(a=(2, 3, 4), b=(2, 5, 4))
    assert outs == [(2, 3, 5)]
    _, outs, _ = mx.sym.linalg.gelqf(a).infer_shape(a=(4, 2, 3))
    assert outs == [(4, 2, 3), (4, 2, 2)]
    _, outs, _ = mx.sym.linalg.slogdet(a).infer_shape(a=(3, 3))
    assert outs == [(1,), (1,)]
    net = mx.sym.load_json(mx.sym.linalg_sumlogdiag(mx.sym.linalg.potrf(a)).tojson())
    x = np.array([[4., 1.], [1., 3.]])
    out = net.eval(ctx=ctx, a=mx.nd.array(x, ctx=ctx))[0]
    _check(out, [np.log(np.diag(np.linalg.cholesky(x))).sum()], "float32")
