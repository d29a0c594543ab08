"""Image functions and augmenters with MXNet 1.x's names, arguments and defaults.

Interpolation codes are OpenCV's, as in MXNet: 0 nearest, 1 bilinear, 2 area, 3 bicubic,
4 Lanczos; 9 picks area when shrinking, bicubic when enlarging and bilinear otherwise; 10 picks
one of 0-4 at random."""

import io as _io
import json
import random
import warnings
from numbers import Number

import numpy as np

from .. import ndarray as nd
from ..base import MXNetError

__all__ = ["imread", "imdecode", "imresize", "scale_down", "copyMakeBorder", "resize_short", "fixed_crop",
           "random_crop", "center_crop", "color_normalize", "random_size_crop", "imrotate", "random_rotate",
           "Augmenter", "SequentialAug", "ResizeAug", "ForceResizeAug", "RandomCropAug", "RandomSizedCropAug",
           "CenterCropAug", "RandomOrderAug", "BrightnessJitterAug", "ContrastJitterAug", "SaturationJitterAug",
           "HueJitterAug", "ColorJitterAug", "LightingAug", "ColorNormalizeAug", "RandomGrayAug",
           "HorizontalFlipAug", "CastAug", "CreateAugmenter"]


def _pillow_image():
    try:
        from PIL import Image, ImageOps
    except ImportError as e:
        raise ImportError("oxnet.image needs Pillow to decode JPEG and PNG images: install it with "
                          "`pip install pillow` (or `pip install oxnet[image]`)") from e
    return Image, ImageOps


def _deliver(result, out):
    """``result``, or ``out`` holding it when the caller gave an output array."""
    if out is None:
        return result
    result.copyto(out)
    return out


def imdecode(buf, flag=1, to_rgb=True, out=None):
    """Decode an image file's bytes (JPEG, PNG and what else Pillow reads) to an NDArray.

    Parameters
    ----------
    buf : bytes, bytearray, numpy.ndarray or NDArray (uint8)
        The encoded image.
    flag : int, default 1
        1: a color image (H, W, 3); 0: a grayscale image (H, W, 1).
    to_rgb : bool, default True
        Channels in RGB order (True) or in OpenCV's BGR order (False).
    out : NDArray, optional
        Array to hold the result.

    Returns
    -------
    NDArray
        The uint8 image, (height, width, channels). EXIF orientation is applied, as OpenCV does.
    """
    if isinstance(buf, nd.NDArray):
        data = buf.asnumpy().astype(np.uint8).tobytes()
    elif isinstance(buf, (bytes, bytearray)):
        data = bytes(buf)
    elif isinstance(buf, np.ndarray):
        data = buf.astype(np.uint8, copy=False).tobytes()
    else:
        raise ValueError("buf must be of type bytes, bytearray or numpy.ndarray, if you would like to input type "
                         "str, please convert to bytes")
    if flag not in (0, 1):
        raise ValueError("flag must be 1 (color) or 0 (grayscale), got %r" % (flag,))
    Image, ImageOps = _pillow_image()
    try:
        with Image.open(_io.BytesIO(data)) as picture:
            picture = ImageOps.exif_transpose(picture)
            pixels = np.asarray(picture.convert("RGB" if flag == 1 else "L"), dtype=np.uint8)
    except (OSError, ValueError, SyntaxError) as e:
        raise MXNetError("imdecode: cannot decode the %d-byte buffer as an image: %s" % (len(data), e)) from e
    if flag == 0:
        pixels = pixels[:, :, None]
    elif not to_rgb:
        pixels = pixels[:, :, ::-1]
    return _deliver(nd.array(np.ascontiguousarray(pixels), dtype=np.uint8), out)


def imread(filename, flag=1, to_rgb=True, out=None):
    """Read and decode an image file (see ``imdecode`` for ``flag`` and ``to_rgb``)."""
    try:
        with open(filename, "rb") as f:
            data = f.read()
    except OSError as e:
        raise MXNetError("imread: cannot open file '%s': %s" % (filename, e)) from e
    return imdecode(data, flag=flag, to_rgb=to_rgb, out=out)


def imresize(src, w, h, interp=1, out=None):
    """Resize an image (H, W, C) to width ``w`` and height ``h`` with OpenCV's interpolation
    method ``interp`` (see the module's documentation)."""
    return nd._internal._image_resize(src, size=(w, h), interp=interp, out=out)


def scale_down(src_size, size):
    """Shrink ``size`` (w, h) to fit in ``src_size`` (w, h), keeping its aspect ratio."""
    w, h = size
    sw, sh = src_size
    if sh < h:
        w, h = float(w * sh) / h, sh
    if sw < w:
        w, h = sw, float(h * sw) / w
    return int(w), int(h)


# OpenCV's border types and the NumPy padding modes that produce the same borders.
_BORDER_MODES = {0: "constant", 1: "edge", 2: "symmetric", 3: "wrap", 4: "reflect"}


def copyMakeBorder(src, top, bot, left, right, type=0, value=0.0, values=None, out=None):  # noqa: A002 (MXNet's name)
    """Pad an image (H, W, C) with borders of the given widths.

    ``type`` is OpenCV's border type: 0 constant (``value``, or per-channel ``values``),
    1 replicate, 2 reflect (``fedcba|abcdef``), 3 wrap, 4 reflect-101 (``fedcb|abcdef``)."""
    if type not in _BORDER_MODES:
        raise ValueError("copyMakeBorder: type must be one of %s (OpenCV border types), got %r"
                         % (sorted(_BORDER_MODES), type))
    image = src.asnumpy()
    widths = [(top, bot), (left, right)] + [(0, 0)] * (image.ndim - 2)
    if type != 0:
        padded = np.pad(image, widths, mode=_BORDER_MODES[type])
    else:
        padded = np.pad(image, widths, mode="constant", constant_values=0)
        fill = np.asarray(values if values else value, dtype=np.float64)
        border = np.ones(padded.shape[:2], dtype=bool)
        border[top:top + image.shape[0], left:left + image.shape[1]] = False
        padded[border] = np.broadcast_to(fill, padded[border].shape).astype(image.dtype)
    return _deliver(nd.array(padded, ctx=src.context, dtype=image.dtype), out)


def _get_interp_method(interp, sizes=()):
    """Resolve the automatic interpolation codes 9 and 10 for a resize of ``sizes``
    (old height, old width, new height, new width)."""
    if interp == 9:
        if sizes:
            oh, ow, nh, nw = sizes
            if nh > oh and nw > ow:
                return 2
            if nh < oh and nw < ow:
                return 3
            return 1
        return 2
    if interp == 10:
        return random.randint(0, 4)
    if interp not in (0, 1, 2, 3, 4):
        raise ValueError("Unknown interp method %d" % interp)
    return interp


def resize_short(src, size, interp=2):
    """Resize the shorter edge of an image (H, W, C) to ``size``, keeping the aspect ratio."""
    h, w, _ = src.shape
    if h > w:
        new_h, new_w = size * h // w, size
    else:
        new_h, new_w = size, size * w // h
    return imresize(src, new_w, new_h, interp=_get_interp_method(interp, (h, w, new_h, new_w)))


def fixed_crop(src, x0, y0, w, h, size=None, interp=2):
    """The ``w`` x ``h`` window at (``x0``, ``y0``), resized to ``size`` (w, h) if given."""
    out = src[y0:y0 + h, x0:x0 + w]
    if size is not None and (w, h) != tuple(size):
        out = imresize(out, *size, interp=_get_interp_method(interp, (h, w, size[1], size[0])))
    return out


def random_crop(src, size, interp=2):
    """A random window of ``size`` (w, h) (shrunk to fit), resized to ``size``.
    Returns (image, (x0, y0, w, h))."""
    h, w, _ = src.shape
    new_w, new_h = scale_down((w, h), size)
    x0 = random.randint(0, w - new_w)
    y0 = random.randint(0, h - new_h)
    return fixed_crop(src, x0, y0, new_w, new_h, size, interp), (x0, y0, new_w, new_h)


def center_crop(src, size, interp=2):
    """The central window of ``size`` (w, h) (shrunk to fit), resized to ``size``.
    Returns (image, (x0, y0, w, h))."""
    h, w, _ = src.shape
    new_w, new_h = scale_down((w, h), size)
    x0 = int((w - new_w) / 2)
    y0 = int((h - new_h) / 2)
    return fixed_crop(src, x0, y0, new_w, new_h, size, interp), (x0, y0, new_w, new_h)


def color_normalize(src, mean, std=None):
    """``(src - mean) / std``; either may be None."""
    if mean is not None:
        src = src - mean
    if std is not None:
        src = src / std
    return src


def random_size_crop(src, size, area, ratio, interp=2, **kwargs):
    """A random window covering a fraction ``area`` (a number: [area, 1]; or a range) of the
    image with aspect ratio in ``ratio``, resized to ``size`` (w, h); the center crop when ten
    draws fail. Returns (image, (x0, y0, w, h))."""
    h, w, _ = src.shape
    if "min_area" in kwargs:
        warnings.warn("`min_area` is deprecated. Please use `area` instead.", DeprecationWarning)
        area = kwargs.pop("min_area")
    if kwargs:
        raise TypeError("unexpected keyword arguments for `random_size_crop`: %s" % ", ".join(kwargs))
    if isinstance(area, Number):
        area = (area, 1.0)
    log_ratio = (np.log(ratio[0]), np.log(ratio[1]))
    for _ in range(10):
        target_area = random.uniform(area[0], area[1]) * h * w
        new_ratio = np.exp(random.uniform(*log_ratio))
        new_w = int(round(np.sqrt(target_area * new_ratio)))
        new_h = int(round(np.sqrt(target_area / new_ratio)))
        if new_w <= w and new_h <= h:
            x0 = random.randint(0, w - new_w)
            y0 = random.randint(0, h - new_h)
            return fixed_crop(src, x0, y0, new_w, new_h, size, interp), (x0, y0, new_w, new_h)
    return center_crop(src, size, interp)


def _bilinear_sample(data, grid):
    """MXNet's BilinearSampler on NumPy arrays: ``data`` (N, C, H, W) read at ``grid`` (N, 2, h, w)
    of normalized (x, y) coordinates in [-1, 1]; samples outside the image read zeros."""
    n, channels, height, width = data.shape
    x = (grid[:, 0] + 1.0) * (width - 1) / 2.0
    y = (grid[:, 1] + 1.0) * (height - 1) / 2.0
    x0, y0 = np.floor(x).astype(np.int64), np.floor(y).astype(np.int64)
    out = np.zeros((n, channels) + grid.shape[2:], dtype=np.float64)
    batch = np.arange(n)[:, None, None]
    for dy in (0, 1):
        for dx in (0, 1):
            xi, yi = x0 + dx, y0 + dy
            weight = (1.0 - np.abs(x - xi)) * (1.0 - np.abs(y - yi))
            inside = (xi >= 0) & (xi < width) & (yi >= 0) & (yi < height)
            values = data[batch, :, np.clip(yi, 0, height - 1), np.clip(xi, 0, width - 1)]  # (N, h, w, C)
            out += np.moveaxis(values * (weight * inside)[..., None], -1, 1)
    return out


def imrotate(src, rotation_degrees, zoom_in=False, zoom_out=False):
    """Rotate float32 tensor images (C, H, W) or (N, C, H, W) counter-clockwise about their
    centres by ``rotation_degrees`` (a number, or one angle per image), filling with zeros.

    ``zoom_in`` scales up so that no filled corner shows; ``zoom_out`` scales down so that the
    whole rotated image fits."""
    if zoom_in and zoom_out:
        raise ValueError("`zoom_in` and `zoom_out` cannot be both True")
    if src.dtype != np.float32:
        raise TypeError("Only `float32` images are supported by this function")
    single = src.ndim == 3
    if single:
        if not isinstance(rotation_degrees, Number):
            raise TypeError("When a single image is passed the rotation angle is required to be a scalar.")
        images = src.asnumpy()[None]
    elif src.ndim == 4:
        images = src.asnumpy()
    else:
        raise ValueError("Only 3D and 4D are supported by this function")
    if isinstance(rotation_degrees, Number):
        degrees = np.full((len(images),), float(rotation_degrees))
    else:
        degrees = np.asarray(rotation_degrees.asnumpy() if isinstance(rotation_degrees, nd.NDArray)
                             else rotation_degrees, dtype=np.float64).reshape(-1)
    if len(degrees) != len(images):
        raise ValueError("The number of images must be equal to the number of rotation angles")
    _, _, h, w = images.shape
    radians = np.pi * degrees[:, None, None] / 180.0
    hscale, wscale = (h - 1) / 2.0, (w - 1) / 2.0
    rows = np.arange(h, dtype=np.float64)[:, None] - hscale
    cols = np.arange(w, dtype=np.float64)[None, :] - wscale
    cos, sin = np.cos(radians), np.sin(radians)
    # Where each output pixel reads from, normalized to [-1, 1].
    source_x = (cols * cos - rows * sin) / (wscale if wscale else 1.0)
    source_y = (cols * sin + rows * cos) / (hscale if hscale else 1.0)
    scale = 1.0
    if zoom_in or zoom_out:
        rho_corner = np.sqrt(h * h + w * w)
        ang_corner = np.arctan(h / w)
        turn = np.abs(radians)
        max_x = np.maximum(np.abs(rho_corner * np.cos(ang_corner + turn)), np.abs(rho_corner * np.cos(ang_corner - turn)))
        max_y = np.maximum(np.abs(rho_corner * np.sin(ang_corner + turn)), np.abs(rho_corner * np.sin(ang_corner - turn)))
        scale = np.maximum(max_x / w, max_y / h) if zoom_out else np.minimum(w / max_x, h / max_y)
    grid = np.stack([source_x * scale, source_y * scale], axis=1)
    rotated = _bilinear_sample(images.astype(np.float64), grid).astype(np.float32)
    result = nd.array(rotated[0] if single else rotated, ctx=src.context, dtype=np.float32)
    return result


def random_rotate(src, angle_limits, zoom_in=False, zoom_out=False):
    """Rotate by an angle drawn uniformly from ``angle_limits`` (one per image of a batch)."""
    if src.ndim == 3:
        degrees = np.random.uniform(*angle_limits)
    else:
        degrees = nd.array(np.random.uniform(*angle_limits, size=src.shape[0]))
    return imrotate(src, degrees, zoom_in=zoom_in, zoom_out=zoom_out)


class Augmenter:
    """Base class of image augmenters: callables from an image to an image."""

    def __init__(self, **kwargs):
        self._kwargs = kwargs
        for key, value in self._kwargs.items():
            if isinstance(value, nd.NDArray):
                value = value.asnumpy()
            if isinstance(value, np.ndarray):
                self._kwargs[key] = value.tolist()

    def dumps(self):
        """The augmenter as JSON: ``[class name in lower case, arguments]``."""
        return json.dumps([self.__class__.__name__.lower(), self._kwargs])

    def __call__(self, src):
        raise NotImplementedError("Must override implementation.")


class SequentialAug(Augmenter):
    """Apply augmenters in order."""

    def __init__(self, ts):
        super().__init__()
        self.ts = ts

    def dumps(self):
        return [self.__class__.__name__.lower(), [t.dumps() for t in self.ts]]

    def __call__(self, src):
        for aug in self.ts:
            src = aug(src)
        return src


class ResizeAug(Augmenter):
    """Resize the shorter edge to ``size``."""

    def __init__(self, size, interp=2):
        super().__init__(size=size, interp=interp)
        self.size = size
        self.interp = interp

    def __call__(self, src):
        return resize_short(src, self.size, self.interp)


class ForceResizeAug(Augmenter):
    """Resize to ``size`` (w, h), ignoring the aspect ratio."""

    def __init__(self, size, interp=2):
        super().__init__(size=size, interp=interp)
        self.size = size
        self.interp = interp

    def __call__(self, src):
        sizes = (src.shape[0], src.shape[1], self.size[1], self.size[0])
        return imresize(src, *self.size, interp=_get_interp_method(self.interp, sizes))


class RandomCropAug(Augmenter):
    """Crop a random window of ``size`` (w, h)."""

    def __init__(self, size, interp=2):
        super().__init__(size=size, interp=interp)
        self.size = size
        self.interp = interp

    def __call__(self, src):
        return random_crop(src, self.size, self.interp)[0]


class RandomSizedCropAug(Augmenter):
    """Crop a random window of random area and aspect ratio, resized to ``size`` (w, h)."""

    def __init__(self, size, area, ratio, interp=2, **kwargs):
        super().__init__(size=size, area=area, ratio=ratio, interp=interp)
        self.size = size
        if "min_area" in kwargs:
            warnings.warn("`min_area` is deprecated. Please use `area` instead.", DeprecationWarning)
            area = kwargs.pop("min_area")
        if kwargs:
            raise TypeError("unexpected keyword arguments for `RandomSizedCropAug`: %s" % ", ".join(kwargs))
        self.area = area
        self.ratio = ratio
        self.interp = interp

    def __call__(self, src):
        return random_size_crop(src, self.size, self.area, self.ratio, self.interp)[0]


class CenterCropAug(Augmenter):
    """Crop the central window of ``size`` (w, h)."""

    def __init__(self, size, interp=2):
        super().__init__(size=size, interp=interp)
        self.size = size
        self.interp = interp

    def __call__(self, src):
        return center_crop(src, self.size, self.interp)[0]


class RandomOrderAug(Augmenter):
    """Apply augmenters in a random order."""

    def __init__(self, ts):
        super().__init__()
        self.ts = ts

    def dumps(self):
        return [self.__class__.__name__.lower(), [t.dumps() for t in self.ts]]

    def __call__(self, src):
        random.shuffle(self.ts)
        for t in self.ts:
            src = t(src)
        return src


# Luma weights of R, G and B (ITU-R BT.601).
_LUMA = (0.299, 0.587, 0.114)


class BrightnessJitterAug(Augmenter):
    """Scale by a factor drawn from [1 - brightness, 1 + brightness]."""

    def __init__(self, brightness):
        super().__init__(brightness=brightness)
        self.brightness = brightness

    def __call__(self, src):
        return src * (1.0 + random.uniform(-self.brightness, self.brightness))


class ContrastJitterAug(Augmenter):
    """Blend with the mean gray level by a factor drawn from [1 - contrast, 1 + contrast]."""

    def __init__(self, contrast):
        super().__init__(contrast=contrast)
        self.contrast = contrast
        self.coef = nd.array([[_LUMA]])

    def __call__(self, src):
        alpha = 1.0 + random.uniform(-self.contrast, self.contrast)
        gray = src * self.coef
        gray_mean = (3.0 * (1.0 - alpha) / gray.size) * nd.sum(gray)
        return src * alpha + gray_mean


class SaturationJitterAug(Augmenter):
    """Blend each pixel with its gray level by a factor drawn from [1 - saturation, 1 + saturation]."""

    def __init__(self, saturation):
        super().__init__(saturation=saturation)
        self.saturation = saturation
        self.coef = nd.array([[_LUMA]])

    def __call__(self, src):
        alpha = 1.0 + random.uniform(-self.saturation, self.saturation)
        gray = nd.sum(src * self.coef, axis=2, keepdims=True) * (1.0 - alpha)
        return src * alpha + gray


class HueJitterAug(Augmenter):
    """Turn the hue (in YIQ space) by a fraction drawn from [-hue, hue] of half a turn."""

    def __init__(self, hue):
        super().__init__(hue=hue)
        self.hue = hue
        self.tyiq = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.321], [0.211, -0.523, 0.311]])
        self.ityiq = np.array([[1.0, 0.956, 0.621], [1.0, -0.272, -0.647], [1.0, -1.107, 1.705]])

    def __call__(self, src):
        alpha = random.uniform(-self.hue, self.hue)
        u, w = np.cos(alpha * np.pi), np.sin(alpha * np.pi)
        turn = np.array([[1.0, 0.0, 0.0], [0.0, u, -w], [0.0, w, u]])
        transform = np.dot(np.dot(self.ityiq, turn), self.tyiq).T
        return nd.dot(src, nd.array(transform, ctx=src.context, dtype=src.dtype))


class ColorJitterAug(RandomOrderAug):
    """Brightness, contrast and saturation jitter (those that are positive), in a random order."""

    def __init__(self, brightness, contrast, saturation):
        ts = []
        if brightness > 0:
            ts.append(BrightnessJitterAug(brightness))
        if contrast > 0:
            ts.append(ContrastJitterAug(contrast))
        if saturation > 0:
            ts.append(SaturationJitterAug(saturation))
        super().__init__(ts)


class LightingAug(Augmenter):
    """Add PCA lighting noise: alphas drawn from N(0, alphastd) along the eigenvectors."""

    def __init__(self, alphastd, eigval, eigvec):
        super().__init__(alphastd=alphastd, eigval=eigval, eigvec=eigvec)
        self.alphastd = alphastd
        self.eigval = eigval
        self.eigvec = eigvec

    def __call__(self, src):
        alpha = np.random.normal(0, self.alphastd, size=(3,))
        rgb = np.dot(self.eigvec * alpha, self.eigval)
        return src + nd.array(rgb, ctx=src.context, dtype=src.dtype)


class ColorNormalizeAug(Augmenter):
    """Subtract ``mean`` and divide by ``std`` (either may be None)."""

    def __init__(self, mean, std):
        super().__init__(mean=mean, std=std)
        self.mean = mean if mean is None or isinstance(mean, nd.NDArray) else nd.array(mean)
        self.std = std if std is None or isinstance(std, nd.NDArray) else nd.array(std)

    def __call__(self, src):
        return color_normalize(src, self.mean, self.std)


class RandomGrayAug(Augmenter):
    """Convert to gray (kept in 3 channels) with probability ``p``."""

    def __init__(self, p):
        super().__init__(p=p)
        self.p = p
        self.mat = nd.array([[0.21, 0.21, 0.21], [0.72, 0.72, 0.72], [0.07, 0.07, 0.07]])

    def __call__(self, src):
        if random.random() < self.p:
            src = nd.dot(src, self.mat)
        return src


class HorizontalFlipAug(Augmenter):
    """Mirror left to right with probability ``p``."""

    def __init__(self, p):
        super().__init__(p=p)
        self.p = p

    def __call__(self, src):
        if random.random() < self.p:
            src = nd.flip(src, axis=1)
        return src


class CastAug(Augmenter):
    """Cast to ``typ``."""

    def __init__(self, typ="float32"):
        super().__init__(type=typ)
        self.typ = typ

    def __call__(self, src):
        return src.astype(self.typ)


def CreateAugmenter(data_shape, resize=0, rand_crop=False, rand_resize=False, rand_mirror=False, mean=None,
                    std=None, brightness=0, contrast=0, saturation=0, hue=0, pca_noise=0, rand_gray=0,
                    inter_method=2):
    """The standard augmenter list for images of ``data_shape`` (C, H, W), as MXNet builds it:
    resize, crop (center, random, or random-sized), mirror, cast to float32, colour jitter, hue,
    PCA lighting noise, random gray, normalization. ``mean``/``std`` True mean ImageNet's."""
    auglist = []
    if resize > 0:
        auglist.append(ResizeAug(resize, inter_method))
    crop_size = (data_shape[2], data_shape[1])
    if rand_resize:
        if not rand_crop:
            raise ValueError("rand_resize needs rand_crop=True")
        auglist.append(RandomSizedCropAug(crop_size, 0.08, (3.0 / 4.0, 4.0 / 3.0), inter_method))
    elif rand_crop:
        auglist.append(RandomCropAug(crop_size, inter_method))
    else:
        auglist.append(CenterCropAug(crop_size, inter_method))
    if rand_mirror:
        auglist.append(HorizontalFlipAug(0.5))
    auglist.append(CastAug())
    if brightness or contrast or saturation:
        auglist.append(ColorJitterAug(brightness, contrast, saturation))
    if hue:
        auglist.append(HueJitterAug(hue))
    if pca_noise > 0:
        eigval = np.array([55.46, 4.794, 1.148])
        eigvec = np.array([[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]])
        auglist.append(LightingAug(pca_noise, eigval, eigvec))
    if rand_gray > 0:
        auglist.append(RandomGrayAug(rand_gray))
    for name, value, imagenet in (("mean", mean, [123.68, 116.28, 103.53]), ("std", std, [58.395, 57.12, 57.375])):
        if value is True:
            value = nd.array(imagenet)
        elif value is not None and not (isinstance(value, (np.ndarray, nd.NDArray)) and value.shape[0] in (1, 3)):
            raise ValueError("%s must be True, None, or an array of 1 or 3 values" % name)
        if name == "mean":
            mean = value
        else:
            std = value
    if mean is not None or std is not None:
        auglist.append(ColorNormalizeAug(mean, std))
    return auglist
