"""Convolution, pooling and padding layers."""

from ...base import numeric_types
from .. import block
from .activations import Activation


def _tuple(value, n):
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    if len(value) != n:
        raise ValueError("expected %d values, got %s" % (n, value))
    return value


class _Conv(block.HybridBlock):
    def __init__(self, channels, kernel_size, strides, padding, dilation, groups, layout, in_channels=0,
                 activation=None, use_bias=True, weight_initializer=None, bias_initializer="zeros",
                 op_name="Convolution", adj=None, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        with self.name_scope():
            self._channels = channels
            self._in_channels = in_channels
            n = len(kernel_size)
            self._kwargs = {"kernel": kernel_size, "stride": _tuple(strides, n), "dilate": _tuple(dilation, n),
                            "pad": _tuple(padding, n), "num_filter": channels, "num_group": groups,
                            "no_bias": not use_bias, "layout": layout}
            self._op_name = op_name
            if op_name == "Deconvolution":
                # A transposed convolution's weight maps input channels to channels/groups outputs.
                self._kwargs["adj"] = _tuple(adj, n)
                wshape = (in_channels, channels // groups) + tuple(kernel_size)
            else:
                wshape = (channels, in_channels // groups if in_channels else 0) + tuple(kernel_size)
            self.weight = self.params.get("weight", shape=wshape, init=weight_initializer, allow_deferred_init=True)
            if use_bias:
                self.bias = self.params.get("bias", shape=(channels,), init=bias_initializer,
                                            allow_deferred_init=True)
            else:
                self.bias = None
            self.act = Activation(activation, prefix=activation + "_") if activation is not None else None

    def hybrid_forward(self, F, x, weight, bias=None):
        out = getattr(F, self._op_name)(x, weight, bias, name="fwd", **self._kwargs)
        if self.act is not None:
            out = self.act(out)
        return out

    def _alias(self):
        return "conv"

    def __repr__(self):
        shape = self.weight.shape
        return "{name}({mapping}, kernel_size={kernel}, stride={stride})".format(
            name=self.__class__.__name__, mapping="{0} -> {1}".format(shape[1] if shape[1] else None, shape[0]),
            **self._kwargs)


class Conv1D(_Conv):
    def __init__(self, channels, kernel_size, strides=1, padding=0, dilation=1, groups=1, layout="NCW",
                 activation=None, use_bias=True, weight_initializer=None, bias_initializer="zeros", in_channels=0,
                 **kwargs):
        super().__init__(channels, _tuple(kernel_size, 1), strides, padding, dilation, groups, layout, in_channels,
                         activation, use_bias, weight_initializer, bias_initializer, **kwargs)


class Conv2D(_Conv):
    def __init__(self, channels, kernel_size, strides=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
                 layout="NCHW", activation=None, use_bias=True, weight_initializer=None, bias_initializer="zeros",
                 in_channels=0, **kwargs):
        super().__init__(channels, _tuple(kernel_size, 2), strides, padding, dilation, groups, layout, in_channels,
                         activation, use_bias, weight_initializer, bias_initializer, **kwargs)


class Conv3D(_Conv):
    def __init__(self, channels, kernel_size, strides=(1, 1, 1), padding=(0, 0, 0), dilation=(1, 1, 1), groups=1,
                 layout="NCDHW", activation=None, use_bias=True, weight_initializer=None, bias_initializer="zeros",
                 in_channels=0, **kwargs):
        super().__init__(channels, _tuple(kernel_size, 3), strides, padding, dilation, groups, layout, in_channels,
                         activation, use_bias, weight_initializer, bias_initializer, **kwargs)



class _ConvTranspose(_Conv):
    def __init__(self, channels, kernel_size, strides, padding, output_padding, dilation, groups, layout,
                 activation, use_bias, weight_initializer, bias_initializer, in_channels, **kwargs):
        super().__init__(channels, kernel_size, strides, padding, dilation, groups, layout, in_channels,
                         activation, use_bias, weight_initializer, bias_initializer, op_name="Deconvolution",
                         adj=output_padding, **kwargs)


class Conv1DTranspose(_ConvTranspose):
    def __init__(self, channels, kernel_size, strides=1, padding=0, output_padding=0, dilation=1, groups=1,
                 layout="NCW", activation=None, use_bias=True, weight_initializer=None, bias_initializer="zeros",
                 in_channels=0, **kwargs):
        super().__init__(channels, _tuple(kernel_size, 1), strides, padding, output_padding, dilation, groups,
                         layout, activation, use_bias, weight_initializer, bias_initializer, in_channels, **kwargs)


class Conv2DTranspose(_ConvTranspose):
    def __init__(self, channels, kernel_size, strides=(1, 1), padding=(0, 0), output_padding=(0, 0),
                 dilation=(1, 1), groups=1, layout="NCHW", activation=None, use_bias=True, weight_initializer=None,
                 bias_initializer="zeros", in_channels=0, **kwargs):
        super().__init__(channels, _tuple(kernel_size, 2), strides, padding, output_padding, dilation, groups,
                         layout, activation, use_bias, weight_initializer, bias_initializer, in_channels, **kwargs)


class Conv3DTranspose(_ConvTranspose):
    def __init__(self, channels, kernel_size, strides=(1, 1, 1), padding=(0, 0, 0), output_padding=(0, 0, 0),
                 dilation=(1, 1, 1), groups=1, layout="NCDHW", activation=None, use_bias=True,
                 weight_initializer=None, bias_initializer="zeros", in_channels=0, **kwargs):
        super().__init__(channels, _tuple(kernel_size, 3), strides, padding, output_padding, dilation, groups,
                         layout, activation, use_bias, weight_initializer, bias_initializer, in_channels, **kwargs)

class _Pooling(block.HybridBlock):
    def __init__(self, pool_size, strides, padding, ceil_mode, global_pool, pool_type, layout,
                 count_include_pad=None, **kwargs):
        super().__init__(**kwargs)
        if strides is None:
            strides = pool_size
        n = len(pool_size)
        self._kwargs = {"kernel": pool_size, "stride": _tuple(strides, n), "pad": _tuple(padding, n),
                        "global_pool": global_pool, "pool_type": pool_type, "layout": layout,
                        "pooling_convention": "full" if ceil_mode else "valid"}
        if count_include_pad is not None:
            self._kwargs["count_include_pad"] = count_include_pad

    def _alias(self):
        return "pool"

    def hybrid_forward(self, F, x):
        return F.Pooling(x, name="fwd", **self._kwargs)

    def __repr__(self):
        return "{name}(size={kernel}, stride={stride}, padding={pad}, ceil_mode={ceil_mode}, global_pool={global_pool}, " \
               "pool_type={pool_type}, layout={layout})".format(
                   name=self.__class__.__name__, ceil_mode=self._kwargs["pooling_convention"] == "full",
                   **self._kwargs)


def _pool_class(name, rank, pool_type, layout, global_pool):
    def __init__(self, pool_size=2, strides=None, padding=0, layout=layout, ceil_mode=False, count_include_pad=True,
                 **kwargs):
        if global_pool:
            pool_size, strides, padding = (1,) * rank, (1,) * rank, (0,) * rank
        pool_size = _tuple(pool_size, rank)
        if strides is not None:
            strides = _tuple(strides, rank)
        extra = {"count_include_pad": count_include_pad} if pool_type == "avg" and not global_pool else {}
        _Pooling.__init__(self, pool_size, strides, _tuple(padding, rank), ceil_mode, global_pool, pool_type, layout,
                          **extra, **kwargs)

    __init__.__doc__ = "%s %d-D pooling%s." % (pool_type.capitalize(), rank, " over the whole input" if global_pool else "")
    return type(name, (_Pooling,), {"__init__": __init__, "__doc__": __init__.__doc__})


MaxPool1D = _pool_class("MaxPool1D", 1, "max", "NCW", False)
MaxPool2D = _pool_class("MaxPool2D", 2, "max", "NCHW", False)
MaxPool3D = _pool_class("MaxPool3D", 3, "max", "NCDHW", False)
AvgPool1D = _pool_class("AvgPool1D", 1, "avg", "NCW", False)
AvgPool2D = _pool_class("AvgPool2D", 2, "avg", "NCHW", False)
AvgPool3D = _pool_class("AvgPool3D", 3, "avg", "NCDHW", False)
GlobalMaxPool1D = _pool_class("GlobalMaxPool1D", 1, "max", "NCW", True)
GlobalMaxPool2D = _pool_class("GlobalMaxPool2D", 2, "max", "NCHW", True)
GlobalMaxPool3D = _pool_class("GlobalMaxPool3D", 3, "max", "NCDHW", True)
GlobalAvgPool1D = _pool_class("GlobalAvgPool1D", 1, "avg", "NCW", True)
GlobalAvgPool2D = _pool_class("GlobalAvgPool2D", 2, "avg", "NCHW", True)
GlobalAvgPool3D = _pool_class("GlobalAvgPool3D", 3, "avg", "NCDHW", True)


class ReflectionPad2D(block.HybridBlock):
    """Pads the two spatial axes of NCHW input by reflecting it at its borders. ``padding`` is one
    width for all four sides or the 8-tuple ``pad_width`` of ``mx.nd.pad`` (batch and channel
    widths must be 0)."""

    def __init__(self, padding=0, **kwargs):
        super().__init__(**kwargs)
        if isinstance(padding, numeric_types):
            padding = (0, 0, 0, 0, padding, padding, padding, padding)
        if len(padding) != 8:
            raise AssertionError("ReflectionPad2D: padding must be one number or 8 widths, got %s" % (padding,))
        self._padding = tuple(padding)

    def hybrid_forward(self, F, x):
        return F.pad(x, mode="reflect", pad_width=self._padding)
