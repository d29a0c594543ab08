"""Contributed neural-network layers (MXNet's ``mxnet.gluon.contrib.nn``)."""

from .basic_layers import *
from .basic_layers import __all__
