"""Image decoding, resizing, cropping and augmentation (MXNet's ``mxnet.image``).

Images are (height, width, channels) NDArrays, uint8 as decoded, in RGB order unless asked
otherwise. Decoding uses Pillow (``pip install pillow``); resizing runs the ``_image_resize``
operator, which reproduces OpenCV's interpolation methods."""

from .image import *  # noqa: F401,F403
from .image import __all__  # noqa: F401
from .image_iter import ImageIter  # noqa: F401

__all__ = __all__ + ["ImageIter"]
