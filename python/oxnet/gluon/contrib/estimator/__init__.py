"""High-level training loop for Gluon (MXNet's ``mxnet.gluon.contrib.estimator``): an
``Estimator`` drives fit/evaluate over a ``DataLoader`` and calls event handlers at the
begin/end of training, epochs and batches."""

from . import batch_processor, estimator, event_handler
from .batch_processor import *
from .estimator import *
from .event_handler import *
