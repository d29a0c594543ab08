"""Vision datasets and transforms (MXNet's ``mxnet.gluon.data.vision``)."""

from .datasets import MNIST, FashionMNIST, CIFAR10
from . import transforms
