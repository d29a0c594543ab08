"""How each ONNX operator becomes MXNet symbols.

A translation is ``fn(imp, n)``: ``imp`` is the importer (``_import._GraphImporter``: ``param`` makes a parameter
variable) and ``n`` the ONNX node (``_import.ONNXNode``). It returns the Symbol of each ONNX output, in order.
Weights must be constants (initializers or values folded at import), as MXNet's layers hold them as parameters.
"""

import numpy as np

from .. import symbol as sym

IMPORTS = {}

# ONNX slices use the int64 extremes for "to the end"; anything this far out is open-ended.
_OPEN_END = 2 ** 62


def imports(*op_types):
    def register(fn):
        for op_type in op_types:
            IMPORTS[op_type] = fn
        return fn
    return register


def _tensor_dtype_name(onnx_type):
    from onnx import helper
    return np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type)).name


def _required_const(n, k, what):
    value = n.const(k)
    if value is None:
        raise n.unsupported("a %s computed at run time (it must be a constant)" % what)
    return value


# ---------------------------------------------------------------------------------------------- element-wise

_UNARY = {
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Abs": "abs",
    "Neg": "negative", "Reciprocal": "reciprocal", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "arcsin",
    "Acos": "arccos", "Atan": "arctan", "Sinh": "sinh", "Cosh": "cosh", "Asinh": "arcsinh", "Acosh": "arccosh",
    "Atanh": "arctanh", "Floor": "floor", "Ceil": "ceil", "Sign": "sign", "Erf": "erf", "Softsign": "softsign",
    "Not": "logical_not",
}


def _unary(mx_op):
    def translate(imp, n):
        return getattr(sym, mx_op)(n.x(0), name=n.name)
    return translate


for _onnx_op, _mx_op in _UNARY.items():
    imports(_onnx_op)(_unary(_mx_op))


@imports("Identity", "Dropout")
def _identity(imp, n):
    return [n.x(0)] + [sym.ones_like(n.x(0))] * (len(n.outputs) - 1)


@imports("Softplus")
def _softplus(imp, n):
    return sym.Activation(n.x(0), act_type="softrelu", name=n.name)


# ONNX op: (array op, scalar op with the scalar on the right, with the scalar on the left)
_BINARY = {
    "Add": ("broadcast_add", "_plus_scalar", "_plus_scalar"),
    "Sub": ("broadcast_sub", "_minus_scalar", "_rminus_scalar"),
    "Mul": ("broadcast_mul", "_mul_scalar", "_mul_scalar"),
    "Div": ("broadcast_div", "_div_scalar", "_rdiv_scalar"),
    "Pow": ("broadcast_power", "_power_scalar", "_rpower_scalar"),
    "Max": ("broadcast_maximum", "_maximum_scalar", "_maximum_scalar"),
    "Min": ("broadcast_minimum", "_minimum_scalar", "_minimum_scalar"),
    "Equal": ("broadcast_equal", "_equal_scalar", "_equal_scalar"),
    "Greater": ("broadcast_greater", "_greater_scalar", "_lesser_scalar"),
    "GreaterOrEqual": ("broadcast_greater_equal", "_greater_equal_scalar", "_lesser_equal_scalar"),
    "Less": ("broadcast_lesser", "_lesser_scalar", "_greater_scalar"),
    "LessOrEqual": ("broadcast_lesser_equal", "_lesser_equal_scalar", "_greater_equal_scalar"),
}


def _apply_binary(imp, n, ops, a, b, name):
    """a op b where a and b are input indices; a one-element constant becomes a scalar attribute."""
    array_op, scalar_right, scalar_left = ops
    rhs, lhs = n.const(b), n.const(a)
    if rhs is not None and rhs.size == 1 and lhs is None:
        return getattr(sym, scalar_right)(n.x(a), scalar=float(rhs.reshape(())), name=name)
    if lhs is not None and lhs.size == 1 and rhs is None:
        return getattr(sym, scalar_left)(n.x(b), scalar=float(lhs.reshape(())), name=name)
    return getattr(sym, array_op)(n.x(a), n.x(b), name=name)


def _binary(ops):
    def translate(imp, n):
        if len(n.inputs) == 2:
            return _apply_binary(imp, n, ops, 0, 1, n.name)
        result = n.x(0)
        for k in range(1, len(n.inputs)):  # variadic Max/Min
            result = getattr(sym, ops[0])(result, n.x(k))
        return result
    return translate


for _onnx_op, _ops in _BINARY.items():
    imports(_onnx_op)(_binary(_ops))


@imports("Sum")
def _sum(imp, n):
    result = n.x(0)
    for k in range(1, len(n.inputs)):
        result = sym.broadcast_add(result, n.x(k))
    return result


@imports("Where")
def _where(imp, n):
    return sym.where(n.x(0), n.x(1), n.x(2), name=n.name)


@imports("Cast")
def _cast(imp, n):
    dtype = _tensor_dtype_name(n.attr("to"))
    if dtype == "bool":  # MXNet keeps truth values as 0/1 numbers
        return sym._not_equal_scalar(n.x(0), scalar=0.0, name=n.name)
    return sym.Cast(n.x(0), dtype=dtype, name=n.name)


@imports("Clip")
def _clip(imp, n):
    if imp.opset < 11:
        low, high = n.attr("min", -np.inf), n.attr("max", np.inf)
    else:
        low = float(n.const(1).reshape(())) if n.has(1) else -np.inf
        high = float(n.const(2).reshape(())) if n.has(2) else np.inf
    finite = float(np.finfo(np.float32).max)
    return sym.clip(n.x(0), a_min=max(low, -finite), a_max=min(high, finite), name=n.name)


# ---------------------------------------------------------------------------------------------- activations

@imports("LeakyRelu")
def _leaky_relu(imp, n):
    return sym.LeakyReLU(n.x(0), act_type="leaky", slope=n.attr("alpha", 0.01), name=n.name)


@imports("Elu")
def _elu(imp, n):
    return sym.LeakyReLU(n.x(0), act_type="elu", slope=n.attr("alpha", 1.0), name=n.name)


@imports("Selu")
def _selu(imp, n):
    alpha, gamma = n.attr("alpha", 1.67326319217681884765625), n.attr("gamma", 1.05070102214813232421875)
    if abs(alpha - 1.6732632) > 1e-5 or abs(gamma - 1.0507010) > 1e-5:
        raise n.unsupported("alpha=%g gamma=%g (MXNet's SELU has the standard constants)" % (alpha, gamma))
    return sym.LeakyReLU(n.x(0), act_type="selu", name=n.name)


@imports("Gelu")
def _gelu(imp, n):
    if n.attr("approximate", "none") != "none":
        raise n.unsupported("approximate=%r" % n.attr("approximate"))
    return sym.LeakyReLU(n.x(0), act_type="gelu", name=n.name)


@imports("PRelu")
def _prelu(imp, n):
    slope = _required_const(n, 1, "slope")
    gamma = imp.param(n.inputs[1], slope.reshape(-1))
    return sym.LeakyReLU(n.x(0), gamma=gamma, act_type="prelu", name=n.name)


def _softmax_family(mx_op):
    def translate(imp, n):
        x = n.x(0)
        fn = getattr(sym, mx_op)
        if imp.opset >= 13:
            return fn(x, axis=n.attr("axis", -1), name=n.name)
        # Before opset 13 the input is flattened to 2-D at `axis` and normalized along the second axis.
        axis, rank = n.attr("axis", 1), n.rank(0)
        if rank is not None and axis % rank == rank - 1 or axis == -1:
            return fn(x, axis=-1, name=n.name)
        if axis == 1:
            flat = sym.Reshape(x, shape=(0, -1))
        elif n.shape(0) is not None:
            flat = sym.Reshape(x, shape=(-1, int(np.prod(n.shape(0)[axis:]))))
        else:
            raise n.unsupported("axis=%d on an input of unknown shape" % axis)
        return sym.reshape_like(fn(flat, axis=-1), x, name=n.name)
    return translate


imports("Softmax")(_softmax_family("softmax"))
imports("LogSoftmax")(_softmax_family("log_softmax"))


# ---------------------------------------------------------------------------------------------- layers

def _symmetric_pads(n, rank):
    pads = list(n.attr("pads", [0] * (2 * rank)))
    auto_pad = n.attr("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID"):
        raise n.unsupported("auto_pad=%s" % auto_pad)
    if pads[:rank] != pads[rank:]:
        raise n.unsupported("asymmetric pads %s" % pads)
    return tuple(pads[:rank])


@imports("Conv")
def _conv(imp, n):
    weight = _required_const(n, 1, "weight")
    rank = weight.ndim - 2
    kwargs = dict(kernel=tuple(n.attr("kernel_shape", weight.shape[2:])), stride=tuple(n.attr("strides", [1] * rank)),
                  dilate=tuple(n.attr("dilations", [1] * rank)), pad=_symmetric_pads(n, rank),
                  num_filter=weight.shape[0], num_group=n.attr("group", 1))
    if n.has(2):
        return sym.Convolution(n.x(0), n.x(1), n.x(2), name=n.name, **kwargs)
    return sym.Convolution(n.x(0), n.x(1), no_bias=True, name=n.name, **kwargs)


@imports("ConvTranspose")
def _conv_transpose(imp, n):
    weight = _required_const(n, 1, "weight")
    rank = weight.ndim - 2
    if n.attr("output_shape") is not None or n.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise n.unsupported("output_shape or auto_pad")
    pads = list(n.attr("pads", [0] * (2 * rank)))
    output_padding = list(n.attr("output_padding", [0] * rank))
    stride = list(n.attr("strides", [1] * rank))
    # MXNet crops `pad` from both ends and then extends the end by `adj`.
    adj = [op + begin - end for op, begin, end in zip(output_padding, pads[:rank], pads[rank:])]
    if any(a < 0 or a >= s for a, s in zip(adj, stride)):
        raise n.unsupported("pads %s with output_padding %s (MXNet needs 0 <= adj < stride)" % (pads, output_padding))
    group = n.attr("group", 1)
    kwargs = dict(kernel=tuple(n.attr("kernel_shape", weight.shape[2:])), stride=tuple(stride),
                  dilate=tuple(n.attr("dilations", [1] * rank)), pad=tuple(pads[:rank]), adj=tuple(adj),
                  num_filter=weight.shape[1] * group, num_group=group)
    if n.has(2):
        return sym.Deconvolution(n.x(0), n.x(1), n.x(2), no_bias=False, name=n.name, **kwargs)
    return sym.Deconvolution(n.x(0), n.x(1), no_bias=True, name=n.name, **kwargs)


def _weight_of_matmul(imp, n, k, transposed):
    """FullyConnected's (out, in) weight for the constant right operand `k` of a product: the original
    initializer where the graph transposed one."""
    value = _required_const(n, k, "weight")
    if transposed:
        return imp.param(n.inputs[k], value), value.shape[0]
    origin = imp.transposed_from.get(n.inputs[k])
    if origin is not None:
        return imp.param(origin, imp.constants[origin]), value.shape[1]
    return imp.param(n.inputs[k] + "_transposed", value.T), value.shape[1]


@imports("Gemm")
def _gemm(imp, n):
    a = n.x(0)
    if n.attr("transA", 0):
        a = sym.transpose(a)
    alpha, beta = n.attr("alpha", 1.0), n.attr("beta", 1.0)
    weight, hidden = _weight_of_matmul(imp, n, 1, bool(n.attr("transB", 0)))
    if alpha != 1.0:
        weight = sym._mul_scalar(weight, scalar=alpha)
    bias = n.const(2)
    if bias is not None and bias.size == hidden:
        bias_var = imp.param(n.inputs[2], bias.reshape(-1) * beta if beta != 1.0 else bias.reshape(-1))
        return sym.FullyConnected(a, weight, bias_var, num_hidden=hidden, name=n.name)
    product = sym.FullyConnected(a, weight, no_bias=True, num_hidden=hidden, name=n.name if not n.has(2) else None)
    if not n.has(2):
        return product
    c = n.x(2) if beta == 1.0 else sym._mul_scalar(n.x(2), scalar=beta)
    return sym.broadcast_add(product, c, name=n.name)


@imports("MatMul")
def _matmul(imp, n):
    right = n.const(1)
    if right is not None and right.ndim == 2:
        weight, hidden = _weight_of_matmul(imp, n, 1, False)
        return sym.FullyConnected(n.x(0), weight, no_bias=True, flatten=False, num_hidden=hidden, name=n.name)
    ranks = (n.rank(0), n.rank(1))
    if ranks == (2, 2):
        return sym.dot(n.x(0), n.x(1), name=n.name)
    if ranks[0] is not None and ranks[0] == ranks[1] and ranks[0] >= 3:
        return sym.batch_dot(n.x(0), n.x(1), name=n.name)
    raise n.unsupported("operands of ranks %s" % (ranks,))


@imports("BatchNormalization")
def _batch_norm(imp, n):
    if len(n.outputs) > 1 and any(n.outputs[1:]):
        raise n.unsupported("training outputs")
    return sym.BatchNorm(n.x(0), gamma=n.x(1), beta=n.x(2), moving_mean=n.x(3), moving_var=n.x(4),
                         eps=n.attr("epsilon", 1e-5), momentum=n.attr("momentum", 0.9), fix_gamma=False, name=n.name)


@imports("InstanceNormalization")
def _instance_norm(imp, n):
    return sym.InstanceNorm(n.x(0), gamma=n.x(1), beta=n.x(2), eps=n.attr("epsilon", 1e-5), name=n.name)


@imports("LRN")
def _lrn(imp, n):
    return sym.LRN(n.x(0), alpha=n.attr("alpha", 1e-4), beta=n.attr("beta", 0.75), knorm=n.attr("bias", 1.0),
                   nsize=n.attr("size"), name=n.name)


@imports("MaxPool", "AveragePool", "LpPool")
def _pool(imp, n):
    kernel = tuple(n.attr("kernel_shape"))
    rank = len(kernel)
    if any(d != 1 for d in n.attr("dilations", [1] * rank)):
        raise n.unsupported("dilations")
    if len(n.outputs) > 1 and n.outputs[1]:
        raise n.unsupported("the indices output")
    pool_type = {"MaxPool": "max", "AveragePool": "avg", "LpPool": "lp"}[n.op_type]
    kwargs = dict(kernel=kernel, stride=tuple(n.attr("strides", [1] * rank)), pad=_symmetric_pads(n, rank),
                  pool_type=pool_type, pooling_convention="full" if n.attr("ceil_mode", 0) else "valid")
    if pool_type == "avg":
        kwargs["count_include_pad"] = bool(n.attr("count_include_pad", 0))
    if pool_type == "lp":
        kwargs["p_value"] = n.attr("p", 2)
    return sym.Pooling(n.x(0), name=n.name, **kwargs)


@imports("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _global_pool(imp, n):
    pool_type = {"GlobalAveragePool": "avg", "GlobalMaxPool": "max", "GlobalLpPool": "lp"}[n.op_type]
    rank = n.rank(0) or 4
    kwargs = {"p_value": n.attr("p", 2)} if pool_type == "lp" else {}
    return sym.Pooling(n.x(0), global_pool=True, kernel=(1,) * (rank - 2), pool_type=pool_type, name=n.name, **kwargs)


@imports("Resize", "Upsample")
def _resize(imp, n):
    if n.attr("mode", "nearest") != "nearest":
        raise n.unsupported("mode=%r" % n.attr("mode"))
    if n.op_type == "Upsample" and imp.opset < 9:
        scales = n.attr("scales")
    else:
        scales = n.const(2 if n.op_type == "Resize" else 1)
    if scales is None or len(scales) == 0:
        raise n.unsupported("sizes instead of constant scales")
    scales = [float(s) for s in scales]
    scale = scales[-1]
    if scales[:2] != [1.0, 1.0] or any(s != scale for s in scales[2:]) or scale != int(scale):
        raise n.unsupported("scales %s (MXNet's UpSampling takes one integer scale for all spatial axes)" % scales)
    if n.op_type == "Resize" and (n.attr("coordinate_transformation_mode", "half_pixel") != "asymmetric"
                                  or n.attr("nearest_mode", "round_prefer_floor") != "floor"):
        # With an integer scale every other mapping still picks each source pixel `scale` times, but shifted.
        raise n.unsupported("coordinate_transformation_mode/nearest_mode other than asymmetric/floor")
    return sym.UpSampling(n.x(0), scale=int(scale), sample_type="nearest", num_args=1, name=n.name)


@imports("Pad")
def _pad(imp, n):
    if imp.opset < 11:
        pads, value = list(n.attr("pads")), n.attr("value", 0.0)
    else:
        pads = [int(p) for p in _required_const(n, 1, "pads")]
        value = float(n.const(2).reshape(())) if n.has(2) else 0.0
    rank = len(pads) // 2
    widths = tuple(w for pair in zip(pads[:rank], pads[rank:]) for w in pair)
    return sym.pad(n.x(0), mode=n.attr("mode", "constant"), pad_width=widths, constant_value=value, name=n.name)


# ---------------------------------------------------------------------------------------------- shapes

@imports("Flatten")
def _flatten(imp, n):
    axis = n.attr("axis", 1)
    if axis == 1:
        return sym.Flatten(n.x(0), name=n.name)
    if axis == 0:
        return sym.Reshape(n.x(0), shape=(1, -1), name=n.name)
    raise n.unsupported("axis=%d" % axis)


@imports("Reshape")
def _reshape(imp, n):
    shape = tuple(int(d) for d in _required_const(n, 1, "target shape"))
    if n.attr("allowzero", 0) and 0 in shape:
        raise n.unsupported("allowzero=1 with zero dimensions")
    return sym.Reshape(n.x(0), shape=shape, name=n.name)


@imports("Transpose")
def _transpose(imp, n):
    perm = n.attr("perm")
    return sym.transpose(n.x(0), axes=tuple(perm), name=n.name) if perm else sym.transpose(n.x(0), name=n.name)


@imports("Concat")
def _concat(imp, n):
    inputs = [n.x(k) for k in range(len(n.inputs))]
    return sym.Concat(*inputs, dim=n.attr("axis"), num_args=len(inputs), name=n.name)


def _axes(imp, n, input_index):
    """The axes of Squeeze, Unsqueeze and the reductions: an input since opset 13 (reductions but ReduceSum: 18)."""
    as_input = n.op_type in ("Squeeze", "Unsqueeze", "ReduceSum") and imp.opset >= 13
    if as_input or n.op_type.startswith("Reduce") and imp.opset >= 18:
        value = n.const(input_index) if n.has(input_index) else None
        if n.has(input_index) and value is None:
            raise n.unsupported("axes computed at run time")
        return None if value is None else [int(a) for a in value]
    axes = n.attr("axes")
    return None if axes is None else list(axes)


@imports("Unsqueeze")
def _unsqueeze(imp, n):
    axes = _axes(imp, n, 1)
    if any(a < 0 for a in axes):
        rank = n.rank(0)
        if rank is None:
            raise n.unsupported("negative axes on an input of unknown rank")
        axes = [a + rank + len(axes) if a < 0 else a for a in axes]
    result = n.x(0)
    for axis in sorted(axes):
        result = sym.expand_dims(result, axis=axis)
    return result


@imports("Squeeze")
def _squeeze(imp, n):
    axes = _axes(imp, n, 1)
    if axes is None:
        return sym.squeeze(n.x(0), name=n.name)
    return sym.squeeze(n.x(0), axis=tuple(axes), name=n.name)


@imports("Slice")
def _slice(imp, n):
    if imp.opset < 10:
        starts, ends = n.attr("starts"), n.attr("ends")
        axes = n.attr("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = [int(v) for v in _required_const(n, 1, "starts")]
        ends = [int(v) for v in _required_const(n, 2, "ends")]
        axes = [int(v) for v in n.const(3)] if n.has(3) else list(range(len(starts)))
        steps = [int(v) for v in n.const(4)] if n.has(4) else [1] * len(starts)
    result = n.x(0)
    if all(s == 1 for s in steps):
        for axis, start, end in zip(axes, starts, ends):
            result = sym.slice_axis(result, axis=axis, begin=start, end="None" if abs(end) >= _OPEN_END else end)
        return result
    if any(a < 0 for a in axes):
        rank = n.rank(0)
        if rank is None:
            raise n.unsupported("negative axes with steps on an input of unknown rank")
        axes = [a % rank for a in axes]
    count = max(axes) + 1
    begin, end, step = [None] * count, [None] * count, [None] * count
    for axis, b, e, s in zip(axes, starts, ends, steps):
        begin[axis] = None if abs(b) >= _OPEN_END else b
        end[axis] = None if abs(e) >= _OPEN_END else e
        step[axis] = s
    return sym.slice(result, begin=tuple(begin), end=tuple(end), step=tuple(step), name=n.name)


@imports("Split")
def _split(imp, n):
    axis = n.attr("axis", 0)
    sizes = n.attr("split") if imp.opset < 13 else (n.const(1) if n.has(1) else None)
    count = len(n.outputs)
    if sizes is None or len(set(int(s) for s in sizes)) == 1:
        parts = sym.SliceChannel(n.x(0), num_outputs=count, axis=axis, name=n.name)
        return [parts[k] for k in range(count)]
    bounds = np.cumsum([0] + [int(s) for s in sizes])
    return [sym.slice_axis(n.x(0), axis=axis, begin=int(b), end=int(e)) for b, e in zip(bounds[:-1], bounds[1:])]


@imports("Expand")
def _expand(imp, n):
    shape = [int(d) for d in _required_const(n, 1, "shape")]
    if n.rank(0) != len(shape):
        raise n.unsupported("an input whose rank is not the target's")
    return sym.broadcast_to(n.x(0), shape=tuple(0 if d == 1 else d for d in shape), name=n.name)


@imports("Tile")
def _tile(imp, n):
    return sym.tile(n.x(0), reps=tuple(int(r) for r in _required_const(n, 1, "repeats")), name=n.name)


@imports("DepthToSpace")
def _depth_to_space(imp, n):
    if n.attr("mode", "DCR") != "DCR":
        raise n.unsupported("mode=%s" % n.attr("mode"))
    return sym.depth_to_space(n.x(0), block_size=n.attr("blocksize"), name=n.name)


@imports("SpaceToDepth")
def _space_to_depth(imp, n):
    return sym.space_to_depth(n.x(0), block_size=n.attr("blocksize"), name=n.name)


@imports("Gather")
def _gather(imp, n):
    axis = n.attr("axis", 0)
    data, indices = n.const(0), n.const(1)
    if indices is not None and indices.ndim == 0:  # one position: a slice without its axis
        k = int(indices)
        part = sym.slice_axis(n.x(0), axis=axis, begin=k, end="None" if k == -1 else k + 1)
        return sym.squeeze(part, axis=axis, name=n.name)
    if data is not None and data.ndim == 2 and axis == 0:
        return sym.Embedding(n.x(1), weight=n.x(0), input_dim=data.shape[0], output_dim=data.shape[1], name=n.name)
    return sym.take(n.x(0), n.x(1), axis=axis, name=n.name)


# ---------------------------------------------------------------------------------------------- reductions

def _reduction(mx_op):
    def translate(imp, n):
        axes = _axes(imp, n, 1)
        keepdims = bool(n.attr("keepdims", 1))
        x = n.x(0)
        if n.op_type == "ReduceSumSquare":
            x = sym.square(x)
        if not axes:
            if n.op_type == "ReduceSum" and n.attr("noop_with_empty_axes", 0):
                return x
            return getattr(sym, mx_op)(x, keepdims=keepdims, name=n.name)
        return getattr(sym, mx_op)(x, axis=tuple(axes), keepdims=keepdims, name=n.name)
    return translate


for _onnx_op, _mx_op in {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
                         "ReduceProd": "prod", "ReduceSumSquare": "sum"}.items():
    imports(_onnx_op)(_reduction(_mx_op))


@imports("ReduceL1", "ReduceL2")
def _reduce_norm(imp, n):
    axes = _axes(imp, n, 1)
    kwargs = {"axis": tuple(axes)} if axes else {}
    return sym.norm(n.x(0), ord=1 if n.op_type == "ReduceL1" else 2, keepdims=bool(n.attr("keepdims", 1)),
                    name=n.name, **kwargs)


@imports("ArgMax", "ArgMin")
def _argmax(imp, n):
    if n.attr("select_last_index", 0):
        raise n.unsupported("select_last_index=1")
    fn = sym.argmax if n.op_type == "ArgMax" else sym.argmin
    return fn(n.x(0), axis=n.attr("axis", 0), keepdims=bool(n.attr("keepdims", 1)), name=n.name)


# ---------------------------------------------------------------------------------------------- RNN

# MXNet's (cuDNN's) gate blocks as positions of ONNX's: LSTM i o f c -> i f g o, GRU z r h -> r z n.
_RECURRENT = {"LSTM": (4, [0, 2, 3, 1]), "GRU": (3, [1, 0, 2]), "RNN": (1, [0])}


def _rnn_mode(n):
    if n.op_type == "LSTM":
        return "lstm"
    if n.op_type == "GRU":
        if not n.attr("linear_before_reset", 0):
            raise n.unsupported("linear_before_reset=0 (MXNet's GRU applies the reset gate after the product)")
        return "gru"
    activations = n.attr("activations", ["Tanh"])
    if len(set(activations)) != 1 or activations[0] not in ("Tanh", "Relu"):
        raise n.unsupported("activations %s" % activations)
    return "rnn_tanh" if activations[0] == "Tanh" else "rnn_relu"


@imports("LSTM", "GRU", "RNN")
def _recurrent(imp, n):
    mode = _rnn_mode(n)
    direction = n.attr("direction", "forward")
    if direction == "reverse":
        raise n.unsupported("direction='reverse'")
    for key in ("clip", "layout", "input_forget"):
        if n.attr(key):
            raise n.unsupported("%s=%s" % (key, n.attr(key)))
    if n.has(4):
        raise n.unsupported("sequence_lens")
    if n.op_type == "LSTM" and n.has(7):
        raise n.unsupported("peepholes")
    gates, order = _RECURRENT[n.op_type]
    hidden = n.attr("hidden_size")
    dirs = 2 if direction == "bidirectional" else 1
    w, r = _required_const(n, 1, "W"), _required_const(n, 2, "R")
    b = n.const(3) if n.has(3) else np.zeros((dirs, 2 * gates * hidden), dtype=w.dtype)
    if b is None:
        raise n.unsupported("a bias computed at run time")

    def reorder(block):
        parts = np.split(block, gates, axis=0)
        return np.concatenate([parts[i] for i in order], axis=0).reshape(-1)

    pieces = [reorder(m[d]) for d in range(dirs) for m in (w, r)]
    pieces += [reorder(half) for d in range(dirs) for half in np.split(b[d], 2)]
    flat = imp.param(n.name + "_parameters", np.concatenate(pieces).astype(w.dtype))
    states = []
    for k in (5, 6) if mode == "lstm" else (5,):
        states.append(n.x(k) if n.has(k) else sym.zeros(shape=(dirs, 0, hidden), dtype=w.dtype.name))
    out = sym.RNN(n.x(0), flat, *states, state_size=hidden, num_layers=1, bidirectional=dirs == 2, mode=mode,
                  state_outputs=True, name=n.name)
    # ONNX's Y is (seq, dirs, batch, hidden); MXNet's output is (seq, batch, dirs * hidden).
    y = sym.transpose(sym.Reshape(out[0], shape=(0, 0, dirs, -1)), axes=(0, 2, 1, 3))
    return [y] + [out[k] for k in range(1, len(states) + 1)]
