"""VGG (Simonyan and Zisserman 2014, "Very Deep Convolutional Networks for Large-Scale Image
Recognition"), with optional BatchNorm, laid out and named as MXNet 1.x's model zoo."""

from ....context import cpu
from ....initializer import Xavier
from ... import nn
from ._common import DEFAULT_ROOT, FeaturesThenOutput, reject_pretrained

__all__ = ["VGG", "vgg11", "vgg13", "vgg16", "vgg19", "vgg11_bn", "vgg13_bn", "vgg16_bn", "vgg19_bn", "get_vgg"]


class VGG(FeaturesThenOutput):
    """Group i has ``layers[i]`` 3x3 convolutions of ``filters[i]`` channels (each optionally
    batch-normalized) and a 2x2 max pool; two 4096-unit dropout layers and the classifier follow."""

    def __init__(self, layers, filters, classes=1000, batch_norm=False, **kwargs):
        super().__init__(**kwargs)
        if len(layers) != len(filters):
            raise ValueError("layers and filters need one entry per group, got %d and %d"
                             % (len(layers), len(filters)))
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            conv_init = Xavier(rnd_type="gaussian", factor_type="out", magnitude=2)
            for num_convs, channels in zip(layers, filters):
                for _ in range(num_convs):
                    self.features.add(nn.Conv2D(channels, kernel_size=3, padding=1, weight_initializer=conv_init,
                                                bias_initializer="zeros"))
                    if batch_norm:
                        self.features.add(nn.BatchNorm())
                    self.features.add(nn.Activation("relu"))
                self.features.add(nn.MaxPool2D(strides=2))
            for _ in range(2):
                self.features.add(nn.Dense(4096, activation="relu", weight_initializer="normal",
                                           bias_initializer="zeros"),
                                  nn.Dropout(rate=0.5))
            self.output = nn.Dense(classes, weight_initializer="normal", bias_initializer="zeros")


_SPECS = {11: [1, 1, 2, 2, 2], 13: [2, 2, 2, 2, 2], 16: [2, 2, 3, 3, 3], 19: [2, 2, 4, 4, 4]}
_FILTERS = [64, 128, 256, 512, 512]


def get_vgg(num_layers, pretrained=False, ctx=cpu(), root=DEFAULT_ROOT, **kwargs):
    """VGG with ``num_layers`` 11, 13, 16 or 19; ``kwargs`` (``classes``, ``batch_norm``) go to VGG.
    ``ctx`` and ``root`` only concern pretrained weights."""
    if num_layers not in _SPECS:
        raise ValueError("Invalid number of layers: %d. Options are %s" % (num_layers, sorted(_SPECS)))
    reject_pretrained(pretrained, "vgg%d%s" % (num_layers, "_bn" if kwargs.get("batch_norm") else ""), root)
    return VGG(_SPECS[num_layers], _FILTERS, **kwargs)


def _factory(num_layers, batch_norm):
    def build(**kwargs):
        if batch_norm:
            kwargs["batch_norm"] = True
        return get_vgg(num_layers, **kwargs)

    build.__name__ = "vgg%d%s" % (num_layers, "_bn" if batch_norm else "")
    build.__doc__ = "VGG-%d%s (see get_vgg for the keyword arguments)." % (
        num_layers, " with BatchNorm" if batch_norm else "")
    return build


vgg11, vgg13, vgg16, vgg19 = (_factory(n, False) for n in sorted(_SPECS))
vgg11_bn, vgg13_bn, vgg16_bn, vgg19_bn = (_factory(n, True) for n in sorted(_SPECS))
