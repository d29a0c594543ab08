"""``ImageIter``: MXNet's Python image iterator over a .rec file, an image list file or a list
of (label, path) items, with ``mx.image`` augmenters. (``mx.io.ImageRecordIter`` is the fast,
multi-threaded iterator for .rec files.)"""

import logging
import os
import random

from .. import io
from .. import ndarray as nd
from .. import recordio
from ..base import numeric_types
from .image import CreateAugmenter, imdecode

__all__ = ["ImageIter"]


class ImageIter(io.DataIter):
    """Batches of augmented images (float32, (batch, 3, height, width)) with their labels.

    Parameters
    ----------
    batch_size : int
    data_shape : tuple
        (3, height, width).
    label_width : int, default 1
    path_imgrec : str
        An image RecordIO file; images are read in file order unless an index is given.
    path_imglist : str
        An im2rec list file (index, labels..., relative path), with ``path_root``. With
        ``path_imgrec`` too, its labels replace the records' own.
    path_root : str
        The folder the list's paths are relative to.
    path_imgidx : str
        The index of ``path_imgrec``, needed to shuffle or split it into parts.
    shuffle : bool
        Visit the images in a new random order each epoch (Python's ``random``).
    part_index, num_parts : int
        Read only part ``part_index`` of ``num_parts`` (equal parts; the remainder is dropped).
    aug_list : list of Augmenter, optional
        Defaults to ``CreateAugmenter(data_shape, **kwargs)``.
    imglist : list, optional
        Items ``[label or labels, path]`` (instead of a list file).
    data_name, label_name : str
    dtype : str
        Label dtype: float32, float64, int32 or int64.
    last_batch_handle : {'pad', 'discard', 'roll_over'}
        'pad' fills the last batch with images from the start, 'discard' drops it, 'roll_over'
        keeps its images for the first batch of the next epoch.
    """

    def __init__(self, batch_size, data_shape, label_width=1, path_imgrec=None, path_imglist=None, path_root=None,
                 path_imgidx=None, shuffle=False, part_index=0, num_parts=1, aug_list=None, imglist=None,
                 data_name="data", label_name="softmax_label", dtype="float32", last_batch_handle="pad", **kwargs):
        super().__init__(batch_size)
        if not (path_imgrec or path_imglist or isinstance(imglist, list)):
            raise ValueError("ImageIter needs path_imgrec, path_imglist or imglist")
        if dtype not in ("int32", "float32", "int64", "float64"):
            raise ValueError("%s label not supported" % dtype)
        if last_batch_handle not in ("pad", "discard", "roll_over"):
            raise ValueError("last_batch_handle must be 'pad', 'discard' or 'roll_over', got %r" % last_batch_handle)
        self.imgrec = None
        self.imgidx = None
        if path_imgrec:
            logging.info("%s: loading recordio %s...", type(self).__name__, path_imgrec)
            if path_imgidx:
                self.imgrec = recordio.MXIndexedRecordIO(path_imgidx, path_imgrec, "r")
                self.imgidx = list(self.imgrec.keys)
            else:
                self.imgrec = recordio.MXRecordIO(path_imgrec, "r")
        keys = None
        self.imglist = None
        if path_imglist:
            self.imglist, keys = {}, []
            with open(path_imglist) as f:
                for line in f:
                    fields = line.strip().split("\t")
                    if fields == [""]:
                        continue
                    key = int(fields[0])
                    self.imglist[key] = (nd.array(fields[1:-1], dtype=dtype), fields[-1])
                    keys.append(key)
        elif isinstance(imglist, list):
            self.imglist, keys = {}, []
            for number, item in enumerate(imglist, 1):
                if len(item) > 2:
                    label = nd.array(item[:-1], dtype=dtype)
                elif isinstance(item[0], numeric_types):
                    label = nd.array([item[0]], dtype=dtype)
                else:
                    label = nd.array(item[0], dtype=dtype)
                self.imglist[str(number)] = (label, item[-1])
                keys.append(str(number))
        self.path_root = path_root
        self.check_data_shape(data_shape)
        self.data_shape = tuple(data_shape)
        self.label_width = label_width
        self.provide_data = [io.DataDesc(data_name, (batch_size,) + self.data_shape)]
        label_shape = (batch_size, label_width) if label_width > 1 else (batch_size,)
        self.provide_label = [io.DataDesc(label_name, label_shape)]
        self.shuffle = shuffle
        if self.imgrec is None:
            self.seq = keys
        elif shuffle or num_parts > 1 or path_imgidx:
            if self.imgidx is None:
                raise ValueError("ImageIter needs path_imgidx to shuffle or split a .rec file")
            self.seq = self.imgidx
        else:
            self.seq = None
        if num_parts > 1:
            if not 0 <= part_index < num_parts:
                raise ValueError("part_index %d must be in [0, num_parts=%d)" % (part_index, num_parts))
            per_part = len(self.seq) // num_parts
            self.seq = self.seq[part_index * per_part:(part_index + 1) * per_part]
        self.auglist = CreateAugmenter(data_shape, **kwargs) if aug_list is None else aug_list
        self.cur = 0
        self._allow_read = True
        self.last_batch_handle = last_batch_handle
        self.num_image = len(self.seq) if self.seq is not None else None
        self._cache_data = None
        self._cache_label = None
        self._cache_idx = None
        self.reset()

    def reset(self):
        """Start a new epoch (a rolled-over partial batch is kept for its first batch)."""
        if self.seq is not None and self.shuffle:
            random.shuffle(self.seq)
        if self.last_batch_handle != "roll_over" or self._cache_data is None:
            if self.imgrec is not None:
                self.imgrec.reset()
            self.cur = 0
            self._allow_read = True

    def hard_reset(self):
        """Start a new epoch, dropping a rolled-over partial batch."""
        if self.seq is not None and self.shuffle:
            random.shuffle(self.seq)
        if self.imgrec is not None:
            self.imgrec.reset()
        self.cur = 0
        self._allow_read = True
        self._cache_data = None
        self._cache_label = None
        self._cache_idx = None

    def next_sample(self):
        """(label, encoded image bytes) of the next image; StopIteration at the end of the data."""
        if not self._allow_read:
            raise StopIteration
        if self.seq is None:
            record = self.imgrec.read()
            if record is None:
                if self.last_batch_handle != "discard":
                    self.imgrec.reset()
                raise StopIteration
            header, img = recordio.unpack(record)
            return header.label, img
        if self.cur >= self.num_image:
            if self.last_batch_handle != "discard":
                self.cur = 0
            raise StopIteration
        idx = self.seq[self.cur]
        self.cur += 1
        if self.imgrec is not None:
            header, img = recordio.unpack(self.imgrec.read_idx(idx))
            return (header.label if self.imglist is None else self.imglist[idx][0]), img
        label, fname = self.imglist[idx]
        return label, self.read_image(fname)

    def _batchify(self, batch_data, batch_label, start=0):
        """Fill the batch from slot ``start``; the number of slots filled."""
        filled = start
        try:
            while filled < self.batch_size:
                label, encoded = self.next_sample()
                data = self.imdecode(encoded)
                try:
                    self.check_valid_image(data)
                except RuntimeError as e:
                    logging.debug("Invalid image, skipping: %s", e)
                    continue
                batch_data[filled] = self.postprocess_data(self.augmentation_transform(data))
                batch_label[filled] = label
                filled += 1
        except StopIteration:
            if not filled:
                raise
        return filled

    def next(self):
        if self._cache_data is not None:
            batch_data, batch_label, filled = self._cache_data, self._cache_label, self._cache_idx
        else:
            batch_data = nd.zeros((self.batch_size,) + self.data_shape)
            batch_label = nd.empty(self.provide_label[0].shape)
            filled = self._batchify(batch_data, batch_label)
        pad = self.batch_size - filled
        if pad:
            if self.last_batch_handle == "discard":
                raise StopIteration
            if self.last_batch_handle == "roll_over" and self._cache_data is None:
                self._cache_data, self._cache_label, self._cache_idx = batch_data, batch_label, filled
                raise StopIteration
            self._batchify(batch_data, batch_label, filled)
            if self.last_batch_handle == "pad":
                self._allow_read = False
            else:
                self._cache_data = self._cache_label = self._cache_idx = None
        return io.DataBatch([batch_data], [batch_label], pad=pad)

    def check_data_shape(self, data_shape):
        """ValueError unless ``data_shape`` is (3, height, width)."""
        if len(data_shape) != 3:
            raise ValueError("data_shape should have length 3, with dimensions CxHxW")
        if data_shape[0] != 3:
            raise ValueError("This iterator expects inputs to have 3 channels.")

    def check_valid_image(self, data):
        """RuntimeError for an image with no pixels."""
        if len(data[0].shape) == 0:
            raise RuntimeError("Data shape is wrong")

    def imdecode(self, s):
        """Decode one image, naming it in the error when it is broken."""
        try:
            return imdecode(s)
        except Exception as e:
            if self.seq is not None:
                where = self.seq[(self.cur % self.num_image) - 1]
                where = ("filename: %s" % self.imglist[where][1]) if self.imglist is not None else "index: %s" % where
            else:
                where = "record after the last one read"
            raise RuntimeError("Broken image %s, %s" % (where, e)) from e

    def read_image(self, fname):
        """The bytes of image file ``fname`` under ``path_root``."""
        with open(os.path.join(self.path_root, fname), "rb") as f:
            return f.read()

    def augmentation_transform(self, data):
        """Apply the augmenters in order."""
        for aug in self.auglist:
            data = aug(data)
        return data

    def postprocess_data(self, datum):
        """(H, W, C) to (C, H, W)."""
        return nd.transpose(datum, axes=(2, 0, 1))
