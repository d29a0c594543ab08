"""Contributed recurrent cells (MXNet's ``mxnet.gluon.contrib.rnn``)."""

from .rnn_cell import LSTMPCell, VariationalDropoutCell

__all__ = ["LSTMPCell", "VariationalDropoutCell"]
