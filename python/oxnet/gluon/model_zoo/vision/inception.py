"""Inception V3 (Szegedy et al. 2015, "Rethinking the Inception Architecture for Computer Vision"),
laid out and named as MXNet 1.x's model zoo (no auxiliary classifier)."""

from ....context import cpu
from ... import nn
from ...contrib.nn import HybridConcurrent
from ._common import DEFAULT_ROOT, FeaturesThenOutput, reject_pretrained

__all__ = ["Inception3", "inception_v3"]


def _basic_conv(channels, kernel_size, strides=1, padding=0):
    """Bias-free convolution, BatchNorm (epsilon 1e-3) and ReLU."""
    out = nn.HybridSequential(prefix="")
    out.add(nn.Conv2D(channels, kernel_size, strides=strides, padding=padding, use_bias=False),
            nn.BatchNorm(epsilon=0.001), nn.Activation("relu"))
    return out


def _branch(pool, *convs):
    """An optional 3x3 pool ('avg': stride 1, same size; 'max': stride 2), then ``_basic_conv(*conv)``
    for each of ``convs``."""
    out = nn.HybridSequential(prefix="")
    if pool == "avg":
        out.add(nn.AvgPool2D(pool_size=3, strides=1, padding=1))
    elif pool == "max":
        out.add(nn.MaxPool2D(pool_size=3, strides=2))
    for conv in convs:
        out.add(_basic_conv(*conv))
    return out


def _mixed(prefix, *branches):
    """Branches (each ``(pool, conv, ...)`` for ``_branch``, or a callable building one) concatenated
    along channels, under ``prefix``."""
    out = HybridConcurrent(axis=1, prefix=prefix)
    with out.name_scope():
        for branch in branches:
            out.add(branch() if callable(branch) else _branch(*branch))
    return out


def _mixed_a(pool_features, prefix):
    return _mixed(prefix, (None, (64, 1)), (None, (48, 1), (64, 5, 1, 2)),
                  (None, (64, 1), (96, 3, 1, 1), (96, 3, 1, 1)), ("avg", (pool_features, 1)))


def _mixed_b(prefix):
    return _mixed(prefix, (None, (384, 3, 2)), (None, (64, 1), (96, 3, 1, 1), (96, 3, 2)), ("max",))


def _mixed_c(channels_7x7, prefix):
    c = channels_7x7
    return _mixed(prefix, (None, (192, 1)),
                  (None, (c, 1), (c, (1, 7), 1, (0, 3)), (192, (7, 1), 1, (3, 0))),
                  (None, (c, 1), (c, (7, 1), 1, (3, 0)), (c, (1, 7), 1, (0, 3)), (c, (7, 1), 1, (3, 0)),
                   (192, (1, 7), 1, (0, 3))),
                  ("avg", (192, 1)))


def _mixed_d(prefix):
    return _mixed(prefix, (None, (192, 1), (320, 3, 2)),
                  (None, (192, 1), (192, (1, 7), 1, (0, 3)), (192, (7, 1), 1, (3, 0)), (192, 3, 2)), ("max",))


def _then_split_1x3_3x1(*convs):
    """``convs``, then 1x3 and 3x1 convolutions of the result concatenated along channels."""
    def build():
        out = nn.HybridSequential(prefix="")
        out.add(_branch(None, *convs))
        split = HybridConcurrent(axis=1, prefix="")
        split.add(_branch(None, (384, (1, 3), 1, (0, 1))), _branch(None, (384, (3, 1), 1, (1, 0))))
        out.add(split)
        return out
    return build


def _mixed_e(prefix):
    return _mixed(prefix, (None, (320, 1)), _then_split_1x3_3x1((384, 1)),
                  _then_split_1x3_3x1((448, 1), (384, 3, 1, 1)), ("avg", (192, 1)))


class Inception3(FeaturesThenOutput):
    """Inception V3 for 299x299 inputs (the final 8x8 average pool expects them)."""

    def __init__(self, classes=1000, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            self.features.add(_basic_conv(32, 3, 2), _basic_conv(32, 3), _basic_conv(64, 3, 1, 1),
                              nn.MaxPool2D(pool_size=3, strides=2), _basic_conv(80, 1), _basic_conv(192, 3),
                              nn.MaxPool2D(pool_size=3, strides=2),
                              _mixed_a(32, "A1_"), _mixed_a(64, "A2_"), _mixed_a(64, "A3_"), _mixed_b("B_"),
                              _mixed_c(128, "C1_"), _mixed_c(160, "C2_"), _mixed_c(160, "C3_"), _mixed_c(192, "C4_"),
                              _mixed_d("D_"), _mixed_e("E1_"), _mixed_e("E2_"),
                              nn.AvgPool2D(pool_size=8), nn.Dropout(0.5))
            self.output = nn.Dense(classes)


def inception_v3(pretrained=False, ctx=cpu(), root=DEFAULT_ROOT, **kwargs):
    """Inception V3; ``kwargs`` go to Inception3. ``ctx`` and ``root`` only concern pretrained weights."""
    reject_pretrained(pretrained, "inceptionv3", root)
    return Inception3(**kwargs)
