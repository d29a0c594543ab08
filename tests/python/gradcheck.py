"""One helper for gradient checks: autograd's analytic gradient against central finite
differences in float64, and lower precisions against the float64 analytic gradient."""

import numpy as np

import oxnet as mx
from oxnet import autograd
from oxnet.test_utils import assert_almost_equal

FLOAT_DTYPES = ["float64", "float32", "float16"]
LOW_PRECISION = ("float16", "bfloat16")


def _as_list(x):
    return x if isinstance(x, (list, tuple)) else [x]


def _host(x):
    """``x``'s values as float64 NumPy (bfloat16 through float32: NumPy has no bfloat16)."""
    return (x.astype("float32") if x.dtype == mx.base.bfloat16 else x).asnumpy().astype(np.float64)


def _on_grid(arrays, dtype):
    """``arrays`` rounded to ``dtype``'s values, kept in float64."""
    return [_host(mx.nd.array(a, dtype=dtype)) for a in arrays]


def _analytic(fn, arrays, head_seed, ctx, dtype, with_outputs=False, grid=None):
    """Input gradients of ``fn`` in ``dtype`` for random output gradients (on ``grid``'s values
    where given)."""
    xs = [mx.nd.array(a, ctx=ctx, dtype=dtype) for a in arrays]
    for x in xs:
        x.attach_grad()
    with autograd.record():
        outs = _as_list(fn(*xs))
    rng = np.random.RandomState(head_seed)
    heads = [rng.uniform(-1, 1, size=o.shape) for o in outs]
    if grid in LOW_PRECISION:
        heads = _on_grid(heads, grid)
    autograd.backward(outs, [mx.nd.array(h, ctx=ctx, dtype=dtype) for h in heads])
    grads = [_host(x.grad) for x in xs]
    return (grads, heads, [_host(o) for o in outs]) if with_outputs else (grads, heads)


def _numeric(fn, arrays, heads, ctx, eps=1e-6):
    def objective(values):
        outs = _as_list(fn(*[mx.nd.array(v, ctx=ctx, dtype="float64") for v in values]))
        return sum(float((o.asnumpy() * h).sum()) for o, h in zip(outs, heads))

    grads = []
    for i, a in enumerate(arrays):
        g = np.zeros(a.shape)
        for idx in np.ndindex(*a.shape):
            values = [v.copy() for v in arrays]
            values[i][idx] += eps
            up = objective(values)
            values[i][idx] -= 2 * eps
            down = objective(values)
            g[idx] = (up - down) / (2 * eps)
        grads.append(g)
    return grads


def check_gradient(fn, shapes, ctx, domain=(-1.0, 1.0), dtypes=FLOAT_DTYPES, seed=0, make=None):
    """Check ``fn``'s input gradients for inputs of ``shapes`` drawn from ``domain``."""
    rng = np.random.RandomState(seed)
    arrays = make(rng) if make else [rng.uniform(*domain, size=s) for s in shapes]
    reference, heads = _analytic(fn, arrays, seed + 1, ctx, "float64")
    numeric = _numeric(fn, arrays, heads, ctx)
    for r, n in zip(reference, numeric):
        assert_almost_equal(r, n, rtol=1e-5, atol=1e-6)
    check_precisions(fn, arrays, ctx, dtypes, seed)


def check_precisions(fn, arrays, ctx, dtypes=FLOAT_DTYPES, seed=0):
    """Check that ``fn``'s input gradients at ``arrays`` in each lower precision of ``dtypes``
    match float64's analytic ones (no finite differences: cheap enough for full-size inputs)."""
    tolerances = {"float32": (1e-4, 1e-5), "float16": (3e-2, 3e-2), "bfloat16": (5e-2, 3e-2)}
    for dtype in dtypes:
        if dtype == "float64":
            continue
        # 16-bit inputs (and output gradients) on their grid, so that both precisions
        # differentiate at the same point.
        points = _on_grid(arrays, dtype) if dtype in LOW_PRECISION else arrays
        got, _, outs = _analytic(fn, points, seed + 1, ctx, dtype, with_outputs=True, grid=dtype)
        reference, _ = _analytic(fn, points, seed + 1, ctx, "float64", grid=dtype)
        rtol, atol = tolerances[dtype]
        for r, g in zip(reference, got):
            assert_almost_equal(g, r, rtol=rtol, atol=atol * max(1.0, np.abs(r).max()))
        if dtype in LOW_PRECISION:
            # The forward values too: 16-bit kernels compute in float32 and round once.
            xs = [mx.nd.array(a, ctx=ctx, dtype="float64") for a in points]
            for r, g in zip(_as_list(fn(*xs)), outs):
                r = r.asnumpy()
                assert_almost_equal(g, r, rtol=rtol, atol=atol * max(1.0, np.abs(r).max()))
