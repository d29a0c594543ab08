"""Image datasets read from local files (oxnet never downloads)."""

import gzip
import os
import struct

import numpy as np

from ..dataset import Dataset


def _find(root, names):
    for name in names:
        for candidate in (name, name + ".gz"):
            path = os.path.join(root, candidate)
            if os.path.exists(path):
                return path
    return None


class _ImageDataset(Dataset):
    def __init__(self, transform):
        self._transform = transform
        self._data = None
        self._label = None

    def __getitem__(self, idx):
        if self._transform is not None:
            return self._transform(self._data[idx], self._label[idx])
        return self._data[idx], self._label[idx]

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
