"""Contributed Gluon components (MXNet's ``mxnet.gluon.contrib``): extra layers, data samplers and
automatic bucketing, the LSTMP cell and the ``Estimator`` training loop."""

from . import nn
from . import data
from . import estimator
from . import rnn
