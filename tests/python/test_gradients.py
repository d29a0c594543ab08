"""Gradients of every differentiable operator: autograd against central finite differences.

One helper checks one row of the table: the analytic gradient (recorded with autograd, head
gradient random) must match a float64 numeric gradient, and lower-precision dtypes must match the
float64 analytic gradient within their precision.
"""

import json

import numpy as np
import pytest

import oxnet as mx
from oxnet import autograd
from oxnet.test_utils import assert_almost_equal
from gradcheck import FLOAT_DTYPES, check_gradient

nd = mx.nd

# name: (function, input domain)
UNARY = {
    "abs": (nd.abs, (0.2, 1.0)), "square": (nd.square, (-1, 1)), "sqrt": (nd.sqrt, (0.5, 2)),
    "rsqrt": (nd.rsqrt, (0.5, 2)), "cbrt": (nd.cbrt, (0.5, 2)), "rcbrt": (nd.rcbrt, (0.5, 2)),
    "exp": (nd.exp, (-1, 1)), "expm1": (nd.expm1, (-1, 1)), "log": (nd.log, (0.5, 2)),
    "log10": (nd.log10, (0.5, 2)), "log2": (nd.log2, (0.5, 2)), "log1p": (nd.log1p, (-0.5, 1)),
    "sin": (nd.sin, (-2, 2)), "cos": (nd.cos, (-2, 2)), "tan": (nd.tan, (-1, 1)),
    "arcsin": (nd.arcsin, (-0.8, 0.8)), "arccos": (nd.arccos, (-0.8, 0.8)), "arctan": (nd.arctan, (-2, 2)),
    "sinh": (nd.sinh, (-1, 1)), "cosh": (nd.cosh, (-1, 1)), "tanh": (nd.tanh, (-1, 1)),
    "arcsinh": (nd.arcsinh, (-1, 1)), "arccosh": (nd.arccosh, (1.2, 2)), "arctanh": (nd.arctanh, (-0.8, 0.8)),
    "degrees": (nd.degrees, (-1, 1)), "radians": (nd.radians, (-1, 1)), "sigmoid": (nd.sigmoid, (-2, 2)),
    "relu": (nd.relu, (0.1, 1)), "softsign": (nd.softsign, (-2, 2)), "reciprocal": (nd.reciprocal, (0.5, 2)),
    "negative": (nd.negative, (-1, 1)), "erf": (nd.erf, (-1, 1)), "erfinv": (nd.erfinv, (-0.7, 0.7)),
    "gamma": (nd.gamma, (0.5, 3)), "gammaln": (nd.gammaln, (0.5, 3)), "identity": (nd.identity, (-1, 1)),
    "_softrelu": (nd._softrelu, (-2, 2)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_gradient(name, ctx):
    fn, domain = UNARY[name]
    dtypes = ["float64", "float32"] if name in ("gamma", "erfinv", "tan") else FLOAT_DTYPES
    check_gradient(fn, [(2, 3)], ctx, domain, dtypes=dtypes)


# Operators whose output is piecewise constant in the input (or does not depend on its values):
# name -> parameters.
ZERO_GRADIENT = {
    "sign": {}, "round": {}, "rint": {}, "ceil": {}, "floor": {}, "trunc": {}, "fix": {}, "logical_not": {},
    "isnan": {}, "isinf": {}, "isfinite": {}, "BlockGrad": {}, "stop_gradient": {}, "zeros_like": {},
    "ones_like": {}, "argmax": {}, "argmin": {}, "argmax_channel": {}, "argsort": {}, "shape_array": {},
    "size_array": {}, "one_hot": {"depth": 3},
}


@pytest.mark.parametrize("name", sorted(ZERO_GRADIENT))
def test_piecewise_constant_ops_have_zero_gradient(name, ctx):
    x = mx.nd.array([[0.3, -1.7, 2.2]], ctx=ctx)
    x.attach_grad()
    with autograd.record():
        y = getattr(mx.nd, name)(x, **ZERO_GRADIENT[name])
        loss = (y.astype("float32") * 3).sum() + (x * 0).sum()
    loss.backward()
    assert (x.grad.asnumpy() == 0).all()


COMPARISONS = ["equal", "not_equal", "greater", "greater_equal", "lesser", "lesser_equal", "logical_and",
               "logical_or", "logical_xor"]
# Every form of each comparison: broadcast, same-shape and with a scalar.
ZERO_GRADIENT_COMPARISONS = (["broadcast_" + c for c in COMPARISONS] + ["_" + c for c in COMPARISONS]
                             + ["_%s_scalar" % c for c in COMPARISONS])


@pytest.mark.parametrize("name", ZERO_GRADIENT_COMPARISONS)
def test_comparisons_have_zero_gradient(name, ctx):
    a = mx.nd.array([[0.3, -1.7, 2.2], [0.5, 0.0, 1.0]], ctx=ctx)
    b = mx.nd.array([[0.3, 1.0, -2.0], [0.5, 0.0, 3.0]], ctx=ctx)
    for x in (a, b):
        x.attach_grad()
    with autograd.record():
        y = getattr(nd, name)(a, scalar=0.5) if name.endswith("_scalar") else getattr(nd, name)(a, b)
        loss = (y * 3).sum() + (a * 0).sum() + (b * 0).sum()
    loss.backward()
    assert (a.grad.asnumpy() == 0).all() and (b.grad.asnumpy() == 0).all()


# Samplers with array parameters: as in MXNet 1.9.1, a draw is not differentiated through the
# parameters of its distribution, whose gradient is zero. name -> the parameters' domains.
ZERO_GRADIENT_SAMPLERS = {
    "_sample_uniform": [(-1, 0), (1, 2)], "_sample_normal": [(-1, 1), (0.5, 2)], "_sample_gamma": [(0.5, 2), (0.5, 2)],
    "_sample_exponential": [(0.5, 2)], "_sample_poisson": [(0.5, 4)], "_sample_negative_binomial": [(1, 4), (0.2, 0.8)],
    "_sample_generalized_negative_binomial": [(0.5, 4), (0.1, 1)],
}


@pytest.mark.parametrize("name", sorted(ZERO_GRADIENT_SAMPLERS))
def test_array_parameter_samplers_have_zero_gradient(name, ctx):
    rng = np.random.RandomState(3)
    params = [mx.nd.array(rng.uniform(*domain, size=(2, 3)), ctx=ctx, dtype="float64")
              for domain in ZERO_GRADIENT_SAMPLERS[name]]
    for x in params:
        x.attach_grad()
    with autograd.record():
        draws = getattr(nd, name)(*params, shape=(4,))
        loss = (draws * draws).sum()
    assert draws.shape == (2, 3, 4) and name in ops_in_graph([draws])
    loss.backward()
    for x in params:
        np.testing.assert_array_equal(x.grad.asnumpy(), np.zeros((2, 3)))
    # autograd.grad gives zeros too, not an error for parameters the draws do not depend on.
    with autograd.record():
        draws = getattr(nd, name)(*params, shape=(4,))
    for g in autograd.grad(draws, params):
        np.testing.assert_array_equal(g.asnumpy(), np.zeros((2, 3)))


BINARY_DOMAINS = {"add": (-1, 1), "sub": (-1, 1), "mul": (-1, 1), "div": (0.5, 2), "power": (0.5, 2),
                  "maximum": (-1, 1), "minimum": (-1, 1), "hypot": (0.5, 2), "mod": (0.5, 2)}
BROADCAST_SHAPES = [((2, 3), (2, 3)), ((2, 3), (1, 3)), ((2, 1, 3), (4, 1)), ((3,), (2, 3))]


@pytest.mark.parametrize("name", sorted(BINARY_DOMAINS))
def test_broadcast_binary_gradient(name, ctx):
    fn = getattr(nd, "broadcast_" + name)
    for sa, sb in BROADCAST_SHAPES:
        if name == "mod":
            # Away from the jumps of mod: a in (1.1, 1.9), b in (2, 3) so that a mod b = a.
            make = lambda rng: [rng.uniform(1.1, 1.9, size=sa), rng.uniform(2, 3, size=sb)]
            check_gradient(fn, None, ctx, make=make)
        else:
            check_gradient(fn, [sa, sb], ctx, BINARY_DOMAINS[name])


ELEMWISE = ["elemwise_add", "elemwise_sub", "elemwise_mul", "elemwise_div", "_mod", "_power", "_maximum", "_minimum",
            "_hypot", "_backward_relu"]


@pytest.mark.parametrize("name", ELEMWISE)
def test_elemwise_binary_gradient(name, ctx):
    if name == "_mod":
        # Away from the jumps of mod, as for broadcast_mod.
        make = lambda rng: [rng.uniform(1.1, 1.9, size=(2, 3)), rng.uniform(2, 3, size=(2, 3))]  # noqa: E731
        check_gradient(nd._mod, None, ctx, make=make)
    else:
        check_gradient(getattr(nd, name), [(2, 3), (2, 3)], ctx, (0.5, 2))


SCALAR = ["_plus_scalar", "_minus_scalar", "_rminus_scalar", "_mul_scalar", "_div_scalar", "_rdiv_scalar",
          "_power_scalar", "_rpower_scalar", "_maximum_scalar", "_minimum_scalar", "_hypot_scalar",
          "_mod_scalar", "_rmod_scalar"]


@pytest.mark.parametrize("name", SCALAR)
def test_scalar_gradient(name, ctx):
    scalar = 1.3 if name not in ("_maximum_scalar", "_minimum_scalar") else 1.0
    domain = (1.1, 1.25) if name in ("_mod_scalar", "_rmod_scalar") else (0.5, 2)
    check_gradient(lambda x: getattr(nd, name)(x, scalar=scalar), [(2, 3)], ctx, domain)


def test_python_operators_are_differentiated(ctx):
    check_gradient(lambda a, b: (a * b + 2) / (b - 3) - a ** 2 + 1 / a + 2 ** b, [(2, 3), (2, 3)], ctx, (0.5, 2))


REDUCE_AXES = [None, 0, 1, (0, 2), -1]


REDUCE = ["sum", "mean", "prod", "nansum", "nanprod", "max", "min"]


@pytest.mark.parametrize("name", REDUCE)
def test_reduction_gradient(name, ctx):
    fn = getattr(nd, name)
    for axis in REDUCE_AXES:
        for keepdims in (False, True):
            check_gradient(lambda x: fn(x, axis=axis, keepdims=keepdims), [(2, 3, 4)], ctx, (0.5, 1.5),
                           dtypes=["float64", "float32"])
    check_gradient(lambda x: fn(x, axis=1, exclude=True), [(2, 3, 4)], ctx, (0.5, 1.5), dtypes=["float64"])


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_dot_gradient(ta, tb, ctx):
    sa = (4, 3) if ta else (3, 4)
    sb = (5, 4) if tb else (4, 5)
    check_gradient(lambda a, b: nd.dot(a, b, transpose_a=ta, transpose_b=tb), [sa, sb], ctx)
    ba = (2,) + sa
    bb = (2,) + sb
    check_gradient(lambda a, b: nd.batch_dot(a, b, transpose_a=ta, transpose_b=tb), [ba, bb], ctx)


def test_dot_of_nd_lhs_gradient(ctx):
    check_gradient(lambda a, b: nd.dot(a, b), [(2, 3, 4), (4, 5)], ctx)


SHAPE_CASES = {
    "transpose": (lambda x: nd.transpose(x, axes=(1, 2, 0)), [(2, 3, 4)]),
    "transpose_default": (lambda x: nd.transpose(x), [(2, 3, 4)]),
    "transpose_negative_axes": (lambda x: nd.transpose(x, axes=(-1, 0, 1)), [(2, 3, 4)]),
    "reshape": (lambda x: nd.reshape(x, shape=(4, -1)), [(2, 3, 4)]),
    "reshape_method": (lambda x: x.reshape((6, 4)) * 2, [(2, 3, 4)]),
    "flatten": (nd.flatten, [(2, 3, 4)]),
    "expand_dims": (lambda x: nd.expand_dims(x, axis=1), [(2, 3)]),
    "squeeze": (lambda x: nd.squeeze(x), [(2, 1, 3)]),
    "reshape_like": (lambda x, y: nd.reshape_like(x, y), [(2, 3), (3, 2)]),
    "concat": (lambda a, b, c: nd.concat(a, b, c, dim=1), [(2, 1, 3), (2, 2, 3), (2, 3, 3)]),
    "concat_axis0": (lambda a, b: nd.concat(a, b, dim=0), [(1, 3), (2, 3)]),
    "split": (lambda x: nd.split(x, num_outputs=3, axis=1), [(2, 3, 2)]),
    "split_squeeze": (lambda x: nd.split(x, num_outputs=3, axis=1, squeeze_axis=True), [(2, 3, 2)]),
    "stack": (lambda a, b: nd.stack(a, b, axis=1), [(2, 3), (2, 3)]),
    "swapaxes": (lambda x: nd.swapaxes(x, dim1=0, dim2=2), [(2, 3, 4)]),
    "flip": (lambda x: nd.flip(x, axis=(0, 2)), [(2, 3, 4)]),
    "tile": (lambda x: nd.tile(x, reps=(2, 1, 3)), [(2, 3)]),
    "repeat": (lambda x: nd.repeat(x, repeats=2, axis=1), [(2, 3)]),
    "repeat_flat": (lambda x: nd.repeat(x, repeats=3), [(2, 3)]),
    "broadcast_to": (lambda x: nd.broadcast_to(x, shape=(2, 4, 3)), [(2, 1, 3)]),
    "broadcast_axis": (lambda x: nd.broadcast_axis(x, axis=1, size=4), [(2, 1, 3)]),
    "broadcast_like": (lambda x, y: nd.broadcast_like(x, y), [(1, 3), (4, 3)]),
    "slice": (lambda x: nd.slice(x, begin=(0, 1), end=(2, None), step=(1, 2)), [(3, 5)]),
    "slice_negative_step": (lambda x: nd.slice(x, begin=(None, 4), end=(None, 0), step=(1, -2)), [(3, 5)]),
    "slice_axis": (lambda x: nd.slice_axis(x, axis=-1, begin=1, end=3), [(2, 3, 4)]),
    "getitem": (lambda x: x[1:3, 2] * 1, [(4, 5)]),
    "slice_assign": (lambda x, v: nd._internal._slice_assign(x, v, begin=(0, 1), end=(2, 3)), [(3, 4), (2, 2)]),
    "slice_assign_scalar": (lambda x: nd._internal._slice_assign_scalar(x, scalar=2.0, begin=(1,), end=(2,)),
                            [(3, 4)]),
    "clip": (lambda x: nd.clip(x, a_min=-0.5, a_max=0.5), [(3, 4)]),
    "add_n": (lambda a, b, c: nd.add_n(a, b, c), [(2, 3), (2, 3), (2, 3)]),
    "cast": (lambda x: nd.cast(x, dtype="float64") * 2, [(2, 3)]),
    "slice_like": (lambda x, y: nd.slice_like(x, y, axes=(0, 2)), [(3, 4, 5), (2, 1, 3)]),
    "diag_extract": (lambda x: nd.diag(x, k=1, axis1=0, axis2=2), [(3, 2, 4)]),
    "diag_build": (lambda x: nd.diag(x, k=-1), [(3,)]),
    "pad_constant": (lambda x: nd.pad(x, mode="constant", pad_width=(0, 0, 1, 2, 2, 1), constant_value=3), [(2, 3, 3)]),
    "pad_edge": (lambda x: nd.pad(x, mode="edge", pad_width=(0, 0, 1, 2, 2, 1)), [(2, 3, 3)]),
    "pad_reflect": (lambda x: nd.pad(x, mode="reflect", pad_width=(0, 0, 1, 2, 2, 1)), [(2, 3, 3)]),
    "norm_l2": (lambda x: nd.norm(x, axis=1), [(2, 3, 4)]),
    "norm_l2_all": (lambda x: nd.norm(x), [(2, 3)]),
    "norm_l1": (lambda x: nd.norm(x, ord=1, axis=(0, 2), keepdims=True), [(2, 3, 4)]),
    "moments": (lambda x: nd.moments(x, axes=(0, 2)), [(2, 3, 4)]),
    "moments_keepdims": (lambda x: nd.moments(x, axes=1, keepdims=True), [(2, 3, 4)]),
    "depth_to_space": (lambda x: nd.depth_to_space(x, block_size=2), [(1, 8, 2, 3)]),
    "sort": (lambda x: nd.sort(x, axis=1, is_ascend=False), [(2, 4, 3)]),
    "sort_flat": (lambda x: nd.sort(x, axis=None), [(2, 3)]),
    "topk_value": (lambda x: nd.topk(x, axis=-1, k=2, ret_typ="value"), [(3, 4)]),
    "topk_both": (lambda x: nd.topk(x, axis=0, k=2, ret_typ="both")[0], [(3, 4)]),
    "space_to_depth": (lambda x: nd.space_to_depth(x, block_size=2), [(1, 2, 4, 2)]),
    "identity_with_attr_like_rhs": (lambda x, y: nd._internal._identity_with_attr_like_rhs(x, y), [(2, 3), (2, 3)]),
    "cast_like": (lambda x, y: nd._internal._cast_like(x, y), [(2, 3), (3,)]),
    # AMP's casts pass float64 through; the lower precisions are cast and cast back.
    "amp_cast": (lambda x: nd.amp_cast(x, dtype="float32") * 2, [(2, 3)]),
    "amp_multicast": (lambda a, b: nd.amp_multicast(a, b, num_outputs=2), [(2, 3), (3,)]),
}


@pytest.mark.parametrize("name", sorted(SHAPE_CASES))
def test_shape_op_gradient(name, ctx):
    fn, shapes = SHAPE_CASES[name]
    check_gradient(fn, shapes, ctx)


def test_take_and_where_gradients(ctx):
    for mode, idx in (("clip", [0, 2, 2, 5, -1]), ("wrap", [0, -1, 4, 1])):
        indices = mx.nd.array(idx, ctx=ctx)
        check_gradient(lambda a: nd.take(a, indices, axis=1, mode=mode), [(2, 3, 2)], ctx)
    cond = mx.nd.array([[1, 0, 1], [0, 0, 1]], ctx=ctx)
    check_gradient(lambda x, y: nd.where(cond, x, y), [(2, 3), (2, 3)], ctx)
    rows = mx.nd.array([1, 0], ctx=ctx)
    check_gradient(lambda x, y: nd.where(rows, x, y), [(2, 3), (2, 3)], ctx)


def test_index_driven_op_gradients(ctx):
    index = mx.nd.array([[0, 3, 1], [2, 2, 0]], ctx=ctx)
    check_gradient(lambda x: nd.pick(x, index, axis=1), [(2, 4, 3)], ctx)
    # MXNet registers no gradient for batch_take (deprecated in favour of pick).
    x = mx.nd.ones((2, 4), ctx=ctx)
    x.attach_grad()
    with mx.autograd.record():
        taken = nd.batch_take(x, mx.nd.array([2, 0], ctx=ctx))
    with pytest.raises(mx.MXNetError, match="non-differentiable"):
        taken.backward()
    positions = mx.nd.array([[0, 1, 0], [2, 0, 2]], ctx=ctx)
    check_gradient(lambda x: nd.gather_nd(x, positions), [(2, 3, 4)], ctx)
    check_gradient(lambda v: nd.scatter_nd(v, mx.nd.array([[0, 1], [2, 0]], ctx=ctx), shape=(2, 3, 4)), [(2, 4)], ctx)
    mask = mx.nd.array([1, 0, 1], ctx=ctx)
    check_gradient(lambda x: nd.boolean_mask(x, mask), [(3, 2)], ctx)


# Image operators on (H, W, C) images and (C, H, W) tensors.
IMAGE_CASES = {
    "image_normalize": (lambda x: nd.image.normalize(x, mean=(0.1, 0.2), std=(0.5, 2.0)), [(2, 3, 4)]),
    "image_crop": (lambda x: nd.image.crop(x, x=1, y=0, width=2, height=2), [(3, 4, 2)]),
    "image_flip_left_right": (nd.image.flip_left_right, [(3, 4, 2)]),
    "image_flip_top_bottom": (nd.image.flip_top_bottom, [(2, 3, 4, 2)]),
}


@pytest.mark.parametrize("name", sorted(IMAGE_CASES))
def test_image_op_gradient(name, ctx):
    fn, shapes = IMAGE_CASES[name]
    check_gradient(fn, shapes, ctx, (0, 1), dtypes=["float64", "float32"])


@pytest.mark.parametrize("shape", [(3, 4, 2), (2, 3, 4, 2)])
def test_image_to_tensor_gradient(shape, ctx):
    # Its output is float32 whatever the input, too coarse for finite differences: the gradient
    # is the output gradient moved back to (H, W, C) and divided by 255.
    rng = np.random.RandomState(6)
    x = mx.nd.array(rng.uniform(0, 255, shape), ctx=ctx, dtype="float64")
    x.attach_grad()
    with autograd.record():
        y = nd.image.to_tensor(x)
    head = rng.uniform(-1, 1, y.shape)
    y.backward(mx.nd.array(head, ctx=ctx, dtype="float32"))
    assert_almost_equal(x.grad.asnumpy(), np.moveaxis(head, -3, -1) / 255, rtol=1e-6, atol=1e-9)


# Data augmentations (MXNet's convention): the gradient is the output gradient, unchanged.
PASS_THROUGH_AUGMENTATIONS = {
    "_image_random_flip_left_right": {}, "_image_random_flip_top_bottom": {},
    "_image_random_brightness": {"min_factor": 0.5, "max_factor": 1.5},
    "_image_random_contrast": {"min_factor": 0.5, "max_factor": 1.5},
    "_image_random_saturation": {"min_factor": 0.5, "max_factor": 1.5},
    "_image_random_hue": {"min_factor": 0.1, "max_factor": 0.3},
    "_image_random_color_jitter": {"brightness": 0.2, "contrast": 0.2, "saturation": 0.2, "hue": 0.1},
    "_image_adjust_lighting": {"alpha": (0.1, -0.2, 0.3)},
    "_image_random_lighting": {"alpha_std": 0.1},
}


@pytest.mark.parametrize("name", sorted(PASS_THROUGH_AUGMENTATIONS))
def test_image_augmentations_pass_the_gradient_through(name, ctx):
    rng = np.random.RandomState(5)
    x = mx.nd.array(rng.uniform(0, 1, (2, 3, 4, 3)), ctx=ctx)
    head = rng.uniform(-1, 1, x.shape)
    x.attach_grad()
    with autograd.record():
        y = getattr(nd, name)(x, **PASS_THROUGH_AUGMENTATIONS[name])
    y.backward(mx.nd.array(head, ctx=ctx))
    np.testing.assert_array_equal(x.grad.asnumpy(), head.astype(np.float32))


def test_tile_and_concat_second_order(ctx):
    # Gradient nodes (_backward_tile, _backward_Concat) are differentiable too.
    x = mx.nd.array([[0.5, -0.2, 0.1]], ctx=ctx)
    x.attach_grad()
    with autograd.record():
        y = (nd.tile(x, reps=(2, 2)) ** 3).sum()
        (g,) = autograd.grad(y, [x], create_graph=True)
        z = (g * g).sum()
    z.backward()
    xn = x.asnumpy()
    # y = 4 * sum(x^3): g = 12 x^2, z = sum(144 x^4), dz/dx = 576 x^3
    assert_almost_equal(g.asnumpy(), 12 * xn ** 2, rtol=1e-5)
    assert_almost_equal(x.grad.asnumpy(), 576 * xn ** 3, rtol=1e-5)


def _multinomial_gradient_reference(probs, samples, head):
    """d sum(head * log probs[..., samples]) / d probs: head / p added at each sampled index."""
    expected = np.zeros_like(probs)
    for cell in np.ndindex(*samples.shape):
        at = cell[:probs.ndim - 1] + (int(samples[cell]),)
        expected[at] += head[cell] / probs[at]
    return expected


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_multinomial_log_probability_gradient(dtype, ctx):
    # MXNet's score-function gradient: only the log-probability output (get_prob=True) is
    # differentiated, with respect to the probabilities, at the categories drawn; gradients
    # flowing into the drawn indices add nothing.
    rng = np.random.RandomState(8)
    probs = rng.dirichlet(np.ones(4), size=(2, 3)).astype(dtype)
    p = mx.nd.array(probs, ctx=ctx, dtype=dtype)
    p.attach_grad()
    mx.random.seed(11)
    with autograd.record():
        samples, logp = nd._sample_multinomial(p, shape=(6,), get_prob=True)
        drawn_values = samples.astype(dtype)
    head = rng.uniform(-1, 1, logp.shape).astype(dtype)
    s = samples.asnumpy()
    # Six draws over four categories: some category is drawn twice and its gradients add up.
    assert s.shape == (2, 3, 6)
    autograd.backward([drawn_values, logp], [mx.nd.ones(s.shape, ctx=ctx, dtype=dtype),
                                             mx.nd.array(head, ctx=ctx, dtype=dtype)])
    expected = _multinomial_gradient_reference(probs.astype(np.float64), s, head.astype(np.float64))
    tolerance = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-2}[dtype]
    assert_almost_equal(p.grad.asnumpy().astype(np.float64), expected, rtol=tolerance, atol=tolerance)
    assert "_backward_sample_multinomial" in ops_in_graph(
        gradient_graph_of(lambda q: nd._sample_multinomial(q, get_prob=True)[1])(mx.nd.array(probs, ctx=ctx)))

    # One draw per distribution of a 1-D data array, through the public wrapper.
    q = mx.nd.array([0.1, 0.6, 0.3], ctx=ctx, dtype="float64")
    q.attach_grad()
    with autograd.record():
        drawn, logq = mx.nd.random.multinomial(q, get_prob=True)
    logq.backward(mx.nd.array([2.0], ctx=ctx, dtype="float64"))
    expected = np.zeros(3)
    expected[int(drawn.asscalar())] = 2.0 / q.asnumpy()[int(drawn.asscalar())]
    assert_almost_equal(q.grad.asnumpy(), expected, rtol=1e-12, atol=0)

    # Without get_prob there is only the drawn indices, and a zero gradient.
    with autograd.record():
        only = nd._sample_multinomial(p, shape=(2,)).astype(dtype)
    only.backward()
    np.testing.assert_array_equal(p.grad.asnumpy(), np.zeros(probs.shape, dtype=dtype))


def test_multinomial_gradient_rejects_foreign_samples(ctx):
    probs = mx.nd.array([[0.5, 0.5], [0.2, 0.8]], ctx=ctx)
    with pytest.raises(mx.MXNetError, match="_backward_sample_multinomial.*category index"):
        nd._backward_sample_multinomial(mx.nd.ones((2, 1), ctx=ctx), probs,
                                        mx.nd.array([[0], [2]], ctx=ctx, dtype="int32")).asnumpy()
    with pytest.raises(mx.MXNetError, match="_backward_sample_multinomial.*must share the shape"):
        nd._backward_sample_multinomial(mx.nd.ones((3,), ctx=ctx), probs,
                                        mx.nd.array([0, 1, 1], ctx=ctx, dtype="int32"))


def gradient_graph_of(fn):
    """``fn``'s input gradients for the loss sum(out * out) over its outputs, as a recorded function
    of the inputs: its own gradient is the second derivative, made of the gradients of the nodes
    that fn's backward pass consists of (the loss keeps their output gradients input-dependent)."""
    def gradients(*xs):
        if not autograd.is_recording():
            xs = [x.copy() for x in xs]
            for x in xs:
                x.attach_grad()
            with autograd.record():
                return gradients(*xs)
        outs = fn(*xs)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        loss = sum((o * o).sum() for o in outs)
        return autograd.grad(loss, list(xs), create_graph=True)
    return gradients


def ops_in_graph(outputs):
    return {node["op"] for out in outputs for node in json.loads(autograd.get_symbol(out).tojson())["nodes"]}


# Differentiable gradient nodes: node -> (forward function whose backward pass uses it, input shapes).
SECOND_ORDER = {
    "_reduce_sum_to_like": (lambda a, b: nd.broadcast_mul(a, b), [(2, 3), (1, 3)]),
    "_broadcast_reduced_like": (lambda x: nd.sum(x, axis=1), [(2, 3)]),
    "_backward_Concat": (lambda a, b: nd.concat(a, b, dim=1), [(2, 1), (2, 2)]),
    "_backward_slice_axis": (lambda x: nd.slice_axis(x, axis=1, begin=1, end=3), [(2, 4)]),
    "_backward_take": (lambda x: nd.take(x, mx.nd.array([0, 2, 2], ctx=x.context)), [(3, 2)]),
    "_backward_repeat": (lambda x: nd.repeat(x, repeats=2, axis=1), [(2, 3)]),
    "_backward_pick": (lambda x: nd.pick(x, mx.nd.array([0, 2], ctx=x.context), axis=1), [(2, 3)]),
    "_backward_gather_nd": (lambda x: nd.gather_nd(x, mx.nd.array([[0, 1, 1], [2, 0, 0]], ctx=x.context)), [(2, 3)]),
    "_backward_slice_like": (lambda x: nd.slice_like(x, mx.nd.zeros((2, 2), ctx=x.context)), [(3, 4)]),
    "_backward_boolean_mask": (lambda x: nd.boolean_mask(x, mx.nd.array([1, 0, 1], ctx=x.context)), [(3, 2)]),
    "_backward_diag": (lambda x: nd.diag(x, k=1), [(3, 3)]),
    "_backward_pad": (lambda x: nd.pad(x, mode="reflect", pad_width=(0, 0, 0, 0, 1, 1, 1, 1)), [(1, 1, 3, 3)]),
    "_backward_image_normalize": (lambda x: nd.image.normalize(x, mean=(0.1, 0.2), std=(0.5, 2.0)), [(2, 2, 3)]),
    "_backward_FullyConnected": (lambda x, w, b: nd.FullyConnected(x, w, b, num_hidden=4), [(2, 3), (4, 3), (4,)]),
}


@pytest.mark.parametrize("node", sorted(SECOND_ORDER))
def test_gradient_node_gradient(node, ctx):
    fn, shapes = SECOND_ORDER[node]
    xs = [mx.nd.array(np.random.RandomState(7).uniform(-1, 1, s), ctx=ctx, dtype="float64") for s in shapes]
    assert node in ops_in_graph(gradient_graph_of(fn)(*xs))
    check_gradient(gradient_graph_of(fn), shapes, ctx, dtypes=["float64"])


@pytest.mark.parametrize("flatten, no_bias", [(True, False), (False, False), (True, True), (False, True)])
def test_fully_connected_higher_order_gradients(flatten, no_bias, ctx):
    features = 6 if flatten else 3
    shapes = [(2, 2, 3), (4, features)] + ([] if no_bias else [(4,)])

    def dense(*args):
        return nd.FullyConnected(*args, num_hidden=4, flatten=flatten, no_bias=no_bias)

    # The loss sum(y * y) makes the output gradient depend on the inputs, so the second order
    # differentiates every input of _backward_FullyConnected; its gradient is made of
    # FullyConnected and dot, so the third order exists too.
    check_gradient(gradient_graph_of(dense), shapes, ctx, dtypes=["float64", "float32"])
    check_gradient(gradient_graph_of(gradient_graph_of(dense)), shapes, ctx, dtypes=["float64"])

    # A constant output gradient and a head on one first-order gradient at a time, against
    # MXNet 1.9.1's closed forms: d(w_grad)/dx = o_y . o_w_grad, d(x_grad)/dw = o_y^T . o_x_grad.
    rng = np.random.RandomState(9)
    x, w, *bias = [mx.nd.array(rng.uniform(-1, 1, s), ctx=ctx, dtype="float64") for s in shapes]
    for a in [x, w, *bias]:
        a.attach_grad()
    with autograd.record():
        y = dense(x, w, *bias)
        o_y = mx.nd.array(rng.uniform(-1, 1, y.shape), ctx=ctx, dtype="float64")
        (x_grad,) = autograd.grad(y, [x], head_grads=o_y, create_graph=True)
        o_x_grad = mx.nd.array(rng.uniform(-1, 1, x.shape), ctx=ctx, dtype="float64")
        (w_grad_grad,) = autograd.grad(x_grad, [w], head_grads=o_x_grad)
        (w_grad,) = autograd.grad(y, [w], head_grads=o_y, create_graph=True)
        o_w_grad = mx.nd.array(rng.uniform(-1, 1, w.shape), ctx=ctx, dtype="float64")
        (x_grad_grad,) = autograd.grad(w_grad, [x], head_grads=o_w_grad)

    def rows(a):
        return a.asnumpy().reshape((2, -1) if flatten else (-1, a.shape[-1]))

    assert_almost_equal(x_grad.asnumpy(), (rows(o_y) @ w.asnumpy()).reshape(x.shape), rtol=1e-12, atol=1e-12)
    assert_almost_equal(w_grad_grad.asnumpy(), rows(o_y).T @ rows(o_x_grad), rtol=1e-12, atol=1e-12)
    assert_almost_equal(x_grad_grad.asnumpy(), (rows(o_y) @ o_w_grad.asnumpy()).reshape(x.shape), rtol=1e-12,
                        atol=1e-12)


@pytest.mark.parametrize("op, kwargs", [("softmax", {"axis": -1}), ("log_softmax", {"axis": -1}),
                                        ("log_softmax", {"axis": 0}), ("softmin", {"axis": 1, "temperature": 2.0})])
def test_softmax_gradients_are_differentiable(op, kwargs, ctx):
    # The fused _backward_softmax/_backward_log_softmax kernels have their own gradients:
    # z = sum(w * d/dx sum(v * op(x))) differentiated by autograd and by central differences.
    check_gradient(lambda x: getattr(nd, op)(x, **kwargs), [(3, 5)], ctx)
    rng = np.random.RandomState(4)
    x0, v, w = (rng.uniform(-1, 1, (3, 5)) for _ in range(3))
    v_nd, w_nd = mx.nd.array(v, ctx=ctx, dtype="float64"), mx.nd.array(w, ctx=ctx, dtype="float64")

    def z_of(values, create_graph):
        x = mx.nd.array(values, ctx=ctx, dtype="float64")
        x.attach_grad()
        with autograd.record():
            y = (v_nd * getattr(nd, op)(x, **kwargs)).sum()
            (g,) = autograd.grad(y, [x], create_graph=create_graph)
            z = (w_nd * g).sum()
        return x, z

    x, z = z_of(x0, True)
    z.backward()
    numeric = np.zeros_like(x0)
    for i in np.ndindex(*x0.shape):
        step = np.zeros_like(x0)
        step[i] = 1e-6
        numeric[i] = (z_of(x0 + step, False)[1].asscalar() - z_of(x0 - step, False)[1].asscalar()) / 2e-6
    assert_almost_equal(x.grad.asnumpy(), numeric, rtol=1e-5, atol=1e-7)


def _symmetric(x, shift):
    """(x + x^T) / 2 + shift * I: the factorizations of symmetric matrices read one triangle, so
    their gradients are checked through a symmetric parametrization."""
    eye = nd.array(np.eye(x.shape[-1]), ctx=x.context, dtype=x.dtype)
    return (x + nd.swapaxes(x, dim1=-1, dim2=-2)) * 0.5 + eye * shift


def _shifted(x, shift=3.0):
    return x + nd.array(shift * np.eye(x.shape[-1]), ctx=x.context, dtype=x.dtype)


LINALG_GRADIENTS = {
    "gemm": (lambda a, b, c: nd.linalg.gemm(a, b, c, alpha=1.5, beta=0.5), [(2, 3, 4), (2, 4, 5), (2, 3, 5)]),
    "gemm_transposed": (lambda a, b, c: nd.linalg.gemm(a, b, c, transpose_a=True, transpose_b=True, beta=-2.0),
                        [(4, 3), (5, 4), (3, 5)]),
    "gemm2": (lambda a, b: nd.linalg.gemm2(a, b, transpose_b=True, alpha=0.5), [(2, 3, 4), (2, 5, 4)]),
    "gemm2_axis": (lambda a, b: nd.linalg.gemm2(a, b, transpose_a=True, axis=1), [(2, 4, 2, 3), (2, 4, 2, 5)]),
    "potrf": (lambda x: nd.linalg.potrf(_symmetric(x, 3.0)), [(2, 3, 3)]),
    "potrf_upper": (lambda x: nd.linalg.potrf(_symmetric(x, 3.0), lower=False), [(3, 3)]),
    "potri": (lambda x: nd.linalg.potri(_shifted(x)), [(2, 3, 3)]),
    "potri_upper": (lambda x: nd.linalg.potri(_shifted(x), lower=False), [(3, 3)]),
    "trmm": (lambda a, b: nd.linalg.trmm(a, b, alpha=1.5), [(2, 3, 3), (2, 3, 4)]),
    "trmm_right_transposed_upper": (lambda a, b: nd.linalg.trmm(a, b, rightside=True, transpose=True, lower=False),
                                    [(3, 3), (4, 3)]),
    "trsm": (lambda a, b: nd.linalg.trsm(_shifted(a), b, alpha=1.5), [(3, 3), (3, 4)]),
    "trsm_transposed": (lambda a, b: nd.linalg.trsm(_shifted(a), b, transpose=True), [(2, 3, 3), (2, 3, 4)]),
    "trsm_right_transposed_upper": (lambda a, b: nd.linalg.trsm(_shifted(a), b, rightside=True, transpose=True,
                                                                lower=False, alpha=0.7), [(2, 3, 3), (2, 4, 3)]),
    "sumlogdiag": (lambda x: nd.linalg.sumlogdiag(_shifted(x)), [(3, 3)]),
    "sumlogdiag_batch": (lambda x: nd.linalg.sumlogdiag(_shifted(x)), [(2, 3, 3)]),
    "syrk": (lambda x: nd.linalg.syrk(x, alpha=0.5), [(2, 3, 4)]),
    "syrk_transposed": (lambda x: nd.linalg.syrk(x, transpose=True), [(3, 4)]),
    "gelqf": (nd.linalg.gelqf, [(2, 3, 4)]),
    "syevd": (lambda x: nd.linalg.syevd(_symmetric(x, 0.0)), [(2, 3, 3)]),
    "inverse": (lambda x: nd.linalg.inverse(_shifted(x)), [(2, 3, 3)]),
    "det": (nd.linalg.det, [(3, 3)]),
    "det_batch": (nd.linalg.det, [(2, 3, 3)]),
    "slogdet": (nd.linalg.slogdet, [(2, 3, 3)]),
    "extractdiag": (lambda x: nd.linalg.extractdiag(x, offset=-1), [(2, 3, 3)]),
    "makediag": (lambda x: nd.linalg.makediag(x, offset=1), [(2, 3)]),
    "extracttrian": (lambda x: nd.linalg.extracttrian(x, offset=1), [(2, 3, 3)]),
    "maketrian": (lambda x: nd.linalg.maketrian(x, lower=False), [(2, 6)]),
}


@pytest.mark.parametrize("name", sorted(LINALG_GRADIENTS))
def test_linalg_gradient(name, ctx):
    fn, shapes = LINALG_GRADIENTS[name]
    check_gradient(fn, shapes, ctx, dtypes=["float64", "float32"])


def test_linalg_gradients_of_singular_matrices_are_zero(ctx):
    # MXNet backpropagates nothing through det/slogdet of a singular matrix.
    x = nd.array([[[1., 2.], [2., 4.]], [[2., 1.], [1., 3.]]], ctx=ctx, dtype="float64")
    for fn in (nd.linalg.det, lambda a: nd.linalg.slogdet(a)[1]):
        x.attach_grad()
        with autograd.record():
            y = fn(x)
        y.backward()
        grad = x.grad.asnumpy()
        assert (grad[0] == 0).all()
        expected = np.linalg.inv(x.asnumpy()[1]).T * (np.linalg.det(x.asnumpy()[1]) if fn is nd.linalg.det else 1)
        assert_almost_equal(grad[1], expected, rtol=1e-10, atol=1e-12)


def test_linalg_second_order_gradient(ctx):
    # Gradients are graphs of linalg operators, so they differentiate again: d/dA sum(g * g) for
    # g = d sum(inverse(A)) / dA, against central differences of g.
    rng = np.random.RandomState(2)
    a0, w = rng.uniform(-1, 1, (3, 3)) + 3 * np.eye(3), rng.uniform(-1, 1, (3, 3))
    w_nd = nd.array(w, ctx=ctx, dtype="float64")

    def z_of(values, create_graph):
        a = nd.array(values, ctx=ctx, dtype="float64")
        a.attach_grad()
        with autograd.record():
            (g,) = autograd.grad(nd.linalg.inverse(a).sum(), [a], create_graph=create_graph)
            z = (w_nd * g).sum()
        return a, z

    a, z = z_of(a0, True)
    z.backward()
    numeric = np.zeros_like(a0)
    for i in np.ndindex(*a0.shape):
        step = np.zeros_like(a0)
        step[i] = 1e-6
        numeric[i] = (z_of(a0 + step, False)[1].asscalar() - z_of(a0 - step, False)[1].asscalar()) / 2e-6
    assert_almost_equal(a.grad.asnumpy(), numeric, rtol=1e-5, atol=1e-7)
