"""``ImageRecordIter``: batches of decoded, augmented images from an image RecordIO file, as
MXNet 1.9.1's C++ iterator of that name makes them (same arguments, defaults and order of
augmentations; the output is RGB, (batch, channels, height, width)).

Images are decoded with Pillow (libjpeg-turbo, libpng) on a pool of ``preprocess_threads``
threads; Pillow and NumPy release the GIL while they decode, resize and normalize, so the pool
uses every core. Up to ``prefetch_buffer`` batches are decoded ahead while the caller computes.

Differences from MXNet: Pillow's resampling filters replace OpenCV's (``inter_method`` picks
the closest one; Pillow anti-aliases when it shrinks), and ``shuffle`` without an index file
shuffles the whole part every epoch (MXNet shuffles within chunks of a batch), and with
``round_batch=False`` the last batch's unused slots are zeros and ``pad`` counts them (MXNet leaves
the previous batch's images there and reports a pad of 0). For PNG images and the default
arguments the batches are identical to MXNet's.
"""

import io as _io
import math
import os
import random
import warnings
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait as _wait_all

import numpy as np

from ..base import MXNetError
from .. import ndarray as nd
from .. import recordio
from .io import DataBatch, DataDesc, DataIter

__all__ = ["ImageRecordIter", "ImageRecordUInt8Iter", "ImageRecordInt8Iter"]

# OpenCV interpolation codes as the C++ iterator reads them: 0 nearest, 1 bilinear, 2 bicubic,
# 3 area, 4 Lanczos; 9 picks by direction, 10 at random.
_NEAREST, _LINEAR, _CUBIC, _AREA, _LANCZOS = range(5)

# MXNet's eigenvalue-scaled eigenvectors of ImageNet's RGB covariance, for ``pca_noise``.
_PCA_EIGVEC = np.array([[55.46 * -0.5675, 4.794 * 0.7192, 1.148 * 0.4009],
                        [55.46 * -0.5808, 4.794 * -0.0045, 1.148 * -0.8140],
                        [55.46 * -0.5836, 4.794 * -0.6948, 1.148 * 0.4203]], dtype=np.float32)

# Augmentations of MXNet's default augmenter that oxnet does not run, with their "off" values.
_UNSUPPORTED = {"max_rotate_angle": 0, "max_shear_ratio": 0.0, "rotate": -1, "max_random_scale": 1.0,
                "min_random_scale": 1.0, "max_img_size": 1e10, "min_img_size": 0.0, "random_h": 0, "random_s": 0,
                "random_l": 0, "mean_img": ""}

# Arguments of the C++ iterator that only tune how MXNet's own machinery runs.
_IGNORED = {"verbose", "device_id", "ctx", "shuffle_chunk_size", "shuffle_chunk_seed", "aug_seq"}


def _pillow():
    try:
        from PIL import Image
    except ImportError as e:
        raise ImportError("ImageRecordIter decodes images with Pillow: install it with `pip install pillow`") from e
    return Image


def _shape3(data_shape):
    shape = tuple(int(d) for d in data_shape)
    if len(shape) != 3 or shape[0] not in (1, 3, 4) or min(shape) <= 0:
        raise MXNetError("ImageRecordIter: data_shape must be (channels, height, width) with 1, 3 or 4 channels "
                         "and positive sizes, got %s" % (data_shape,))
    return shape


def _record_offsets(path):
    """Byte offsets of the records of a RecordIO file, from its part headers."""
    offsets = []
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        position = 0
        while position < size:
            header = f.read(8)
            if len(header) != 8:
                raise MXNetError("Invalid RecordIO file '%s': it ends inside a record header at byte %d"
                                 % (path, position))
            magic, lrec = recordio._PART_HEADER.unpack(header)
            if magic != recordio._MAGIC:
                raise MXNetError("Invalid RecordIO file '%s': no record header at byte %d" % (path, position))
            if lrec >> recordio._LENGTH_BITS in (recordio._WHOLE, recordio._FIRST):
                offsets.append(position)
            length = lrec & recordio._LENGTH_MASK
            position += 8 + length + recordio._padding(length)
            f.seek(position)
    return np.array(offsets, dtype=np.int64)


def _part_of_file(offsets, file_size, part_index, num_parts):
    """The records of part ``part_index``: MXNet splits a file by bytes into ``num_parts``
    4-byte-aligned ranges, and a record belongs to the range its header starts in."""
    step = -(-file_size // num_parts)
    step += -step % 4
    return offsets[(offsets >= step * part_index) & (offsets < step * (part_index + 1))]


def _part_of_index(offsets, part_index, num_parts):
    """The records of part ``part_index`` with an index file: consecutive runs of
    ceil(N / num_parts) records in file order."""
    step = -(-len(offsets) // num_parts)
    return offsets[step * part_index:step * (part_index + 1)]


def _read_image_list(path, label_width):
    """{image index: float32 labels} from an im2rec list file (index, labels..., path)."""
    labels = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            fields = line.strip().split("\t")
            if fields == [""]:
                continue
            if len(fields) < label_width + 2:
                raise MXNetError("ImageRecordIter: line %d of '%s' has %d fields; expected an index, %d label(s) "
                                 "and a path" % (number, path, len(fields), label_width))
            labels[int(float(fields[0]))] = np.array(fields[1:1 + label_width], dtype=np.float32)
    return labels


class _Augmenter:
    """Decodes one record and applies MXNet's default augmentations and normalization, writing
    the result into a slot of a batch. Runs on the pool's threads; it holds no mutable state."""

    def __init__(self, data_shape, out_dtype, label_width, image_labels, options):
        self.channels, self.height, self.width = data_shape
        self.out_dtype = out_dtype
        self.label_width = label_width
        self.image_labels = image_labels
        self.resize = int(options["resize"])
        self.rand_crop = bool(options["rand_crop"])
        self.random_resized_crop = bool(options["random_resized_crop"])
        self.min_random_area = float(options["min_random_area"])
        self.max_random_area = float(options["max_random_area"])
        if options["min_aspect_ratio"] is not None:
            self.min_aspect = float(options["min_aspect_ratio"])
            self.max_aspect = float(options["max_aspect_ratio"])
        else:
            self.min_aspect = 1.0 - float(options["max_aspect_ratio"])
            self.max_aspect = 1.0 + float(options["max_aspect_ratio"])
        if not self.random_resized_crop and (self.min_aspect, self.max_aspect) != (1.0, 1.0):
            raise MXNetError("ImageRecordIter: aspect-ratio jitter without random_resized_crop (an affine warp) "
                             "is not supported by oxnet")
        self.min_crop_size = int(options["min_crop_size"])
        self.max_crop_size = int(options["max_crop_size"])
        if self.random_resized_crop and (self.rand_crop or self.min_crop_size != -1 or self.max_crop_size != -1):
            raise MXNetError("ImageRecordIter: random_resized_crop conflicts with rand_crop, min_crop_size and "
                             "max_crop_size")
        self.inter_method = int(options["inter_method"])
        if self.inter_method not in (0, 1, 2, 3, 4, 9, 10):
            raise MXNetError("ImageRecordIter: invalid inter_method %d: valid values are 0, 1, 2, 3, 4, 9, 10"
                             % self.inter_method)
        self.pad = int(options["pad"])
        self.fill_value = int(options["fill_value"])
        self.brightness = float(options["brightness"])
        self.contrast = float(options["contrast"])
        self.saturation = float(options["saturation"])
        self.pca_noise = float(options["pca_noise"])
        self.mirror = bool(options["mirror"])
        self.rand_mirror = bool(options["rand_mirror"])
        self.max_random_contrast = float(options["max_random_contrast"])
        self.max_random_illumination = float(options["max_random_illumination"])
        self.scale = float(options["scale"])
        names = "rgba"[:self.channels] if self.channels != 1 else "r"
        self.mean = np.array([options["mean_" + c] for c in names], dtype=np.float32)
        self.std = np.array([options["std_" + c] for c in names], dtype=np.float32)
        self.mode = {1: "L", 3: "RGB", 4: "RGBA"}[self.channels]
        Image = _pillow()
        self.filters = {_NEAREST: Image.NEAREST, _LINEAR: Image.BILINEAR, _CUBIC: Image.BICUBIC, _AREA: Image.BOX,
                        _LANCZOS: Image.LANCZOS}

    def _filter(self, old_size, new_size, rng):
        method = self.inter_method
        if method == 9:
            if new_size[0] > old_size[0] and new_size[1] > old_size[1]:
                method = _CUBIC
            elif new_size[0] < old_size[0] and new_size[1] < old_size[1]:
                method = _AREA
            else:
                method = _LINEAR
        elif method == 10:
            method = rng.randint(0, 4)
        return self.filters[method]

    def _resized(self, picture, size, rng):
        if picture.size == size:
            return picture
        return picture.resize(size, self._filter(picture.size, size, rng))

    def _geometry(self, picture, rng):
        """Resize, pad and crop to (width, height) as MXNet's default augmenter does."""
        if self.resize != -1:
            w, h = picture.size
            size = (self.resize, self.resize * h // w) if h > w else (self.resize * w // h, self.resize)
            picture = self._resized(picture, size, rng)
        if self.pad > 0:
            Image = _pillow()
            fill = self.fill_value if picture.mode == "L" else (self.fill_value,) * len(picture.mode)
            padded = Image.new(picture.mode, (picture.width + 2 * self.pad, picture.height + 2 * self.pad), fill)
            padded.paste(picture, (self.pad, self.pad))
            picture = padded
        target = (self.width, self.height)
        if self.random_resized_crop:
            if (self.min_random_area, self.max_random_area, self.min_aspect, self.max_aspect) != (1, 1, 1, 1):
                area = picture.width * picture.height
                for _ in range(10):
                    target_area = area * rng.uniform(self.min_random_area, self.max_random_area)
                    ratio = rng.uniform(self.min_aspect, self.max_aspect)
                    crop_h = int(round(math.sqrt(target_area / ratio)))
                    crop_w = int(round(math.sqrt(target_area * ratio)))
                    if rng.random() > 0.5:
                        crop_h, crop_w = crop_w, crop_h
                    if crop_h <= picture.height and crop_w <= picture.width:
                        y = rng.randint(0, picture.height - crop_h)
                        x = rng.randint(0, picture.width - crop_w)
                        box = (x, y, x + crop_w, y + crop_h)
                        return picture.resize(target, self._filter((crop_w, crop_h), target, rng), box=box)
        elif self.max_crop_size != -1 or self.min_crop_size != -1:
            if not (picture.width >= self.max_crop_size and picture.height >= self.max_crop_size
                    and self.max_crop_size >= self.min_crop_size):
                raise MXNetError("ImageRecordIter: the image (%dx%d after resize) is smaller than max_crop_size %d"
                                 " (or min_crop_size %d > max_crop_size)"
                                 % (picture.width, picture.height, self.max_crop_size, self.min_crop_size))
            size = rng.randint(self.min_crop_size, self.max_crop_size)
            y, x = picture.height - size, picture.width - size
            if self.rand_crop:
                y, x = rng.randint(0, y), rng.randint(0, x)
            else:
                y, x = y // 2, x // 2
            return picture.resize(target, self._filter((size, size), target, rng), box=(x, y, x + size, y + size))
        # Center (or random) crop, first enlarging an image smaller than the output.
        resample = self._filter(picture.size, target, rng)
        if picture.height < self.height:
            picture = picture.resize((int(self.height / picture.height * picture.width), self.height), resample)
        if picture.width < self.width:
            picture = picture.resize((self.width, int(self.width / picture.width * picture.height)), resample)
        if picture.height < self.height or picture.width < self.width:
            raise MXNetError("ImageRecordIter: image of %dx%d is smaller than data_shape %dx%d"
                             % (picture.width, picture.height, self.width, self.height))
        y, x = picture.height - self.height, picture.width - self.width
        if self.rand_crop:
            y, x = rng.randint(0, y), rng.randint(0, x)
        else:
            y, x = y // 2, x // 2
        if (x, y, picture.width, picture.height) == (0, 0, self.width, self.height):
            return picture
        return picture.crop((x, y, x + self.width, y + self.height))

    def _color(self, pixels, rng):
        """Brightness, contrast and saturation jitter (in random order) and PCA lighting noise,
        on (H, W, C) uint8 RGB pixels."""
        if self.brightness > 0 or self.contrast > 0 or self.saturation > 0:
            alpha_b = 1.0 + rng.uniform(-self.brightness, self.brightness)
            alpha_c = 1.0 + rng.uniform(-self.contrast, self.contrast)
            alpha_s = 1.0 + rng.uniform(-self.saturation, self.saturation)
            order = [0, 1, 2]
            rng.shuffle(order)
            # MXNet converts its BGR image with OpenCV's RGB->gray weights, so blue gets
            # 0.299 and red 0.114; kept for identical results.
            weights = np.array([0.114, 0.587, 0.299], dtype=np.float32)
            for step in order:
                if step == 0:
                    pixels = np.clip(np.rint(pixels * alpha_b), 0, 255).astype(np.uint8)
                elif step == 1:
                    gray_mean = float(np.rint(pixels.astype(np.float32) @ weights).mean())
                    pixels = np.clip(np.rint(pixels * alpha_c + (1 - alpha_c) * gray_mean), 0, 255).astype(np.uint8)
                else:
                    gray = np.rint(pixels.astype(np.float32) @ weights)[:, :, None]
                    pixels = np.clip(np.rint(pixels * alpha_s + gray * (1 - alpha_s)), 0, 255).astype(np.uint8)
        if self.pca_noise > 0 and pixels.shape[2] >= 3:
            alpha = np.array([rng.gauss(0, self.pca_noise) for _ in range(3)], dtype=np.float32)
            shift = (_PCA_EIGVEC @ alpha).astype(np.int32)
            pixels = pixels.astype(np.int32)
            pixels[:, :, :3] += shift
            pixels = np.clip(pixels, 0, 255).astype(np.uint8)
        return pixels

    def labels_of(self, header, offset):
        if self.image_labels is not None:
            try:
                return self.image_labels[header.id]
            except KeyError:
                raise MXNetError("ImageRecordIter: image index %d (record at byte %d) is not in path_imglist"
                                 % (header.id, offset)) from None
        if header.flag > 0:
            if header.flag != self.label_width:
                raise MXNetError("ImageRecordIter: the rec file provides a %d-dimensional label but label_width "
                                 "is set to %d" % (header.flag, self.label_width))
            return header.label
        if self.label_width != 1:
            raise MXNetError("ImageRecordIter: label_width must be 1 unless an imglist is provided or the rec file "
                             "is packed with multi dimensional label")
        return header.label

    def __call__(self, raw, rng, data_out, label_out, offset):
        """Decode ``raw`` (the record at byte ``offset``) into ``data_out`` (C, H, W) and
        ``label_out``; returns the image index of its header."""
        header, encoded = recordio.unpack(raw)
        label_out[...] = self.labels_of(header, offset)
        Image = _pillow()
        try:
            with Image.open(_io.BytesIO(encoded)) as picture:
                picture.load()
                if picture.mode != self.mode:
                    if self.channels == 4 and "A" not in picture.mode and "transparency" not in picture.info:
                        raise MXNetError("ImageRecordIter: data_shape asks for 4 channels but image %d has none"
                                         " (mode %s)" % (header.id, picture.mode))
                    picture = picture.convert(self.mode)
                picture = self._geometry(picture, rng)
                pixels = np.asarray(picture)
        except (OSError, ValueError, SyntaxError) as e:
            raise MXNetError("ImageRecordIter: cannot decode image %d (record at byte %d): %s"
                             % (header.id, offset, e)) from e
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        pixels = self._color(pixels, rng)
        chw = pixels.transpose(2, 0, 1)
        if (self.rand_mirror and rng.random() < 0.5) or self.mirror:
            chw = chw[:, :, ::-1]
        if self.out_dtype == np.uint8:
            data_out[...] = chw
        elif self.out_dtype == np.int8:
            data_out[...] = np.clip(chw.astype(np.int16) - np.rint(self.mean).astype(np.int16)[:, None, None],
                                    -128, 127)
        else:
            contrast, illumination = self.scale, 0.0
            if self.max_random_contrast > 0:
                contrast *= rng.uniform(1 - self.max_random_contrast, 1 + self.max_random_contrast)
            if self.max_random_illumination > 0:
                illumination = rng.uniform(-self.max_random_illumination, self.max_random_illumination) * self.scale
            np.subtract(chw, self.mean[:, None, None], out=data_out)
            data_out *= (contrast / self.std)[:, None, None]
            if illumination:
                data_out += (illumination / self.std)[:, None, None]
        return header.id


class _RecordLoader:
    """Reads a record by offset and decodes it into a batch slot; the pool's tasks hold this,
    not the iterator, so the iterator is never finalized on a pool thread."""

    def __init__(self, path, record_ends, augment):
        self.path = path
        self.record_ends = record_ends
        self.augment = augment
        # os.pread takes its offset explicitly, so the threads share one descriptor safely.
        self.fd = os.open(path, os.O_RDONLY)

    def __del__(self):
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)

    def read(self, offset):
        raw = os.pread(self.fd, self.record_ends[offset] - offset, offset)
        record = recordio.read_record_at(_io.BytesIO(raw).read,
                                         lambda: "'%s' (record at byte %d)" % (self.path, offset))
        if record is None:
            raise MXNetError("Invalid RecordIO file '%s': no record at byte %d" % (self.path, offset))
        return record

    def __call__(self, offset, sample_seed, data_out, label_out, index_out, slot):
        rng = random.Random(sample_seed)
        offset = int(offset)
        index_out[slot] = self.augment(self.read(offset), rng, data_out[slot], label_out[slot], offset)


class ImageRecordIter(DataIter):
    """Iterates over an image RecordIO file (made with ``im2rec`` or ``mx.recordio.pack_img``)
    in batches of decoded, augmented images, as MXNet's ``mx.io.ImageRecordIter``.

    Parameters (MXNet's names and defaults)
    ----------
    path_imgrec : str
        The .rec file.
    data_shape : tuple of int
        (channels, height, width) of each output image; channels 1 (gray), 3 (RGB) or 4 (RGBA).
    batch_size : int
    label_width : int, default 1
        Labels per image. The label array is (batch_size,) for 1 and (batch_size, label_width) otherwise.
    path_imgidx : str, optional
        The .idx file; with it, parts are split by record count instead of by bytes.
    path_imglist : str, optional
        An im2rec .lst file whose labels replace those of the records.
    shuffle : bool, default False
        Visit the records of this part in a new random order each epoch.
    seed : int, default 0
        Seed of the shuffle and of the augmentations.
    part_index, num_parts : int, default 0, 1
        Read only part ``part_index`` of ``num_parts`` (for distributed training).
    round_batch : bool, default True
        Fill the last batch with images from the start of the next epoch (which then begins after
        them); otherwise the last batch is zero-filled. ``pad`` counts the filled-in images.
    preprocess_threads : int, default 4
        Threads that decode and augment.
    prefetch_buffer : int, default 4
        Batches prepared ahead.
    dtype : {None, 'float32', 'uint8', 'int8'}
        Output type: float32 (normalized), uint8 (raw pixels) or int8 (pixels minus the rounded mean).
    resize : int, default -1
        Resize the shorter edge to this before cropping.
    rand_crop, random_resized_crop, min_random_area, max_random_area, max_aspect_ratio,
    min_aspect_ratio, max_crop_size, min_crop_size, inter_method, pad, fill_value : augmentation
        As MXNet's default augmenter.
    brightness, contrast, saturation, pca_noise : float, default 0
        Color jitter.
    rand_mirror, mirror : bool
        Mirror at random with probability 0.5, or always.
    mean_r, mean_g, mean_b, mean_a, std_r, std_g, std_b, std_a, scale : float
        Output = (pixel - mean) * scale / std per channel.
    max_random_contrast, max_random_illumination : float, default 0
        Random contrast factor and offset applied with the normalization.
    seed_aug : int, optional
        Seed for the augmentations only.
    data_name, label_name : str, default 'data', 'softmax_label'
        Names in ``provide_data`` / ``provide_label``.
    """

    def __init__(self, path_imgrec, data_shape, batch_size, label_width=1, path_imgidx="", path_imglist="",
                 shuffle=False, seed=0, part_index=0, num_parts=1, round_batch=True, preprocess_threads=4,
                 prefetch_buffer=4, dtype=None, resize=-1, rand_crop=False, random_resized_crop=False,
                 min_random_area=1.0, max_random_area=1.0, max_aspect_ratio=0.0, min_aspect_ratio=None,
                 max_crop_size=-1, min_crop_size=-1, inter_method=1, pad=0, fill_value=255, brightness=0.0,
                 contrast=0.0, saturation=0.0, pca_noise=0.0, rand_mirror=False, mirror=False, mean_r=0.0,
                 mean_g=0.0, mean_b=0.0, mean_a=0.0, std_r=1.0, std_g=1.0, std_b=1.0, std_a=1.0, scale=1.0,
                 max_random_contrast=0.0, max_random_illumination=0.0, seed_aug=None, data_name="data",
                 label_name="softmax_label", **kwargs):
        super().__init__(int(batch_size))
        options = dict(locals())
        for name, off in _UNSUPPORTED.items():
            value = kwargs.pop(name, off)
            if value != off:
                raise MXNetError("ImageRecordIter: %s=%r is not supported by oxnet (leave it at %r)"
                                 % (name, value, off))
        unknown = sorted(set(kwargs) - _IGNORED)
        if unknown:
            warnings.warn("ImageRecordIter ignores unknown arguments %s" % ", ".join(unknown), stacklevel=2)
        if self.batch_size <= 0:
            raise MXNetError("ImageRecordIter: batch_size must be positive, got %s" % batch_size)
        if not 0 <= int(part_index) < int(num_parts):
            raise MXNetError("ImageRecordIter: part_index %s must be in [0, num_parts=%s)" % (part_index, num_parts))
        if int(label_width) < 1:
            raise MXNetError("ImageRecordIter: label_width must be at least 1, got %s" % label_width)
        self.data_shape = _shape3(data_shape)
        self.label_width = int(label_width)
        self.round_batch = bool(round_batch)
        self._dtype = np.dtype("float32" if dtype is None else dtype)
        if self._dtype not in (np.float32, np.uint8, np.int8):
            raise MXNetError("ImageRecordIter: dtype must be float32, uint8 or int8, got %s" % self._dtype)
        path_imgrec = os.fspath(path_imgrec)
        if not os.path.isfile(path_imgrec):
            raise MXNetError("ImageRecordIter: path_imgrec '%s' is not a file" % path_imgrec)
        image_labels = _read_image_list(path_imglist, self.label_width) if path_imglist else None
        augment = _Augmenter(self.data_shape, self._dtype.type, self.label_width, image_labels, options)

        file_size = os.path.getsize(path_imgrec)
        if path_imgidx:
            index = recordio.MXIndexedRecordIO(path_imgidx, path_imgrec, "r")
            offsets = np.array(sorted(index.idx.values()), dtype=np.int64)
            index.close()
            self._records = _part_of_index(offsets, int(part_index), int(num_parts))
        else:
            offsets = _record_offsets(path_imgrec)
            self._records = _part_of_file(offsets, file_size, int(part_index), int(num_parts))
        # A record ends at most where the next one starts.
        ends = np.append(offsets[1:], file_size)
        self._loader = _RecordLoader(path_imgrec, dict(zip(offsets.tolist(), ends.tolist())), augment)

        self._shuffle = bool(shuffle)
        self._order_rng = np.random.RandomState(int(seed))
        self._aug_seed = int(seed if seed_aug is None else seed_aug)
        self._samples_drawn = 0
        self._pool = ThreadPoolExecutor(max_workers=max(1, int(preprocess_threads)),
                                        thread_name_prefix="ImageRecordIter")
        self._prefetch = max(1, int(prefetch_buffer))
        self._inflight = deque()
        self._current = None

        label_shape = (self.batch_size,) if self.label_width == 1 else (self.batch_size, self.label_width)
        self.provide_data = [DataDesc(data_name, (self.batch_size,) + self.data_shape, self._dtype.type)]
        self.provide_label = [DataDesc(label_name, label_shape, np.float32)]
        self._start_epoch(None)

    @property
    def num_images(self):
        """The number of images in this part."""
        return len(self._records)

    def _new_order(self):
        if self._shuffle:
            return self._records[self._order_rng.permutation(len(self._records))]
        return self._records

    def _start_epoch(self, carried):
        """Plan the batches of an epoch: ``carried`` is (order, n) when the previous epoch's last
        batch took the first n records of this epoch's order."""
        self._cancel_inflight()
        order, skip = carried if carried is not None else (self._new_order(), 0)
        positions = order[skip:]
        full, remainder = divmod(len(positions), self.batch_size)
        plan = [(positions[i * self.batch_size:(i + 1) * self.batch_size], 0) for i in range(full)]
        self._carry = None
        if remainder:
            need = self.batch_size - remainder
            if self.round_batch:
                following = self._new_order()
                if need > len(following):
                    raise MXNetError("ImageRecordIter: this part has %d images, too few to fill a batch of %d by "
                                     "round robin" % (len(self._records), self.batch_size))
                plan.append((np.concatenate([positions[full * self.batch_size:], following[:need]]), need))
                self._carry = (following, need)
            else:
                plan.append((positions[full * self.batch_size:], need))
        self._plan = deque(plan)
        self._epoch_over = False

    def _cancel_inflight(self):
        for batch in self._inflight:
            for future in batch[3]:
                future.cancel()
        for batch in self._inflight:
            _wait_all(batch[3])
        self._inflight.clear()

    def _submit_next(self):
        offsets, pad = self._plan.popleft()
        # A new batch array each time: it becomes the NDArray without a copy, and lives as long
        # as the caller keeps the batch.
        data = np.empty((self.batch_size,) + self.data_shape, dtype=self._dtype)
        label = np.empty((self.batch_size, self.label_width), dtype=np.float32)
        index = np.empty(self.batch_size, dtype=np.uint64)
        if len(offsets) < self.batch_size:
            data[len(offsets):] = 0
            label[len(offsets):] = 0
            index[len(offsets):] = 0
        futures = []
        for slot, offset in enumerate(offsets):
            sample_seed = self._aug_seed * 1000003 + self._samples_drawn
            self._samples_drawn += 1
            futures.append(self._pool.submit(self._loader, offset, sample_seed, data, label, index, slot))
        self._inflight.append((data, label, index, futures, pad, not self._plan))

    def reset(self):
        """Start the next epoch. After an epoch whose last batch borrowed images from the next
        (``round_batch``), the next epoch begins after them, as in MXNet."""
        self._start_epoch(self._carry if self._epoch_over else None)

    def iter_next(self):
        while self._plan and len(self._inflight) < self._prefetch:
            self._submit_next()
        if not self._inflight:
            return False
        data, label, index, futures, pad, last = self._inflight.popleft()
        try:
            for future in futures:
                future.result()
        except BaseException:
            _wait_all(futures)
            raise
        label_array = label[:, 0] if self.label_width == 1 else label
        self._current = DataBatch(data=[nd.from_numpy(data, zero_copy=True)], label=[nd.array(label_array)],
                                  pad=pad, index=index, provide_data=self.provide_data,
                                  provide_label=self.provide_label)
        # The epoch is over once its last batch is out: reset() then carries on after the images
        # that batch borrowed from the next epoch.
        self._epoch_over = last
        return True

    def next(self):
        if self.iter_next():
            return self._current
        raise StopIteration

    def getdata(self):
        return self._current.data

    def getlabel(self):
        return self._current.label

    def getindex(self):
        return self._current.index

    def getpad(self):
        return self._current.pad

    def close(self):
        """Stop the decoding threads and close the file."""
        if getattr(self, "_pool", None) is not None:
            self._cancel_inflight()
            self._pool.shutdown(wait=False)
            self._pool = None

    def __del__(self):
        self.close()


def ImageRecordUInt8Iter(*args, **kwargs):
    """``ImageRecordIter`` giving raw uint8 pixels (deprecated in MXNet for ``dtype='uint8'``)."""
    kwargs["dtype"] = "uint8"
    return ImageRecordIter(*args, **kwargs)


def ImageRecordInt8Iter(*args, **kwargs):
    """``ImageRecordIter`` giving int8 pixels minus the rounded mean (``dtype='int8'``)."""
    kwargs["dtype"] = "int8"
    return ImageRecordIter(*args, **kwargs)
