"""Symbolic recurrent networks (MXNet's ``mxnet.rnn``): step cells, their fused form, text
bucketing and RNN checkpoints."""

from . import io, rnn, rnn_cell
from .io import *  # noqa: F401,F403
from .rnn import *  # noqa: F401,F403
from .rnn_cell import *  # noqa: F401,F403
