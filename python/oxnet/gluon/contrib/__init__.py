"""Contributed Gluon components (MXNet's ``mxnet.gluon.contrib``): extra layers, data samplers
and the ``Estimator`` training loop."""

from . import nn
from . import data
from . import estimator
