"""Image transforms (blocks applied to samples)."""

import numpy as np

from .... import ndarray
from ...block import Block, HybridBlock
from ...nn import HybridSequential, Sequential


class Compose(Sequential):
    """Apply transforms in order."""

    def __init__(self, transforms):
        super().__init__()
        with self.name_scope():
            for t in transforms:
                self.add(t)


class Cast(HybridBlock):
    def __init__(self, dtype="float32"):
        super().__init__()
        self._dtype = dtype

    def hybrid_forward(self, F, x):
        return F.Cast(x, dtype=self._dtype)


def _as_nd(x):
    return x if isinstance(x, ndarray.NDArray) else ndarray.array(np.asarray(x), dtype=np.asarray(x).dtype)


class ToTensor(Block):
    """(H, W, C) uint8 in [0, 255] to (C, H, W) float32 in [0, 1] (batches: (N, H, W, C))."""

    def forward(self, x):
        x = _as_nd(x).astype("float32") / 255.0
        axes = (2, 0, 1) if x.ndim == 3 else (0, 3, 1, 2)
        return ndarray.transpose(x, axes=axes)


class Normalize(Block):
    """(x - mean) / std per channel of a (C, H, W) tensor."""

    def __init__(self, mean=0.0, std=1.0):
        super().__init__()
        self._mean = np.asarray(mean, dtype=np.float32).reshape(-1, 1, 1)
        self._std = np.asarray(std, dtype=np.float32).reshape(-1, 1, 1)

    def forward(self, x):
        x = _as_nd(x)
        return (x - ndarray.array(self._mean, ctx=x.context)) / ndarray.array(self._std, ctx=x.context)


class RandomFlipLeftRight(Block):
    """Mirror an (H, W, C) image horizontally with probability 1/2."""

    def forward(self, x):
        x = _as_nd(x)
        return ndarray.flip(x, axis=1) if np.random.rand() < 0.5 else x
