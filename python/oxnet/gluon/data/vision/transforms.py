"""Image transforms (MXNet's ``mxnet.gluon.data.vision.transforms``): blocks applied to samples.

Images are (H, W, C) arrays (batches (N, H, W, C)) until ``ToTensor`` makes them float32
(C, H, W) tensors in [0, 1]; ``Normalize``, ``Rotate`` and ``RandomRotation`` take tensors.
The hybrid transforms run the ``_image_*`` operators, so ``Compose`` hybridizes runs of them."""

import random
from numbers import Number

import numpy as np

from .... import image
from ...block import Block, HybridBlock
from ...nn import HybridSequential, Sequential

__all__ = ["Compose", "Cast", "ToTensor", "Normalize", "Rotate", "RandomRotation", "RandomResizedCrop",
           "CropResize", "CenterCrop", "Resize", "RandomFlipLeftRight", "RandomFlipTopBottom", "RandomBrightness",
           "RandomContrast", "RandomSaturation", "RandomHue", "RandomColorJitter", "RandomLighting", "RandomApply"]


class Compose(Sequential):
    """Apply transforms in order. Consecutive hybrid transforms are grouped into one hybridized
    ``HybridSequential``, which runs them as one cached graph."""

    def __init__(self, transforms):
        super().__init__()
        run = []

        def flush():
            if len(run) == 1:
                self.add(run[0])
            elif run:
                group = HybridSequential()
                group.add(*run)
                group.hybridize()
                self.add(group)
            run.clear()

        for transform in transforms:
            if isinstance(transform, HybridBlock):
                run.append(transform)
                continue
            flush()
            self.add(transform)
        flush()


class Cast(HybridBlock):
    """Cast the input to ``dtype``."""

    def __init__(self, dtype="float32"):
        super().__init__()
        self._dtype = dtype

    def hybrid_forward(self, F, x):
        return F.cast(x, self._dtype)


class ToTensor(HybridBlock):
    """(H, W, C) (or (N, H, W, C)) in [0, 255] to float32 (C, H, W) (or (N, C, H, W)) in [0, 1]."""

    def hybrid_forward(self, F, x):
        return F.image.to_tensor(x)


class Normalize(HybridBlock):
    """``(x - mean[c]) / std[c]`` per channel of a (C, H, W) or (N, C, H, W) tensor; ``mean`` and
    ``std`` are one value or one per channel."""

    def __init__(self, mean=0.0, std=1.0):
        super().__init__()
        self._mean = mean
        self._std = std

    def hybrid_forward(self, F, x):
        return F.image.normalize(x, self._mean, self._std)


def _require_float32(x):
    if x.dtype != np.float32:
        raise TypeError("This transformation only supports float32. Consider calling it after ToTensor")


class Rotate(Block):
    """Rotate float32 tensors (C, H, W) or (N, C, H, W) counter-clockwise by ``rotation_degrees``
    (see ``mx.image.imrotate`` for ``zoom_in``/``zoom_out``)."""

    def __init__(self, rotation_degrees, zoom_in=False, zoom_out=False):
        super().__init__()
        self._args = (rotation_degrees, zoom_in, zoom_out)

    def forward(self, x):
        _require_float32(x)
        return image.imrotate(x, *self._args)


class RandomRotation(Block):
    """Rotate float32 tensors by an angle drawn from ``angle_limits`` (lower, upper), with
    probability ``rotate_with_proba``."""

    def __init__(self, angle_limits, zoom_in=False, zoom_out=False, rotate_with_proba=1.0):
        super().__init__()
        lower, upper = angle_limits
        if lower >= upper:
            raise ValueError("`angle_limits` must be an ordered tuple")
        if rotate_with_proba < 0 or rotate_with_proba > 1:
            raise ValueError("Probability of rotating the image should be between 0 and 1")
        self._args = (angle_limits, zoom_in, zoom_out)
        self._rotate_with_proba = rotate_with_proba

    def forward(self, x):
        if np.random.random() > self._rotate_with_proba:
            return x
        _require_float32(x)
        return image.random_rotate(x, *self._args)


class RandomResizedCrop(Block):
    """Crop a random window covering a fraction ``scale`` of the image with aspect ratio in
    ``ratio``, resized to ``size`` (one value or (width, height))."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), interpolation=1):
        super().__init__()
        if isinstance(size, Number):
            size = (size, size)
        self._args = (size, scale, ratio, interpolation)

    def forward(self, x):
        return image.random_size_crop(x, *self._args)[0]


class CropResize(HybridBlock):
    """Crop the ``width`` x ``height`` window at (``x``, ``y``), then resize it to ``size``
    ((width, height) or one value) if given."""

    def __init__(self, x, y, width, height, size=None, interpolation=None):
        super().__init__()
        self._x = x
        self._y = y
        self._width = width
        self._height = height
        self._size = size
        self._interpolation = interpolation

    def hybrid_forward(self, F, x):
        out = F.image.crop(x, self._x, self._y, self._width, self._height)
        if self._size:
            interp = 1 if self._interpolation is None else self._interpolation
            out = F.image.resize(out, self._size, False, interp)
        return out


class CenterCrop(Block):
    """Crop the central window of ``size`` (one value or (width, height)), shrunk to fit and
    resized back to ``size``."""

    def __init__(self, size, interpolation=1):
        super().__init__()
        if isinstance(size, Number):
            size = (size, size)
        self._args = (size, interpolation)

    def forward(self, x):
        return image.center_crop(x, *self._args)[0]


class Resize(HybridBlock):
    """Resize to ``size`` ((width, height), or one value for both edges or, with
    ``keep_ratio``, for the shorter edge)."""

    def __init__(self, size, keep_ratio=False, interpolation=1):
        super().__init__()
        self._keep = keep_ratio
        self._size = size
        self._interpolation = interpolation

    def hybrid_forward(self, F, x):
        return F.image.resize(x, self._size, self._keep, self._interpolation)


class RandomFlipLeftRight(HybridBlock):
    """Mirror left to right with probability 1/2."""

    def hybrid_forward(self, F, x):
        return F.image.random_flip_left_right(x)


class RandomFlipTopBottom(HybridBlock):
    """Mirror top to bottom with probability 1/2."""

    def hybrid_forward(self, F, x):
        return F.image.random_flip_top_bottom(x)


class _RandomFactor(HybridBlock):
    """A colour transform whose factor is drawn from [max(0, 1 - amount), 1 + amount]."""

    _operator = None

    def __init__(self, amount):
        super().__init__()
        self._args = (max(0, 1 - amount), 1 + amount)

    def hybrid_forward(self, F, x):
        return getattr(F.image, self._operator)(x, *self._args)


class RandomBrightness(_RandomFactor):
    """Scale brightness by a factor drawn from [max(0, 1 - brightness), 1 + brightness]."""

    _operator = "random_brightness"


class RandomContrast(_RandomFactor):
    """Blend with the mean gray level by a factor drawn from [max(0, 1 - contrast), 1 + contrast]."""

    _operator = "random_contrast"


class RandomSaturation(_RandomFactor):
    """Blend pixels with their gray level by a factor drawn from [max(0, 1 - saturation), 1 + saturation]."""

    _operator = "random_saturation"


class RandomHue(_RandomFactor):
    """Turn the hue by a fraction of a turn drawn from [max(0, 1 - hue), 1 + hue], as MXNet 1.x
    does: a whole turn (no change) give or take up to ``hue`` of a turn."""

    _operator = "random_hue"


class RandomColorJitter(HybridBlock):
    """Jitter brightness, contrast, saturation and hue by random amounts, in a random order."""

    def __init__(self, brightness=0, contrast=0, saturation=0, hue=0):
        super().__init__()
        self._args = (brightness, contrast, saturation, hue)

    def hybrid_forward(self, F, x):
        return F.image.random_color_jitter(x, *self._args)


class RandomLighting(HybridBlock):
    """Add AlexNet-style PCA lighting noise with alphas drawn from N(0, alpha)."""

    def __init__(self, alpha):
        super().__init__()
        self._alpha = alpha

    def hybrid_forward(self, F, x):
        return F.image.random_lighting(x, self._alpha)


class RandomApply(Sequential):
    """Apply ``transforms`` with probability ``p``."""

    def __init__(self, transforms, p=0.5):
        super().__init__()
        self.transforms = transforms
        self.p = p

    def forward(self, x):
        if self.p < random.random():
            return x
        return self.transforms(x)
