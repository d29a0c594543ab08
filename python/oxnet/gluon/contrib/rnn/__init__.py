"""Contributed recurrent cells (MXNet's ``mxnet.gluon.contrib.rnn``)."""

from . import conv_rnn_cell, rnn_cell
from .conv_rnn_cell import *  # noqa: F401,F403
from .rnn_cell import LSTMPCell, VariationalDropoutCell

__all__ = conv_rnn_cell.__all__ + ["LSTMPCell", "VariationalDropoutCell"]
