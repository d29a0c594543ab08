"""DenseNet (Huang et al. 2016, "Densely Connected Convolutional Networks"), laid out and named as
MXNet 1.x's model zoo."""

from ....context import cpu
from ... import nn
from ...contrib.nn import HybridConcurrent, Identity
from ._common import DEFAULT_ROOT, FeaturesThenOutput, reject_pretrained

__all__ = ["DenseNet", "densenet121", "densenet161", "densenet169", "densenet201"]


def _dense_layer(growth_rate, bn_size, dropout):
    """The input concatenated with ``growth_rate`` new channels from BN-ReLU-1x1 then BN-ReLU-3x3."""
    new_features = nn.HybridSequential(prefix="")
    new_features.add(nn.BatchNorm(), nn.Activation("relu"),
                     nn.Conv2D(bn_size * growth_rate, kernel_size=1, use_bias=False),
                     nn.BatchNorm(), nn.Activation("relu"),
                     nn.Conv2D(growth_rate, kernel_size=3, padding=1, use_bias=False))
    if dropout:
        new_features.add(nn.Dropout(dropout))
    layer = HybridConcurrent(axis=1, prefix="")
    layer.add(Identity(), new_features)
    return layer


def _transition(channels):
    """BN-ReLU-1x1 convolution to ``channels`` and a 2x2 average pool."""
    out = nn.HybridSequential(prefix="")
    out.add(nn.BatchNorm(), nn.Activation("relu"), nn.Conv2D(channels, kernel_size=1, use_bias=False),
            nn.AvgPool2D(pool_size=2, strides=2))
    return out


class DenseNet(FeaturesThenOutput):
    """Dense block i (prefix ``stage<i>_``) has ``block_config[i]`` layers each adding ``growth_rate``
    channels; transitions between blocks halve channels and resolution. The final 7x7 average pool
    expects 224x224 inputs (or any whose last feature map is at least 7x7)."""

    def __init__(self, num_init_features, growth_rate, block_config, bn_size=4, dropout=0, classes=1000,
                 **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            self.features.add(nn.Conv2D(num_init_features, kernel_size=7, strides=2, padding=3, use_bias=False),
                              nn.BatchNorm(), nn.Activation("relu"), nn.MaxPool2D(pool_size=3, strides=2, padding=1))
            num_features = num_init_features
            for index, num_layers in enumerate(block_config, 1):
                block = nn.HybridSequential(prefix="stage%d_" % index)
                with block.name_scope():
                    for _ in range(num_layers):
                        block.add(_dense_layer(growth_rate, bn_size, dropout))
                self.features.add(block)
                num_features += num_layers * growth_rate
                if index != len(block_config):
                    num_features //= 2
                    self.features.add(_transition(num_features))
            self.features.add(nn.BatchNorm(), nn.Activation("relu"), nn.AvgPool2D(pool_size=7), nn.Flatten())
            self.output = nn.Dense(classes)


_SPECS = {121: (64, 32, [6, 12, 24, 16]), 161: (96, 48, [6, 12, 36, 24]), 169: (64, 32, [6, 12, 32, 32]),
          201: (64, 32, [6, 12, 48, 32])}


def get_densenet(num_layers, pretrained=False, ctx=cpu(), root=DEFAULT_ROOT, **kwargs):
    """DenseNet with ``num_layers`` 121, 161, 169 or 201; ``kwargs`` go to DenseNet. ``ctx`` and
    ``root`` only concern pretrained weights."""
    if num_layers not in _SPECS:
        raise ValueError("Invalid number of layers: %d. Options are %s" % (num_layers, sorted(_SPECS)))
    reject_pretrained(pretrained, "densenet%d" % num_layers, root)
    num_init_features, growth_rate, block_config = _SPECS[num_layers]
    return DenseNet(num_init_features, growth_rate, block_config, **kwargs)


def _factory(num_layers):
    def build(**kwargs):
        return get_densenet(num_layers, **kwargs)

    build.__name__ = "densenet%d" % num_layers
    build.__doc__ = "DenseNet-%d (see get_densenet for the keyword arguments)." % num_layers
    return build


densenet121, densenet161, densenet169, densenet201 = (_factory(n) for n in sorted(_SPECS))
