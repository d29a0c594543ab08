"""Contributed data utilities (MXNet's ``mxnet.gluon.contrib.data``)."""

from .sampler import IntervalSampler
