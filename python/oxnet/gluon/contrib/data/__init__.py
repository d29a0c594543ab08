"""Contributed data utilities (MXNet's ``mxnet.gluon.contrib.data``) and oxnet's automatic bucketing of
variable-length sequences (``bucketing``)."""

from . import bucketing
from .bucketing import BucketedBatches
from .sampler import IntervalSampler
