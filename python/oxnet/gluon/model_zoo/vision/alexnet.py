"""AlexNet (Krizhevsky 2014, "One weird trick for parallelizing convolutional neural networks"),
laid out and named as MXNet 1.x's model zoo."""

from ....context import cpu
from ... import nn
from ._common import DEFAULT_ROOT, FeaturesThenOutput, reject_pretrained

__all__ = ["AlexNet", "alexnet"]


class AlexNet(FeaturesThenOutput):
    """Five ReLU convolutions with three 3x3/2 max pools, two 4096-unit dropout layers, ``classes`` outputs."""

    def __init__(self, classes=1000, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            with self.features.name_scope():
                for channels, kernel, stride, pad, pool_after in [(64, 11, 4, 2, True), (192, 5, 1, 2, True),
                                                                  (384, 3, 1, 1, False), (256, 3, 1, 1, False),
                                                                  (256, 3, 1, 1, True)]:
                    self.features.add(nn.Conv2D(channels, kernel_size=kernel, strides=stride, padding=pad,
                                                activation="relu"))
                    if pool_after:
                        self.features.add(nn.MaxPool2D(pool_size=3, strides=2))
                self.features.add(nn.Flatten())
                for _ in range(2):
                    self.features.add(nn.Dense(4096, activation="relu"), nn.Dropout(0.5))
            self.output = nn.Dense(classes)


def alexnet(pretrained=False, ctx=cpu(), root=DEFAULT_ROOT, **kwargs):
    """AlexNet; ``kwargs`` go to its constructor. ``ctx`` and ``root`` only concern pretrained weights."""
    reject_pretrained(pretrained, "alexnet", root)
    return AlexNet(**kwargs)
