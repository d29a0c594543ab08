"""Contributed features (MXNet's ``mxnet.contrib``)."""

from . import autograd
from . import onnx
