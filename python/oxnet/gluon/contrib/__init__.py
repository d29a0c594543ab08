"""Contributed Gluon layers (MXNet's ``mxnet.gluon.contrib``)."""

from . import nn
