"""How each MXNet operator becomes ONNX nodes.

A translation is ``fn(g, n)``: ``g`` is the graph being built (see ``_export.GraphBuilder``) and ``n`` the
MXNet node (``_export.MXNode``: parsed attributes, input tensor names, inferred shapes and dtypes). It must
write every output ``n.out(k)`` that the graph uses. Translations target opset 13 and say where opset 12
differs; the shapes inferred at export time are used only where they stay valid when ``dynamic=True``.
"""

import numpy as np

TRANSLATIONS = {}

_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min


def translates(*op_names):
    def register(fn):
        for name in op_names:
            TRANSLATIONS[name] = fn
        return fn
    return register


# ---------------------------------------------------------------------------------------------- element-wise

_UNARY = {
    "relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
    "abs": "Abs", "negative": "Neg", "reciprocal": "Reciprocal", "sin": "Sin", "cos": "Cos", "tan": "Tan",
    "arcsin": "Asin", "arccos": "Acos", "arctan": "Atan", "sinh": "Sinh", "cosh": "Cosh", "arcsinh": "Asinh",
    "arccosh": "Acosh", "arctanh": "Atanh", "floor": "Floor", "ceil": "Ceil", "sign": "Sign", "erf": "Erf",
    "softsign": "Softsign", "_copy": "Identity", "BlockGrad": "Identity", "MakeLoss": "Identity",
    "Dropout": "Identity",
    # Loss layers at inference: the prediction only (their label input is dropped from the graph).
    "LogisticRegressionOutput": "Sigmoid", "LinearRegressionOutput": "Identity", "MAERegressionOutput": "Identity",
}


def _unary(onnx_op):
    def translate(g, n):
        g.op(onnx_op, [n.inputs[0]], n.out(0), name=n.name)
    return translate


for _mx_op, _onnx_op in _UNARY.items():
    translates(_mx_op)(_unary(_onnx_op))


@translates("square")
def _square(g, n):
    g.op("Mul", [n.inputs[0], n.inputs[0]], n.out(0), name=n.name)


@translates("rsqrt")
def _rsqrt(g, n):
    g.op("Reciprocal", [g.op("Sqrt", [n.inputs[0]])], n.out(0), name=n.name)


@translates("expm1")
def _expm1(g, n):
    g.op("Sub", [g.op("Exp", [n.inputs[0]]), g.scalar(1, n.in_dtypes[0])], n.out(0), name=n.name)


@translates("log1p")
def _log1p(g, n):
    g.op("Log", [g.op("Add", [n.inputs[0], g.scalar(1, n.in_dtypes[0])])], n.out(0), name=n.name)


@translates("log2", "log10")
def _log_base(g, n):
    base = 2.0 if n.op == "log2" else 10.0
    g.op("Div", [g.op("Log", [n.inputs[0]]), g.scalar(np.log(base), n.in_dtypes[0])], n.out(0), name=n.name)


_BINARY = {
    "elemwise_add": "Add", "broadcast_add": "Add", "elemwise_sub": "Sub", "broadcast_sub": "Sub",
    "elemwise_mul": "Mul", "broadcast_mul": "Mul", "elemwise_div": "Div", "broadcast_div": "Div",
    "_power": "Pow", "broadcast_power": "Pow", "_maximum": "Max", "broadcast_maximum": "Max",
    "_minimum": "Min", "broadcast_minimum": "Min",
}


def _binary(onnx_op):
    def translate(g, n):
        g.op(onnx_op, n.inputs[:2], n.out(0), name=n.name)
    return translate


for _mx_op, _onnx_op in _BINARY.items():
    translates(_mx_op)(_binary(_onnx_op))


@translates("add_n")
def _add_n(g, n):
    g.op("Sum", n.inputs, n.out(0), name=n.name)


# MXNet comparisons give 0/1 in the operands' dtype; ONNX gives booleans.
_COMPARISONS = {
    "_equal": ("Equal", False), "broadcast_equal": ("Equal", False),
    "_not_equal": ("Equal", True), "broadcast_not_equal": ("Equal", True),
    "_greater": ("Greater", False), "broadcast_greater": ("Greater", False),
    "_greater_equal": ("GreaterOrEqual", False), "broadcast_greater_equal": ("GreaterOrEqual", False),
    "_lesser": ("Less", False), "broadcast_lesser": ("Less", False),
    "_lesser_equal": ("LessOrEqual", False), "broadcast_lesser_equal": ("LessOrEqual", False),
}


def _compare(g, n, onnx_op, negate, lhs, rhs):
    result = g.op(onnx_op, [lhs, rhs])
    if negate:
        result = g.op("Not", [result])
    g.op("Cast", [result], n.out(0), name=n.name, to=g.tensor_type(n.out_dtypes[0]))


def _comparison(onnx_op, negate):
    def translate(g, n):
        _compare(g, n, onnx_op, negate, n.inputs[0], n.inputs[1])
    return translate


for _mx_op, (_onnx_op, _negate) in _COMPARISONS.items():
    translates(_mx_op)(_comparison(_onnx_op, _negate))


# name: (ONNX op, scalar on the left)
_SCALAR_ARITHMETIC = {
    "_plus_scalar": ("Add", False), "_minus_scalar": ("Sub", False), "_rminus_scalar": ("Sub", True),
    "_mul_scalar": ("Mul", False), "_div_scalar": ("Div", False), "_rdiv_scalar": ("Div", True),
    "_power_scalar": ("Pow", False), "_rpower_scalar": ("Pow", True),
    "_maximum_scalar": ("Max", False), "_minimum_scalar": ("Min", False),
}


def _scalar_arithmetic(onnx_op, scalar_first):
    def translate(g, n):
        scalar = g.scalar(n.float("scalar"), n.in_dtypes[0])
        operands = [scalar, n.inputs[0]] if scalar_first else [n.inputs[0], scalar]
        g.op(onnx_op, operands, n.out(0), name=n.name)
    return translate


for _mx_op, (_onnx_op, _first) in _SCALAR_ARITHMETIC.items():
    translates(_mx_op)(_scalar_arithmetic(_onnx_op, _first))


def _scalar_comparison(onnx_op, negate):
    def translate(g, n):
        _compare(g, n, onnx_op, negate, n.inputs[0], g.scalar(n.float("scalar"), n.in_dtypes[0]))
    return translate


for _mx_op, (_onnx_op, _negate) in _COMPARISONS.items():
    if _mx_op.startswith("_"):
        translates(_mx_op + "_scalar")(_scalar_comparison(_onnx_op, _negate))


@translates("clip")
def _clip(g, n):
    dtype = n.in_dtypes[0]
    g.op("Clip", [n.inputs[0], g.scalar(n.float("a_min"), dtype), g.scalar(n.float("a_max"), dtype)],
         n.out(0), name=n.name)


@translates("Cast")
def _cast(g, n):
    g.op("Cast", [n.inputs[0]], n.out(0), name=n.name, to=g.tensor_type(n.out_dtypes[0]))


@translates("where")
def _where(g, n):
    condition = g.op("Cast", [n.inputs[0]], to=g.tensor_type(np.bool_))
    g.op("Where", [condition, n.inputs[1], n.inputs[2]], n.out(0), name=n.name)


# ---------------------------------------------------------------------------------------------- activations

@translates("Activation")
def _activation(g, n):
    act_type = n.str("act_type")
    onnx_ops = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "softrelu": "Softplus", "softsign": "Softsign"}
    if act_type not in onnx_ops:
        raise n.unsupported("act_type=%r" % act_type)
    g.op(onnx_ops[act_type], [n.inputs[0]], n.out(0), name=n.name)


# MXNet's SELU constants (float precision, as its kernels use them).
_SELU_ALPHA = float(np.float32(1.6732632423543772848170429916717))
_SELU_LAMBDA = float(np.float32(1.0507009873554804934193349852946))


def _gelu(g, x, dtype, out, name):
    """0.5 x (1 + erf(x / sqrt(2))): MXNet's exact GELU; ONNX has no Gelu before opset 20."""
    erf = g.op("Erf", [g.op("Div", [x, g.scalar(np.sqrt(2.0), dtype)])])
    half_x = g.op("Mul", [x, g.scalar(0.5, dtype)])
    g.op("Mul", [half_x, g.op("Add", [erf, g.scalar(1.0, dtype)])], out, name=name)


@translates("LeakyReLU")
def _leaky_relu(g, n):
    act_type = n.str("act_type", "leaky")
    x, out = n.inputs[0], n.out(0)
    if act_type == "leaky":
        g.op("LeakyRelu", [x], out, name=n.name, alpha=n.float("slope", 0.25))
    elif act_type == "rrelu":  # at inference the random slope is its mean
        slope = (n.float("lower_bound", 0.125) + n.float("upper_bound", 0.334)) / 2
        g.op("LeakyRelu", [x], out, name=n.name, alpha=slope)
    elif act_type == "elu":
        g.op("Elu", [x], out, name=n.name, alpha=n.float("slope", 0.25))
    elif act_type == "selu":
        g.op("Selu", [x], out, name=n.name, alpha=_SELU_ALPHA, gamma=_SELU_LAMBDA)
    elif act_type == "gelu":
        _gelu(g, x, n.in_dtypes[0], out, n.name)
    elif act_type == "prelu":
        # ONNX broadcasts the slope from the right; MXNet's gamma runs along axis 1.
        slope_shape = [-1] + [1] * (len(n.in_shapes[0]) - 2)
        g.op("PRelu", [x, g.reshape_const_or_node(n.inputs[1], slope_shape)], out, name=n.name)
    else:
        raise n.unsupported("act_type=%r" % act_type)


def _softmax_along(g, x, axis, rank, onnx_op, out, name):
    """Softmax/LogSoftmax along one axis: opset 13 does it directly; opset 12's flattens from `axis` on, which
    is one axis only for the last, so other axes go last and back."""
    axis = axis % rank
    if g.opset >= 13 or axis == rank - 1:
        return g.op(onnx_op, [x], out, name=name, axis=axis)
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    moved = g.op(onnx_op, [g.op("Transpose", [x], perm=perm)], axis=rank - 1)
    return g.op("Transpose", [moved], out, name=name, perm=perm)


def _softmax_over_trailing(g, x, shape, onnx_op, out, name):
    """Softmax over all axes but the first, as MXNet's SoftmaxOutput and SoftmaxActivation(instance) do."""
    if g.opset < 13 or len(shape) == 2:  # opset 12's Softmax flattens from `axis` on: exactly this
        return g.op(onnx_op, [x], out, name=name, axis=1)
    flat = g.op(onnx_op, [g.op("Flatten", [x], axis=1)], axis=1)
    return g.op("Reshape", [flat, g.shape_of(x, shape)], out, name=name)


def _scaled_by_temperature(g, n):
    temperature = n.opt_float("temperature")
    if temperature is None or temperature == 1.0:
        return n.inputs[0]
    return g.op("Div", [n.inputs[0], g.scalar(temperature, n.in_dtypes[0])])


@translates("softmax", "log_softmax", "softmin")
def _softmax(g, n):
    if n.bool("use_length", False):
        raise n.unsupported("use_length=True")
    x = _scaled_by_temperature(g, n)
    if n.op == "softmin":
        x = g.op("Neg", [x])
    onnx_op = "LogSoftmax" if n.op == "log_softmax" else "Softmax"
    _softmax_along(g, x, n.int("axis", -1), len(n.in_shapes[0]), onnx_op, n.out(0), n.name)


@translates("SoftmaxOutput")
def _softmax_output(g, n):
    rank = len(n.in_shapes[0])
    if n.bool("multi_output", False):
        _softmax_along(g, n.inputs[0], 1, rank, "Softmax", n.out(0), n.name)
    elif n.bool("preserve_shape", False):
        _softmax_along(g, n.inputs[0], -1, rank, "Softmax", n.out(0), n.name)
    else:
        _softmax_over_trailing(g, n.inputs[0], n.in_shapes[0], "Softmax", n.out(0), n.name)


@translates("SoftmaxActivation")
def _softmax_activation(g, n):
    rank = len(n.in_shapes[0])
    if n.str("mode", "instance") == "channel":
        _softmax_along(g, n.inputs[0], 1, rank, "Softmax", n.out(0), n.name)
    else:
        _softmax_over_trailing(g, n.inputs[0], n.in_shapes[0], "Softmax", n.out(0), n.name)


# ---------------------------------------------------------------------------------------------- layers

def _channels_first(n, rank):
    layout = n.opt_str("layout")
    if layout not in (None, ["NCW", "NCHW", "NCDHW"][rank - 1]):
        raise n.unsupported("layout=%s (only channels-first layouts map to ONNX)" % layout)


def _spatial(n, key, rank, default):
    values = n.ints(key, ())
    return list(values) if values else [default] * rank


@translates("Convolution")
def _convolution(g, n):
    kernel = list(n.ints("kernel"))
    rank = len(kernel)
    _channels_first(n, rank)
    pad = _spatial(n, "pad", rank, 0)
    inputs = n.inputs[:2] if n.bool("no_bias", False) else n.inputs[:3]
    g.op("Conv", inputs, n.out(0), name=n.name, kernel_shape=kernel, strides=_spatial(n, "stride", rank, 1),
         dilations=_spatial(n, "dilate", rank, 1), pads=pad + pad, group=n.int("num_group", 1))


@translates("Deconvolution")
def _deconvolution(g, n):
    kernel = list(n.ints("kernel"))
    rank = len(kernel)
    _channels_first(n, rank)
    stride = _spatial(n, "stride", rank, 1)
    dilate = _spatial(n, "dilate", rank, 1)
    pad = _spatial(n, "pad", rank, 0)
    adj = _spatial(n, "adj", rank, 0)
    target = _spatial(n, "target_shape", rank, 0)
    in_spatial = n.in_shapes[0][2:]
    if any(target):  # MXNet derives pad and adj from the target size
        for a in range(rank):
            excess = stride[a] * (in_spatial[a] - 1) + dilate[a] * (kernel[a] - 1) + 1 - target[a]
            adj[a], pad[a] = excess % 2, (excess + 1) // 2
    # MXNet crops `pad` from both ends of the full transposed convolution, then extends the end by `adj`.
    pads_end = [max(p - a, 0) for p, a in zip(pad, adj)]
    output_padding = [max(a - p, 0) for p, a in zip(pad, adj)]
    inputs = n.inputs[:2] if n.bool("no_bias", True) else n.inputs[:3]
    attrs = dict(kernel_shape=kernel, strides=stride, dilations=dilate, pads=pad + pads_end,
                 group=n.int("num_group", 1))
    if any(output_padding):
        attrs["output_padding"] = output_padding
    g.op("ConvTranspose", inputs, n.out(0), name=n.name, **attrs)


@translates("FullyConnected")
def _fully_connected(g, n):
    x, weight = n.inputs[0], n.inputs[1]
    no_bias = n.bool("no_bias", False)
    if n.bool("flatten", True):
        if len(n.in_shapes[0]) != 2:
            x = g.op("Flatten", [x], axis=1)
        g.op("Gemm", [x, weight] + ([] if no_bias else [n.inputs[2]]), n.out(0), name=n.name, transB=1)
        return
    product = g.op("MatMul", [x, g.op("Transpose", [weight], perm=[1, 0])],
                   n.out(0) if no_bias else None, name=n.name if no_bias else None)
    if not no_bias:
        g.op("Add", [product, n.inputs[2]], n.out(0), name=n.name)


@translates("BatchNorm")
def _batch_norm(g, n):
    axis = n.int("axis", 1) % len(n.in_shapes[0])
    if axis != 1:
        raise n.unsupported("axis=%d (ONNX BatchNormalization normalizes axis 1)" % axis)
    if n.bool("output_mean_var", False) and any(n.used(k) for k in (1, 2)):
        raise n.unsupported("output_mean_var=True")
    x, gamma, beta, mean, var = n.inputs[:5]
    if n.bool("fix_gamma", True):  # gamma is ignored and taken as 1
        gamma = g.const(np.ones(n.in_shapes[1], dtype=n.in_dtypes[1]), gamma + "_fixed")
    g.op("BatchNormalization", [x, gamma, beta, mean, var], n.out(0), name=n.name,
         epsilon=n.float("eps", 1e-3), momentum=n.float("momentum", 0.9))


@translates("InstanceNorm")
def _instance_norm(g, n):
    g.op("InstanceNormalization", n.inputs[:3], n.out(0), name=n.name, epsilon=n.float("eps", 1e-3))


@translates("LayerNorm")
def _layer_norm(g, n):
    if n.bool("output_mean_var", False) and any(n.used(k) for k in (1, 2)):
        raise n.unsupported("output_mean_var=True")
    x, gamma, beta = n.inputs[:3]
    rank = len(n.in_shapes[0])
    axis = n.int("axis", -1) % rank
    dtype = n.in_dtypes[0]
    # ONNX has LayerNormalization only from opset 17.
    centered = g.op("Sub", [x, g.reduce("ReduceMean", x, [axis], keepdims=1)])
    variance = g.reduce("ReduceMean", g.op("Mul", [centered, centered]), [axis], keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [variance, g.scalar(n.float("eps", 1e-5), dtype)])])
    normalized = g.op("Div", [centered, std])
    scale_shape = [-1] + [1] * (rank - 1 - axis)
    scaled = g.op("Mul", [normalized, g.reshape_const_or_node(gamma, scale_shape)])
    g.op("Add", [scaled, g.reshape_const_or_node(beta, scale_shape)], n.out(0), name=n.name)


@translates("L2Normalization")
def _l2_normalization(g, n):
    rank = len(n.in_shapes[0])
    mode = n.str("mode", "instance")
    axes = {"instance": list(range(1, rank)), "channel": [1], "spatial": list(range(2, rank))}.get(mode)
    if axes is None:
        raise n.unsupported("mode=%r" % mode)
    x = n.inputs[0]
    sum_sq = g.reduce("ReduceSumSquare", x, axes, keepdims=1)
    norm = g.op("Sqrt", [g.op("Add", [sum_sq, g.scalar(n.float("eps", 1e-10), n.in_dtypes[0])])])
    g.op("Div", [x, norm], n.out(0), name=n.name)


@translates("LRN")
def _lrn(g, n):
    g.op("LRN", [n.inputs[0]], n.out(0), name=n.name, alpha=n.float("alpha", 1e-4), beta=n.float("beta", 0.75),
         bias=n.float("knorm", 2.0), size=n.int("nsize"))


@translates("Pooling")
def _pooling(g, n):
    x, out = n.inputs[0], n.out(0)
    rank = len(n.in_shapes[0]) - 2
    _channels_first(n, rank)
    pool_type = n.str("pool_type", "max")
    convention = n.str("pooling_convention", "valid")
    p_value = n.opt_int("p_value") or 2
    if pool_type not in ("max", "avg", "sum", "lp"):
        raise n.unsupported("pool_type=%r" % pool_type)
    if n.bool("global_pool", False):
        spatial_axes = list(range(2, rank + 2))
        if pool_type == "max":
            g.op("GlobalMaxPool", [x], out, name=n.name)
        elif pool_type == "avg":
            g.op("GlobalAveragePool", [x], out, name=n.name)
        elif pool_type == "sum":
            g.reduce("ReduceSum", x, spatial_axes, keepdims=1, out=out, name=n.name)
        else:
            g.op("GlobalLpPool", [x], out, name=n.name, p=p_value)
        return
    if convention == "same":
        raise n.unsupported("pooling_convention='same'")
    kernel = list(n.ints("kernel"))
    pad = _spatial(n, "pad", rank, 0)
    attrs = dict(kernel_shape=kernel, strides=_spatial(n, "stride", rank, 1), pads=pad + pad)
    ceil_mode = 1 if convention == "full" else 0
    if pool_type == "max":
        g.op("MaxPool", [x], out, name=n.name, ceil_mode=ceil_mode, **attrs)
    elif pool_type == "lp":
        if ceil_mode:
            raise n.unsupported("pool_type='lp' with pooling_convention='full'")
        g.op("LpPool", [x], out, name=n.name, p=p_value, **attrs)
    else:
        # A sum is an average over the whole window, padding included, times the window size.
        count_pad = 1 if pool_type == "sum" or n.bool("count_include_pad", True) else 0
        if pool_type == "avg":
            g.op("AveragePool", [x], out, name=n.name, ceil_mode=ceil_mode, count_include_pad=count_pad, **attrs)
        else:
            mean = g.op("AveragePool", [x], ceil_mode=ceil_mode, count_include_pad=count_pad, **attrs)
            g.op("Mul", [mean, g.scalar(float(np.prod(kernel)), n.in_dtypes[0])], out, name=n.name)


@translates("UpSampling")
def _upsampling(g, n):
    sample_type = n.str("sample_type")
    if sample_type != "nearest":
        raise n.unsupported("sample_type=%r (only 'nearest' maps to ONNX Resize)" % sample_type)
    if n.int("num_args", 1) != 1:
        raise n.unsupported("num_args > 1")
    scale = float(n.int("scale"))
    rank = len(n.in_shapes[0])
    scales = g.const(np.array([1.0, 1.0] + [scale] * (rank - 2), dtype=np.float32), n.name + "_scales")
    roi = g.const(np.zeros(0, dtype=np.float32), n.name + "_roi")
    # asymmetric coordinates with floor rounding copy each source pixel exactly `scale` times
    g.op("Resize", [n.inputs[0], roi, scales], n.out(0), name=n.name, mode="nearest",
         coordinate_transformation_mode="asymmetric", nearest_mode="floor")


@translates("pad")
def _pad(g, n):
    widths = list(n.ints("pad_width"))
    pads = widths[0::2] + widths[1::2]
    mode = n.str("mode", "constant")
    if mode not in ("constant", "edge", "reflect"):
        raise n.unsupported("mode=%r" % mode)
    inputs = [n.inputs[0], g.ints(pads, n.name + "_pads")]
    if mode == "constant":
        inputs.append(g.scalar(n.float("constant_value", 0.0), n.in_dtypes[0]))
    g.op("Pad", inputs, n.out(0), name=n.name, mode=mode)


@translates("Embedding")
def _embedding(g, n):
    indices = g.op("Cast", [n.inputs[0]], to=g.tensor_type(np.int64))
    g.op("Gather", [n.inputs[1], indices], n.out(0), name=n.name, axis=0)


# ---------------------------------------------------------------------------------------------- shapes

@translates("Flatten")
def _flatten(g, n):
    g.op("Flatten", [n.inputs[0]], n.out(0), name=n.name, axis=1)


def _reshape_target(g, n, x):
    """The target shape of MXNet's Reshape as an int64 tensor computed from the input's shape at run time, so
    that its special codes (0 copy, -1 infer, -2 copy the rest, -3 merge two, -4 split one) follow the input."""
    spec = list(n.ints("shape", ()) or n.ints("target_shape", ()))
    if n.bool("reverse", False):
        raise n.unsupported("reverse=True with dynamic=True")
    in_shape = g.op("Shape", [x])

    def dims(start, stop):
        return g.op("Slice", [in_shape, g.ints([start]), g.ints([stop]), g.ints([0])])

    pieces, src, j = [], 0, 0
    while j < len(spec):
        code = spec[j]
        if code > 0 or code == -1:
            pieces.append(g.ints([code]))
            src += 1
        elif code == 0:
            pieces.append(dims(src, src + 1))
            src += 1
        elif code == -2:
            pieces.append(dims(src, _INT64_MAX))
            src = len(n.in_shapes[0])
        elif code == -3:
            pieces.append(g.reduce("ReduceProd", dims(src, src + 2), [0], keepdims=1))
            src += 2
        elif code == -4:
            first, second = spec[j + 1], spec[j + 2]
            whole = dims(src, src + 1)
            if first == -1:
                first = g.op("Div", [whole, g.ints([second])])
            else:
                first = g.ints([first])
            if second == -1:
                second = g.op("Div", [whole, first])
            else:
                second = g.ints([second])
            pieces += [first, second]
            src += 1
            j += 2
        else:
            raise n.unsupported("shape code %d" % code)
        j += 1
    return g.op("Concat", pieces, axis=0)


@translates("Reshape")
def _reshape(g, n):
    if g.dynamic:
        target = _reshape_target(g, n, n.inputs[0])
    else:  # the special codes resolved by shape inference
        target = g.ints(n.out_shapes[0], n.name + "_shape")
    g.op("Reshape", [n.inputs[0], target], n.out(0), name=n.name)


@translates("transpose")
def _transpose(g, n):
    axes = list(n.ints("axes", ()))
    attrs = {"perm": axes} if axes else {}
    g.op("Transpose", [n.inputs[0]], n.out(0), name=n.name, **attrs)


@translates("SwapAxis")
def _swap_axis(g, n):
    rank = len(n.in_shapes[0])
    perm = list(range(rank))
    a, b = n.int("dim1", 0) % rank, n.int("dim2", 0) % rank
    perm[a], perm[b] = perm[b], perm[a]
    g.op("Transpose", [n.inputs[0]], n.out(0), name=n.name, perm=perm)


@translates("expand_dims")
def _expand_dims(g, n):
    axis = n.int("axis")
    if axis < 0:
        axis += len(n.in_shapes[0]) + 1
    g.unsqueeze(n.inputs[0], [axis], out=n.out(0), name=n.name)


@translates("squeeze")
def _squeeze(g, n):
    axes = n.opt_ints("axis")
    if axes is None:
        axes = [a for a, d in enumerate(n.in_shapes[0]) if d == 1]
    g.squeeze(n.inputs[0], [a % len(n.in_shapes[0]) for a in axes], out=n.out(0), name=n.name)


@translates("Concat")
def _concat(g, n):
    g.op("Concat", n.inputs, n.out(0), name=n.name, axis=n.int("dim", 1))


@translates("stack")
def _stack(g, n):
    axis = n.int("axis", 0)
    if axis < 0:
        axis += len(n.in_shapes[0]) + 1
    expanded = [g.unsqueeze(x, [axis]) for x in n.inputs]
    g.op("Concat", expanded, n.out(0), name=n.name, axis=axis)


@translates("SliceChannel")
def _slice_channel(g, n):
    count = n.int("num_outputs")
    axis = n.int("axis", 1) % len(n.in_shapes[0])
    if not n.bool("squeeze_axis", False):
        g.op("Split", [n.inputs[0]], [n.out(k) for k in range(count)], name=n.name, axis=axis)
        return
    parts = g.op("Split", [n.inputs[0]], count, axis=axis)
    for k, part in enumerate(parts):
        g.squeeze(part, [axis], out=n.out(k), name=n.name if k == 0 else None)


def _slice_bound(value, step, is_begin):
    if value is not None:
        return value
    if is_begin:
        return 0 if step > 0 else -1
    return _INT64_MAX if step > 0 else _INT64_MIN


@translates("slice")
def _slice(g, n):
    begin, end = n.ints("begin"), n.ints("end")
    step = n.ints("step", ()) or (1,) * len(begin)
    step = [1 if s is None else s for s in step]
    starts = [_slice_bound(b, s, True) for b, s in zip(begin, step)]
    ends = [_slice_bound(e, s, False) for e, s in zip(end, step)]
    axes = list(range(len(begin)))
    g.op("Slice", [n.inputs[0], g.ints(starts), g.ints(ends), g.ints(axes), g.ints(step)], n.out(0), name=n.name)


@translates("slice_axis")
def _slice_axis(g, n):
    end = n.opt_int("end")
    bounds = [g.ints([n.int("begin")]), g.ints([_INT64_MAX if end is None else end]), g.ints([n.int("axis")])]
    g.op("Slice", [n.inputs[0]] + bounds, n.out(0), name=n.name)


@translates("SequenceLast")
def _sequence_last(g, n):
    if n.bool("use_sequence_length", False):
        raise n.unsupported("use_sequence_length=True")
    last = g.const(np.array(-1, dtype=np.int64), n.name + "_last")
    g.op("Gather", [n.inputs[0], last], n.out(0), name=n.name, axis=n.int("axis", 0))


@translates("reverse")
def _reverse(g, n):
    axes = list(n.ints("axis"))
    count = len(axes)
    g.op("Slice", [n.inputs[0], g.ints([-1] * count), g.ints([_INT64_MIN] * count), g.ints(axes), g.ints([-1] * count)],
         n.out(0), name=n.name)


@translates("broadcast_to")
def _broadcast_to(g, n):
    # Expand keeps the input's size where the target says 1, which is what MXNet's 0 means.
    shape = [1 if d == 0 else d for d in n.ints("shape")]
    g.op("Expand", [n.inputs[0], g.ints(shape, n.name + "_shape")], n.out(0), name=n.name)


@translates("broadcast_axis")
def _broadcast_axis(g, n):
    shape = [1] * len(n.in_shapes[0])
    for axis, size in zip(n.ints("axis"), n.ints("size")):
        shape[axis] = size
    g.op("Expand", [n.inputs[0], g.ints(shape, n.name + "_shape")], n.out(0), name=n.name)


@translates("tile")
def _tile(g, n):
    reps = list(n.ints("reps"))
    x = n.inputs[0]
    rank = len(n.in_shapes[0])
    if len(reps) > rank:
        x = g.unsqueeze(x, list(range(len(reps) - rank)))
    reps = [1] * (rank - len(reps)) + reps
    g.op("Tile", [x, g.ints(reps, n.name + "_reps")], n.out(0), name=n.name)


@translates("depth_to_space", "space_to_depth")
def _depth_space(g, n):
    onnx_op = "DepthToSpace" if n.op == "depth_to_space" else "SpaceToDepth"
    attrs = {"mode": "DCR"} if n.op == "depth_to_space" else {}
    g.op(onnx_op, [n.inputs[0]], n.out(0), name=n.name, blocksize=n.int("block_size"), **attrs)


# ---------------------------------------------------------------------------------------------- reductions

def _reduction(onnx_op):
    def translate(g, n):
        rank = len(n.in_shapes[0])
        axes = n.opt_ints("axis")
        axes = list(range(rank)) if not axes else [a % rank for a in axes]
        if n.bool("exclude", False):
            axes = [a for a in range(rank) if a not in axes]
        keepdims = 1 if n.bool("keepdims", False) else 0
        if len(axes) == rank and not keepdims:
            # MXNet keeps one axis of size 1 where NumPy would give a scalar
            reduced = g.reduce(onnx_op, n.inputs[0], axes, keepdims=0)
            g.op("Reshape", [reduced, g.ints([1])], n.out(0), name=n.name)
        else:
            g.reduce(onnx_op, n.inputs[0], axes, keepdims=keepdims, out=n.out(0), name=n.name)
    return translate


for _mx_op, _onnx_op in {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin",
                         "prod": "ReduceProd"}.items():
    translates(_mx_op)(_reduction(_onnx_op))


@translates("norm")
def _norm(g, n):
    ord_ = n.int("ord", 2)
    if ord_ not in (1, 2):
        raise n.unsupported("ord=%d" % ord_)
    _reduction("ReduceL2" if ord_ == 2 else "ReduceL1")(g, n)


@translates("argmax", "argmin")
def _argmax(g, n):
    axis = n.opt_int("axis")
    x = n.inputs[0]
    if axis is None:
        x, axis = g.op("Reshape", [x, g.ints([-1])]), 0
    onnx_op = "ArgMax" if n.op == "argmax" else "ArgMin"
    index = g.op(onnx_op, [x], axis=axis, keepdims=1 if n.bool("keepdims", False) else 0)
    g.op("Cast", [index], n.out(0), name=n.name, to=g.tensor_type(n.out_dtypes[0]))


# ---------------------------------------------------------------------------------------------- products

@translates("dot")
def _dot(g, n):
    a, b = n.inputs[:2]
    if len(n.in_shapes[1]) != 2:
        raise n.unsupported("a right operand of rank %d (ONNX MatMul contracts as MXNet's dot only for 2-D)"
                            % len(n.in_shapes[1]))
    if n.bool("transpose_a", False):
        if len(n.in_shapes[0]) != 2:
            raise n.unsupported("transpose_a with a left operand of rank %d" % len(n.in_shapes[0]))
        a = g.op("Transpose", [a], perm=[1, 0])
    if n.bool("transpose_b", False):
        b = g.op("Transpose", [b], perm=[1, 0])
    g.op("MatMul", [a, b], n.out(0), name=n.name)


@translates("batch_dot")
def _batch_dot(g, n):
    a, b = n.inputs[:2]
    rank = len(n.in_shapes[0])
    swap_last = list(range(rank - 2)) + [rank - 1, rank - 2]
    if n.bool("transpose_a", False):
        a = g.op("Transpose", [a], perm=swap_last)
    if n.bool("transpose_b", False):
        b = g.op("Transpose", [b], perm=swap_last)
    g.op("MatMul", [a, b], n.out(0), name=n.name)


# ---------------------------------------------------------------------------------------------- creation

def _filled(value):
    def translate(g, n):
        dtype = n.out_dtypes[0]
        fill = n.float("value") if value is None else value
        shape = list(n.ints("shape"))
        if g.dynamic and 0 in shape:
            # An axis MXNet infers from a consumer: size 1 here, broadcast by the consumer (RNN expands its
            # begin states to the batch).
            known = [d if d > 0 else 1 for d in shape]
            g.op("ConstantOfShape", [g.ints(known)], n.out(0), name=n.name,
                 value=g.tensor_proto(np.array([fill], dtype=dtype)))
        else:
            g.identity_of(g.const(np.full(n.out_shapes[0], fill, dtype=dtype), n.name), n.out(0))
    return translate


translates("_zeros")(_filled(0))
translates("_ones")(_filled(1))
translates("_full")(_filled(None))


def _filled_like(value):
    def translate(g, n):
        g.op("ConstantOfShape", [g.shape_of(n.inputs[0], n.in_shapes[0])], n.out(0), name=n.name,
             value=g.tensor_proto(np.array([value], dtype=n.out_dtypes[0])))
    return translate


translates("zeros_like")(_filled_like(0))
translates("ones_like")(_filled_like(1))


# ---------------------------------------------------------------------------------------------- RNN

# ONNX's gate order, as positions of MXNet's (cuDNN's) gate blocks: LSTM i f g o -> i o f c, GRU r z n -> z r h.
_RNN_MODES = {
    "lstm": ("LSTM", 4, [0, 3, 1, 2]),
    "gru": ("GRU", 3, [1, 0, 2]),
    "rnn_tanh": ("RNN", 1, [0]),
    "rnn_relu": ("RNN", 1, [0]),
}


def _rnn_weights(flat, mode, layers, dirs, hidden, input_size):
    """Per layer, ONNX's W (dirs, G*H, in), R (dirs, G*H, H) and B (dirs, 2*G*H) cut from MXNet's flat
    parameter vector: every layer's and direction's i2h then h2h weights, then all biases in that order."""
    _, gates, order = _RNN_MODES[mode]
    gh = gates * hidden

    def reorder(block):
        parts = np.split(block, gates, axis=0)
        return np.concatenate([parts[i] for i in order], axis=0)

    offset = 0
    weights = []
    for layer in range(layers):
        layer_in = input_size if layer == 0 else hidden * dirs
        w, r = [], []
        for _ in range(dirs):
            w.append(reorder(flat[offset:offset + gh * layer_in].reshape(gh, layer_in)))
            offset += gh * layer_in
            r.append(reorder(flat[offset:offset + gh * hidden].reshape(gh, hidden)))
            offset += gh * hidden
        weights.append([np.stack(w), np.stack(r)])
    for layer in range(layers):
        biases = []
        for _ in range(dirs):
            b_i2h = reorder(flat[offset:offset + gh])
            b_h2h = reorder(flat[offset + gh:offset + 2 * gh])
            offset += 2 * gh
            biases.append(np.concatenate([b_i2h, b_h2h]))
        weights[layer].append(np.stack(biases))
    if offset != flat.size:
        raise ValueError("RNN parameters hold %d values where mode %s needs %d" % (flat.size, mode, offset))
    return weights


@translates("RNN")
def _rnn(g, n):
    mode = n.str("mode")
    if mode not in _RNN_MODES:
        raise n.unsupported("mode=%r" % mode)
    for key, default in (("use_sequence_length", False), ("lstm_state_clip_nan", False)):
        if n.bool(key, default):
            raise n.unsupported("%s=True" % key)
    for key in ("projection_size", "lstm_state_clip_min", "lstm_state_clip_max"):
        if n.opt_str(key) not in (None, "None"):
            raise n.unsupported("%s=%s" % (key, n.str(key)))
    flat = g.value(n.inputs[1])
    if flat is None:
        raise n.unsupported("parameters computed at run time (they must be known when exporting)")
    onnx_op, _, _ = _RNN_MODES[mode]
    layers, hidden = n.int("num_layers", 1), n.int("state_size")
    dirs = 2 if n.bool("bidirectional", False) else 1
    seq_len, batch, input_size = n.in_shapes[0]
    weights = _rnn_weights(flat.reshape(-1), mode, layers, dirs, hidden, input_size)
    dtype = n.in_dtypes[0]

    states = [n.inputs[2]] + ([n.inputs[3]] if mode == "lstm" else [])
    if g.dynamic:  # begin states made with batch 0 hold one row: broadcast it to the batch
        data_shape = g.op("Shape", [n.inputs[0]])
        batch_dim = g.op("Slice", [data_shape, g.ints([1]), g.ints([2]), g.ints([0])])
        state_shape = g.op("Concat", [g.ints([layers * dirs]), batch_dim, g.ints([hidden])], axis=0)
        states = [g.op("Expand", [s, state_shape]) for s in states]

    attrs = {"hidden_size": hidden, "direction": "bidirectional" if dirs == 2 else "forward"}
    if onnx_op == "GRU":
        attrs["linear_before_reset"] = 1  # cuDNN's GRU, which MXNet follows
    if onnx_op == "RNN":
        attrs["activations"] = ["Tanh" if mode == "rnn_tanh" else "Relu"] * dirs

    x = n.inputs[0]
    final_states = [[] for _ in states]
    for layer, (w, r, b) in enumerate(weights):
        prefix = "%s_l%d" % (n.name, layer)
        layer_states = [g.op("Slice", [s, g.ints([layer * dirs]), g.ints([(layer + 1) * dirs]), g.ints([0])])
                        if layers > 1 else s for s in states]
        inputs = [x, g.const(w.astype(dtype), prefix + "_W"), g.const(r.astype(dtype), prefix + "_R"),
                  g.const(b.astype(dtype), prefix + "_B"), ""] + layer_states
        outputs = g.op(onnx_op, inputs, 1 + len(states), name=prefix, **attrs)
        # Y is (seq, dirs, batch, hidden); MXNet's layers pass (seq, batch, dirs * hidden) on.
        y = g.op("Transpose", [outputs[0]], perm=[0, 2, 1, 3])
        last = layer == layers - 1
        x = g.op("Reshape", [y, g.ints([0, 0, -1])], n.out(0) if last else None)
        for k, state in enumerate(outputs[1:]):
            final_states[k].append(state)
    if n.bool("state_outputs", False):
        for k, parts in enumerate(final_states):
            if n.used(k + 1):
                g.op("Concat", parts, n.out(k + 1), axis=0)
