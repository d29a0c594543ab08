"""Vision datasets and transforms (MXNet's ``mxnet.gluon.data.vision``)."""

from .datasets import MNIST, FashionMNIST, CIFAR10, CIFAR100, ImageFolderDataset, ImageRecordDataset
from . import transforms
