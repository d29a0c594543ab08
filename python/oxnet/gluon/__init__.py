"""Gluon, MXNet's imperative-and-hybrid API (``mxnet.gluon``)."""

from .parameter import Parameter, Constant, ParameterDict, DeferredInitializationError
from .block import Block, HybridBlock, SymbolBlock
from .trainer import Trainer
from . import nn
from . import rnn
from . import loss
from . import utils
from . import data
from . import contrib
from . import model_zoo
