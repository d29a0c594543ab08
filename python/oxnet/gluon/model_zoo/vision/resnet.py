"""ResNet V1 (He et al. 2015, "Deep Residual Learning for Image Recognition") and V2 (He et al. 2016,
"Identity Mappings in Deep Residual Networks"), laid out and named as MXNet 1.x's model zoo."""

from ....context import cpu
from ...block import HybridBlock
from ... import nn
from ._common import DEFAULT_ROOT, FeaturesThenOutput, reject_pretrained

__all__ = ["ResNetV1", "ResNetV2", "BasicBlockV1", "BasicBlockV2", "BottleneckV1", "BottleneckV2",
           "resnet18_v1", "resnet34_v1", "resnet50_v1", "resnet101_v1", "resnet152_v1",
           "resnet18_v2", "resnet34_v2", "resnet50_v2", "resnet101_v2", "resnet152_v2", "get_resnet"]

# The residual blocks create their layers without entering their own name scope, so (as in MXNet)
# their parameters are numbered in the scope of the stage holding them: stage1_conv0, stage1_conv1, ...


def _conv3x3(channels, stride, in_channels):
    return nn.Conv2D(channels, kernel_size=3, strides=stride, padding=1, use_bias=False, in_channels=in_channels)


class _ResidualV1(HybridBlock):
    """``relu(body(x) + shortcut)``; the shortcut is x, or a strided 1x1 conv and BatchNorm of x
    when the block changes shape."""

    def __init__(self, body_layers, channels, stride, downsample, in_channels, **kwargs):
        super().__init__(**kwargs)
        self.body = nn.HybridSequential(prefix="")
        self.body.add(*body_layers)
        if downsample:
            self.downsample = nn.HybridSequential(prefix="")
            self.downsample.add(nn.Conv2D(channels, kernel_size=1, strides=stride, use_bias=False,
                                          in_channels=in_channels),
                                nn.BatchNorm())
        else:
            self.downsample = None

    def hybrid_forward(self, F, x):
        shortcut = self.downsample(x) if self.downsample is not None else x
        return F.Activation(self.body(x) + shortcut, act_type="relu")


class BasicBlockV1(_ResidualV1):
    """Two 3x3 convolutions (ResNet-18/34 V1)."""

    def __init__(self, channels, stride, downsample=False, in_channels=0, **kwargs):
        body = [_conv3x3(channels, stride, in_channels), nn.BatchNorm(), nn.Activation("relu"),
                _conv3x3(channels, 1, channels), nn.BatchNorm()]
        super().__init__(body, channels, stride, downsample, in_channels, **kwargs)


class BottleneckV1(_ResidualV1):
    """1x1 (strided) -> 3x3 -> 1x1 convolutions with a 4x narrower middle (ResNet-50/101/152 V1).
    The two 1x1 convolutions keep their bias, as MXNet's do."""

    def __init__(self, channels, stride, downsample=False, in_channels=0, **kwargs):
        body = [nn.Conv2D(channels // 4, kernel_size=1, strides=stride), nn.BatchNorm(), nn.Activation("relu"),
                _conv3x3(channels // 4, 1, channels // 4), nn.BatchNorm(), nn.Activation("relu"),
                nn.Conv2D(channels, kernel_size=1, strides=1), nn.BatchNorm()]
        super().__init__(body, channels, stride, downsample, in_channels, **kwargs)


class _ResidualV2(HybridBlock):
    """Pre-activation unit: (BatchNorm, ReLU, conv) repeated, added to x, or to a strided 1x1
    projection of the first activation when the block changes shape."""

    def __init__(self, convs, channels, stride, downsample, in_channels, **kwargs):
        super().__init__(**kwargs)
        self._norm_convs = []
        for index, conv in enumerate(convs, 1):
            norm = nn.BatchNorm()
            setattr(self, "bn%d" % index, norm)
            setattr(self, "conv%d" % index, conv)
            self._norm_convs.append((norm, conv))
        if downsample:
            self.downsample = nn.Conv2D(channels, 1, stride, use_bias=False, in_channels=in_channels)
        else:
            self.downsample = None

    def hybrid_forward(self, F, x):
        shortcut = x
        for index, (norm, conv) in enumerate(self._norm_convs):
            x = F.Activation(norm(x), act_type="relu")
            if index == 0 and self.downsample is not None:
                shortcut = self.downsample(x)
            x = conv(x)
        return x + shortcut


class BasicBlockV2(_ResidualV2):
    """Two pre-activated 3x3 convolutions (ResNet-18/34 V2)."""

    def __init__(self, channels, stride, downsample=False, in_channels=0, **kwargs):
        convs = [_conv3x3(channels, stride, in_channels), _conv3x3(channels, 1, channels)]
        super().__init__(convs, channels, stride, downsample, in_channels, **kwargs)


class BottleneckV2(_ResidualV2):
    """Pre-activated 1x1 -> 3x3 (strided) -> 1x1 convolutions (ResNet-50/101/152 V2)."""

    def __init__(self, channels, stride, downsample=False, in_channels=0, **kwargs):
        convs = [nn.Conv2D(channels // 4, kernel_size=1, strides=1, use_bias=False),
                 _conv3x3(channels // 4, stride, channels // 4),
                 nn.Conv2D(channels, kernel_size=1, strides=1, use_bias=False)]
        super().__init__(convs, channels, stride, downsample, in_channels, **kwargs)


def _add_stem(features, channels, thumbnail):
    """A 3x3 convolution for small (CIFAR-sized) images, else the 7x7/2 convolution and 3x3/2 max pool."""
    if thumbnail:
        features.add(_conv3x3(channels, 1, 0))
    else:
        features.add(nn.Conv2D(channels, 7, 2, 3, use_bias=False), nn.BatchNorm(), nn.Activation("relu"),
                     nn.MaxPool2D(3, 2, 1))


def _add_stages(features, block, layers, channels):
    """Stage i (prefix ``stage<i>_``) holds ``layers[i-1]`` blocks; all but the first halve the resolution."""
    for index, num_blocks in enumerate(layers, 1):
        in_channels, out_channels = channels[index - 1], channels[index]
        stage = nn.HybridSequential(prefix="stage%d_" % index)
        with stage.name_scope():
            stage.add(block(out_channels, 1 if index == 1 else 2, out_channels != in_channels,
                            in_channels=in_channels, prefix=""))
            for _ in range(num_blocks - 1):
                stage.add(block(out_channels, 1, False, in_channels=out_channels, prefix=""))
        features.add(stage)


def _check_spec(layers, channels):
    if len(layers) != len(channels) - 1:
        raise ValueError("channels needs one entry more than layers (the stem's), got %d layers and %d channels"
                         % (len(layers), len(channels)))


class ResNetV1(FeaturesThenOutput):
    """ResNet V1: ``block`` is BasicBlockV1 or BottleneckV1, ``layers[i]`` blocks in stage i with
    ``channels[i+1]`` channels (``channels[0]`` is the stem's); ``thumbnail`` for small images."""

    def __init__(self, block, layers, channels, classes=1000, thumbnail=False, **kwargs):
        super().__init__(**kwargs)
        _check_spec(layers, channels)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            _add_stem(self.features, channels[0], thumbnail)
            _add_stages(self.features, block, layers, channels)
            self.features.add(nn.GlobalAvgPool2D())
            self.output = nn.Dense(classes, in_units=channels[-1])


class ResNetV2(FeaturesThenOutput):
    """ResNet V2 (pre-activation): ``block`` is BasicBlockV2 or BottleneckV2; the input is first
    standardized by a BatchNorm without scale and shift. Other arguments as ResNetV1."""

    def __init__(self, block, layers, channels, classes=1000, thumbnail=False, **kwargs):
        super().__init__(**kwargs)
        _check_spec(layers, channels)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            self.features.add(nn.BatchNorm(scale=False, center=False))
            _add_stem(self.features, channels[0], thumbnail)
            _add_stages(self.features, block, layers, channels)
            self.features.add(nn.BatchNorm(), nn.Activation("relu"), nn.GlobalAvgPool2D(), nn.Flatten())
            self.output = nn.Dense(classes, in_units=channels[-1])


_SPECS = {18: ("basic", [2, 2, 2, 2], [64, 64, 128, 256, 512]),
          34: ("basic", [3, 4, 6, 3], [64, 64, 128, 256, 512]),
          50: ("bottleneck", [3, 4, 6, 3], [64, 256, 512, 1024, 2048]),
          101: ("bottleneck", [3, 4, 23, 3], [64, 256, 512, 1024, 2048]),
          152: ("bottleneck", [3, 8, 36, 3], [64, 256, 512, 1024, 2048])}
_VERSIONS = {1: (ResNetV1, {"basic": BasicBlockV1, "bottleneck": BottleneckV1}),
             2: (ResNetV2, {"basic": BasicBlockV2, "bottleneck": BottleneckV2})}


def get_resnet(version, num_layers, pretrained=False, ctx=cpu(), root=DEFAULT_ROOT, **kwargs):
    """ResNet ``version`` 1 or 2 with ``num_layers`` 18, 34, 50, 101 or 152; ``kwargs`` go to the
    ResNetV1/ResNetV2 constructor. ``ctx`` and ``root`` only concern pretrained weights."""
    if num_layers not in _SPECS:
        raise ValueError("Invalid number of layers: %d. Options are %s" % (num_layers, sorted(_SPECS)))
    if version not in _VERSIONS:
        raise ValueError("Invalid resnet version: %d. Options are 1 and 2." % version)
    reject_pretrained(pretrained, "resnet%d_v%d" % (num_layers, version), root)
    block_kind, layers, channels = _SPECS[num_layers]
    net_class, blocks = _VERSIONS[version]
    return net_class(blocks[block_kind], layers, channels, **kwargs)


def _factory(version, num_layers):
    def build(**kwargs):
        return get_resnet(version, num_layers, **kwargs)

    build.__name__ = "resnet%d_v%d" % (num_layers, version)
    build.__doc__ = "ResNet-%d V%d (see get_resnet for the keyword arguments)." % (num_layers, version)
    return build


resnet18_v1, resnet34_v1, resnet50_v1, resnet101_v1, resnet152_v1 = (_factory(1, n) for n in sorted(_SPECS))
resnet18_v2, resnet34_v2, resnet50_v2, resnet101_v2, resnet152_v2 = (_factory(2, n) for n in sorted(_SPECS))
