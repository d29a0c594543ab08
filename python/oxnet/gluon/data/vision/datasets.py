"""Image datasets read from local files (oxnet never downloads)."""

import gzip
import os
import struct
import warnings

import numpy as np

from .... import image, ndarray, recordio
from ..dataset import Dataset, RecordFileDataset

__all__ = ["MNIST", "FashionMNIST", "CIFAR10", "CIFAR100", "ImageFolderDataset", "ImageRecordDataset"]


def _find(root, names):
    for name in names:
        for candidate in (name, name + ".gz"):
            path = os.path.join(root, candidate)
            if os.path.exists(path):
                return path
    return None


class _ImageDataset(Dataset):
    """Images held as one uint8 NumPy array (N, H, W, C); samples are (uint8 NDArray image,
    int32 label), as MXNet's datasets give them."""

    def __init__(self, transform):
        self._transform = transform
        self._data = None
        self._label = None

    def __getitem__(self, idx):
        sample = ndarray.array(self._data[idx], dtype=np.uint8)
        if self._transform is not None:
            return self._transform(sample, self._label[idx])
        return sample, self._label[idx]

    def __len__(self):
        return len(self._label)


class MNIST(_ImageDataset):
    """MNIST from its idx files in ``root`` (``train-images-idx3-ubyte[.gz]`` and friends).
    Samples are (28, 28, 1) uint8 images with int32 labels."""

    _files = {True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
              False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
    _name = "mnist"

    def __init__(self, root=os.path.join("~", ".mxnet", "datasets", "mnist"), train=True, transform=None):
        super().__init__(transform)
        root = os.path.expanduser(root)
        images, labels = self._files[train]
        image_path, label_path = _find(root, [images]), _find(root, [labels])
        if image_path is None or label_path is None:
            raise FileNotFoundError(
                "%s files not found: put %s and %s (optionally gzipped) in %s. oxnet does not download datasets."
                % (self._name, images, labels, root))
        self._label = self._read_idx(label_path).astype(np.int32)
        self._data = self._read_idx(image_path).reshape(-1, 28, 28, 1)

    @staticmethod
    def _read_idx(path):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            _, _, dtype_code, ndim = struct.unpack(">BBBB", f.read(4))
            dims = struct.unpack(">" + "I" * ndim, f.read(4 * ndim))
            if dtype_code != 0x08:
                raise ValueError("%s: expected unsigned byte data" % path)
            return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


class FashionMNIST(MNIST):
    """Fashion-MNIST, in MNIST's file format."""

    _name = "fashion-mnist"

    def __init__(self, root=os.path.join("~", ".mxnet", "datasets", "fashion-mnist"), train=True, transform=None):
        super().__init__(root, train, transform)


class CIFAR10(_ImageDataset):
    """CIFAR-10 from its binary batches in ``root`` (``data_batch_1.bin`` ... ``test_batch.bin``).
    Samples are (32, 32, 3) uint8 images with int32 labels."""

    def __init__(self, root=os.path.join("~", ".mxnet", "datasets", "cifar10"), train=True, transform=None):
        super().__init__(transform)
        root = os.path.expanduser(root)
        names = ["data_batch_%d.bin" % i for i in range(1, 6)] if train else ["test_batch.bin"]
        paths = [os.path.join(root, n) for n in names]
        missing = [p for p in paths if not os.path.exists(p)]
        if missing:
            raise FileNotFoundError("CIFAR-10 files not found: put %s in %s (the binary version). oxnet does not "
                                    "download datasets." % (", ".join(names), root))
        records = np.concatenate([np.fromfile(p, dtype=np.uint8).reshape(-1, 3073) for p in paths])
        self._label = records[:, 0].astype(np.int32)
        self._data = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)


class CIFAR100(CIFAR10):
    """CIFAR-100 from its binary files in ``root`` (``train.bin``, ``test.bin``). Samples are
    (32, 32, 3) uint8 images with int32 labels: the 100 fine classes with ``fine_label=True``,
    else the 20 coarse ones."""

    def __init__(self, root=os.path.join("~", ".mxnet", "datasets", "cifar100"), fine_label=False, train=True,
                 transform=None):
        _ImageDataset.__init__(self, transform)
        root = os.path.expanduser(root)
        name = "train.bin" if train else "test.bin"
        path = os.path.join(root, name)
        if not os.path.exists(path):
            raise FileNotFoundError("CIFAR-100 file not found: put %s in %s (the binary version). oxnet does not "
                                    "download datasets." % (name, root))
        # Each record: coarse label, fine label, then 3 x 32 x 32 pixels.
        records = np.fromfile(path, dtype=np.uint8).reshape(-1, 3074)
        self._label = records[:, 1 if fine_label else 0].astype(np.int32)
        self._data = records[:, 2:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)


class ImageFolderDataset(Dataset):
    """Images in class folders: ``root/<class>/<image>.jpg``. Classes are the sorted folder names
    (``synsets``), labelled 0, 1, ...; ``items`` lists (file name, label). JPEG and PNG files are
    read with ``mx.image.imread(file, flag)`` (flag 1: color, 0: grayscale)."""

    _extensions = (".jpg", ".jpeg", ".png")

    def __init__(self, root, flag=1, transform=None):
        self._root = os.path.expanduser(root)
        self._flag = flag
        self._transform = transform
        self.synsets = []
        self.items = []
        for folder in sorted(os.listdir(self._root)):
            path = os.path.join(self._root, folder)
            if not os.path.isdir(path):
                warnings.warn("Ignoring %s, which is not a directory." % path, stacklevel=2)
                continue
            label = len(self.synsets)
            self.synsets.append(folder)
            for filename in sorted(os.listdir(path)):
                filename = os.path.join(path, filename)
                extension = os.path.splitext(filename)[1]
                if extension.lower() not in self._extensions:
                    warnings.warn("Ignoring %s of type %s. Only support %s"
                                  % (filename, extension, ", ".join(self._extensions)), stacklevel=2)
                    continue
                self.items.append((filename, label))

    def __getitem__(self, idx):
        img = image.imread(self.items[idx][0], self._flag)
        label = self.items[idx][1]
        if self._transform is not None:
            return self._transform(img, label)
        return img, label

    def __len__(self):
        return len(self.items)


class ImageRecordDataset(RecordFileDataset):
    """The images of an image RecordIO file (``name.rec`` with ``name.idx``): samples are
    (uint8 NDArray image (H, W, C), label from the record header). ``flag`` 1 decodes color,
    0 grayscale."""

    def __init__(self, filename, flag=1, transform=None):
        super().__init__(filename)
        self._flag = flag
        self._transform = transform

    def __getitem__(self, idx):
        header, encoded = recordio.unpack(super().__getitem__(idx))
        img = image.imdecode(encoded, self._flag)
        if self._transform is not None:
            return self._transform(img, header.label)
        return img, header.label
