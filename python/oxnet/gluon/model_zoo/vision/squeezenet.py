"""SqueezeNet 1.0 and 1.1 (Iandola et al. 2016, "SqueezeNet: AlexNet-level accuracy with 50x fewer
parameters and <0.5MB model size"), laid out and named as MXNet 1.x's model zoo."""

from ....context import cpu
from ... import nn
from ...contrib.nn import HybridConcurrent
from ._common import DEFAULT_ROOT, FeaturesThenOutput, reject_pretrained

__all__ = ["SqueezeNet", "squeezenet1_0", "squeezenet1_1"]


def _relu_conv(channels, kernel_size, padding=0):
    out = nn.HybridSequential(prefix="")
    out.add(nn.Conv2D(channels, kernel_size, padding=padding), nn.Activation("relu"))
    return out


def _fire(squeeze_channels, expand1x1_channels, expand3x3_channels):
    """Fire module: a 1x1 squeeze, then 1x1 and 3x3 expansions concatenated along channels."""
    out = nn.HybridSequential(prefix="")
    out.add(_relu_conv(squeeze_channels, 1))
    expand = HybridConcurrent(axis=1, prefix="")
    expand.add(_relu_conv(expand1x1_channels, 1), _relu_conv(expand3x3_channels, 3, 1))
    out.add(expand)
    return out


def _ceil_pool():
    return nn.MaxPool2D(pool_size=3, strides=2, ceil_mode=True)


class SqueezeNet(FeaturesThenOutput):
    """SqueezeNet ``version`` '1.0' or '1.1'. The final 13x13 average pool expects 224x224 inputs."""

    def __init__(self, version, classes=1000, **kwargs):
        super().__init__(**kwargs)
        if version not in ("1.0", "1.1"):
            raise ValueError("Unsupported SqueezeNet version {version}: 1.0 or 1.1 expected".format(version=version))
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            if version == "1.0":
                self.features.add(nn.Conv2D(96, kernel_size=7, strides=2), nn.Activation("relu"), _ceil_pool(),
                                  _fire(16, 64, 64), _fire(16, 64, 64), _fire(32, 128, 128), _ceil_pool(),
                                  _fire(32, 128, 128), _fire(48, 192, 192), _fire(48, 192, 192),
                                  _fire(64, 256, 256), _ceil_pool(), _fire(64, 256, 256))
            else:
                self.features.add(nn.Conv2D(64, kernel_size=3, strides=2), nn.Activation("relu"), _ceil_pool(),
                                  _fire(16, 64, 64), _fire(16, 64, 64), _ceil_pool(),
                                  _fire(32, 128, 128), _fire(32, 128, 128), _ceil_pool(),
                                  _fire(48, 192, 192), _fire(48, 192, 192), _fire(64, 256, 256),
                                  _fire(64, 256, 256))
            self.features.add(nn.Dropout(0.5))
            self.output = nn.HybridSequential(prefix="")
            self.output.add(nn.Conv2D(classes, kernel_size=1), nn.Activation("relu"), nn.AvgPool2D(13),
                            nn.Flatten())


def get_squeezenet(version, pretrained=False, ctx=cpu(), root=DEFAULT_ROOT, **kwargs):
    """SqueezeNet ``version`` '1.0' or '1.1'; ``kwargs`` go to SqueezeNet. ``ctx`` and ``root`` only
    concern pretrained weights."""
    reject_pretrained(pretrained, "squeezenet%s" % version, root)
    return SqueezeNet(version, **kwargs)


def squeezenet1_0(**kwargs):
    """SqueezeNet 1.0 (see get_squeezenet for the keyword arguments)."""
    return get_squeezenet("1.0", **kwargs)


def squeezenet1_1(**kwargs):
    """SqueezeNet 1.1, with 2.4x less computation than 1.0 (see get_squeezenet for the keyword arguments)."""
    return get_squeezenet("1.1", **kwargs)
