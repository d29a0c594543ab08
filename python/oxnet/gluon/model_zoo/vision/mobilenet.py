"""MobileNet (Howard et al. 2017) and MobileNetV2 (Sandler et al. 2018, "Inverted Residuals and
Linear Bottlenecks"), laid out and named as MXNet 1.x's model zoo."""

from ....context import cpu
from ... import nn
from ._common import DEFAULT_ROOT, FeaturesThenOutput, reject_pretrained

__all__ = ["MobileNet", "MobileNetV2", "mobilenet1_0", "mobilenet_v2_1_0", "mobilenet0_75", "mobilenet_v2_0_75",
           "mobilenet0_5", "mobilenet_v2_0_5", "mobilenet0_25", "mobilenet_v2_0_25", "get_mobilenet",
           "get_mobilenet_v2"]


class RELU6(nn.HybridBlock):
    """min(max(x, 0), 6)."""

    def hybrid_forward(self, F, x):
        return F.clip(x, 0, 6, name="relu6")


def _add_conv(out, channels=1, kernel=1, stride=1, pad=0, num_group=1, active=True, relu6=False):
    """Bias-free convolution, BatchNorm and (when ``active``) ReLU or ReLU6, appended to ``out``."""
    out.add(nn.Conv2D(channels, kernel, stride, pad, groups=num_group, use_bias=False))
    out.add(nn.BatchNorm(scale=True))
    if active:
        out.add(RELU6() if relu6 else nn.Activation("relu"))


def _add_conv_dw(out, dw_channels, channels, stride, relu6=False):
    """Depthwise-separable convolution: a depthwise 3x3 then a pointwise 1x1."""
    _add_conv(out, channels=dw_channels, kernel=3, stride=stride, pad=1, num_group=dw_channels, relu6=relu6)
    _add_conv(out, channels=channels, relu6=relu6)


class LinearBottleneck(nn.HybridBlock):
    """Inverted residual: expand ``t`` times (1x1), depthwise 3x3, project linearly (1x1); the input is
    added back when stride is 1 and the channel count is unchanged."""

    def __init__(self, in_channels, channels, t, stride, **kwargs):
        super().__init__(**kwargs)
        self.use_shortcut = stride == 1 and in_channels == channels
        with self.name_scope():
            self.out = nn.HybridSequential()
            expanded = in_channels * t
            _add_conv(self.out, expanded, relu6=True)
            _add_conv(self.out, expanded, kernel=3, stride=stride, pad=1, num_group=expanded, relu6=True)
            _add_conv(self.out, channels, active=False, relu6=True)

    def hybrid_forward(self, F, x):
        out = self.out(x)
        return F.elemwise_add(out, x) if self.use_shortcut else out


def _scaled(multiplier, widths):
    return [int(width * multiplier) for width in widths]


class MobileNet(FeaturesThenOutput):
    """MobileNet V1 with every layer's width scaled by ``multiplier``."""

    def __init__(self, multiplier=1.0, classes=1000, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            with self.features.name_scope():
                _add_conv(self.features, channels=int(32 * multiplier), kernel=3, pad=1, stride=2)
                dw_channels = _scaled(multiplier, [32, 64] + [128] * 2 + [256] * 2 + [512] * 6 + [1024])
                channels = _scaled(multiplier, [64] + [128] * 2 + [256] * 2 + [512] * 6 + [1024] * 2)
                strides = [1, 2] * 3 + [1] * 5 + [2, 1]
                for dw, out, stride in zip(dw_channels, channels, strides):
                    _add_conv_dw(self.features, dw_channels=dw, channels=out, stride=stride)
                self.features.add(nn.GlobalAvgPool2D(), nn.Flatten())
            self.output = nn.Dense(classes)


class MobileNetV2(FeaturesThenOutput):
    """MobileNet V2 with every layer's width scaled by ``multiplier`` (the last 1x1 keeps 1280
    channels unless ``multiplier`` exceeds 1); the classifier is a 1x1 convolution."""

    def __init__(self, multiplier=1.0, classes=1000, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="features_")
            with self.features.name_scope():
                _add_conv(self.features, int(32 * multiplier), kernel=3, stride=2, pad=1, relu6=True)
                in_channels = _scaled(multiplier, [32, 16] + [24] * 2 + [32] * 3 + [64] * 4 + [96] * 3 + [160] * 3)
                channels = _scaled(multiplier, [16] + [24] * 2 + [32] * 3 + [64] * 4 + [96] * 3 + [160] * 3 + [320])
                expansions = [1] + [6] * 16
                strides = [1, 2] * 2 + [1, 1, 2] + [1] * 6 + [2] + [1] * 3
                for block_in, block_out, t, stride in zip(in_channels, channels, expansions, strides):
                    self.features.add(LinearBottleneck(in_channels=block_in, channels=block_out, t=t, stride=stride))
                _add_conv(self.features, int(1280 * multiplier) if multiplier > 1.0 else 1280, relu6=True)
                self.features.add(nn.GlobalAvgPool2D())
            self.output = nn.HybridSequential(prefix="output_")
            with self.output.name_scope():
                self.output.add(nn.Conv2D(classes, 1, use_bias=False, prefix="pred_"), nn.Flatten())


def _weights_name(family, multiplier):
    suffix = "%.2f" % multiplier
    return family + (suffix[:-1] if suffix in ("1.00", "0.50") else suffix)


def get_mobilenet(multiplier, pretrained=False, ctx=cpu(), root=DEFAULT_ROOT, **kwargs):
    """MobileNet with width ``multiplier``; ``kwargs`` go to MobileNet. ``ctx`` and ``root`` only
    concern pretrained weights."""
    reject_pretrained(pretrained, _weights_name("mobilenet", multiplier), root)
    return MobileNet(multiplier, **kwargs)


def get_mobilenet_v2(multiplier, pretrained=False, ctx=cpu(), root=DEFAULT_ROOT, **kwargs):
    """MobileNetV2 with width ``multiplier``; ``kwargs`` go to MobileNetV2. ``ctx`` and ``root`` only
    concern pretrained weights."""
    reject_pretrained(pretrained, _weights_name("mobilenetv2_", multiplier), root)
    return MobileNetV2(multiplier, **kwargs)


def _factory(getter, multiplier, name):
    def build(**kwargs):
        return getter(multiplier, **kwargs)

    build.__name__ = name
    build.__doc__ = "%s with width multiplier %s (see %s for the keyword arguments)." % (
        "MobileNetV2" if getter is get_mobilenet_v2 else "MobileNet", multiplier, getter.__name__)
    return build


mobilenet1_0 = _factory(get_mobilenet, 1.0, "mobilenet1_0")
mobilenet0_75 = _factory(get_mobilenet, 0.75, "mobilenet0_75")
mobilenet0_5 = _factory(get_mobilenet, 0.5, "mobilenet0_5")
mobilenet0_25 = _factory(get_mobilenet, 0.25, "mobilenet0_25")
mobilenet_v2_1_0 = _factory(get_mobilenet_v2, 1.0, "mobilenet_v2_1_0")
mobilenet_v2_0_75 = _factory(get_mobilenet_v2, 0.75, "mobilenet_v2_0_75")
mobilenet_v2_0_5 = _factory(get_mobilenet_v2, 0.5, "mobilenet_v2_0_5")
mobilenet_v2_0_25 = _factory(get_mobilenet_v2, 0.25, "mobilenet_v2_0_25")
