"""Recurrent cells beyond those of ``gluon.rnn``."""

from ...rnn.rnn_cell import LSTMCell, _GatedCell

__all__ = ["LSTMPCell"]


class LSTMPCell(LSTMCell):
    """LSTM cell with a projected hidden state (LSTMP, Sak et al. 2014): the LSTM's output
    ``o * tanh(c)`` is projected to ``projection_size`` values by ``h2r_weight`` (no bias); the
    projection is the output and the recurrent state, the cell keeps ``hidden_size`` values.
    States ``[r, c]``. One step of ``gluon.rnn.LSTM(..., projection_size=...)``."""

    def __init__(self, hidden_size, projection_size, i2h_weight_initializer=None, h2h_weight_initializer=None,
                 h2r_weight_initializer=None, i2h_bias_initializer="zeros", h2h_bias_initializer="zeros",
                 input_size=0, prefix=None, params=None):
        _GatedCell.__init__(self, hidden_size, 4, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                            h2h_bias_initializer, input_size, prefix, params, recurrent_size=projection_size)
        self._activation = "tanh"
        self._recurrent_activation = "sigmoid"
        self._projection_size = projection_size
        self.h2r_weight = self.params.get("h2r_weight", shape=(projection_size, hidden_size),
                                          init=h2r_weight_initializer, allow_deferred_init=True)

    def state_info(self, batch_size=0):
        return [{"shape": (batch_size, self._projection_size), "__layout__": "NC"},
                {"shape": (batch_size, self._hidden_size), "__layout__": "NC"}]

    def _alias(self):
        return "lstmp"

    def __repr__(self):
        shape = self.i2h_weight.shape
        return "%s(%s -> %d -> %d)" % (self.__class__.__name__, shape[1] if shape[1] else None, shape[0],
                                       self._projection_size)

    def hybrid_forward(self, F, inputs, states, i2h_weight, h2h_weight, h2r_weight, i2h_bias, h2h_bias):
        hidden, (_, next_c) = super().hybrid_forward(F, inputs, states, i2h_weight, h2h_weight, i2h_bias, h2h_bias)
        next_r = F.FullyConnected(data=hidden, weight=h2r_weight, no_bias=True, num_hidden=self._projection_size,
                                  name="t%d_r" % self._counter)
        return next_r, [next_r, next_c]
