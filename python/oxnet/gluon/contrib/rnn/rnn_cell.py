"""Recurrent cells beyond those of ``gluon.rnn``."""

from .... import ndarray, symbol
from ...rnn.rnn_cell import (BidirectionalCell, LSTMCell, ModifierCell, SequentialRNNCell, _begin_state_for,
                              _format_sequence, _GatedCell, _mask_variable_length)

__all__ = ["LSTMPCell", "VariationalDropoutCell", "dynamic_unroll"]


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

    # h before its projection; the projection is the step's output (MXNet's node names).
    _hidden_name = "hidden"

    def hybrid_forward(self, F, inputs, states, i2h_weight, h2h_weight, h2r_weight, i2h_bias, h2h_bias):
        hidden, (_, next_c) = super().hybrid_forward(F, inputs, states, i2h_weight, h2h_weight, i2h_bias, h2h_bias)
        next_r = F.FullyConnected(data=hidden, weight=h2r_weight, no_bias=True, num_hidden=self._projection_size,
                                  name="t%d_out" % self._counter)
        return next_r, [next_r, next_c]


class VariationalDropoutCell(ModifierCell):
    """Variational dropout (Gal and Ghahramani, 2016) around ``base_cell``: one dropout mask per
    sequence for the inputs (``drop_inputs``), the first state (``drop_states``) and the outputs
    (``drop_outputs``), reused at every step instead of drawn anew. Masks are drawn at the first
    step and kept until ``reset()``, which ``unroll`` calls; a caller stepping the cell by hand
    calls it between sequences. Without state dropout ``unroll`` drops inputs and outputs of the
    whole sequence at once (one Dropout over every step, its mask shared along time)."""

    def __init__(self, base_cell, drop_inputs=0.0, drop_states=0.0, drop_outputs=0.0):
        if drop_states and (isinstance(base_cell, BidirectionalCell)
                            or isinstance(base_cell, SequentialRNNCell)
                            and any(isinstance(c, BidirectionalCell) for c in base_cell._children.values())):
            raise AssertionError("A bidirectional cell has no single recurrent state for variational state "
                                 "dropout; wrap the cells underneath in VariationalDropoutCell instead.")
        super().__init__(base_cell)
        self.drop_inputs, self.drop_states, self.drop_outputs = drop_inputs, drop_states, drop_outputs
        self._masks = {}

    def __repr__(self):
        return "%s(p_in=%s, p_state=%s, p_out=%s, %s)" % (self.__class__.__name__, self.drop_inputs,
                                                          self.drop_states, self.drop_outputs, self.base_cell)

    def _alias(self):
        return "vardrop"

    def reset(self):
        super().reset()
        self._masks = {}

    def _dropped(self, F, what, rate, value):
        """``value`` times this sequence's mask for ``what`` (drawn on first use)."""
        if not rate:
            return value
        if what not in self._masks:
            self._masks[what] = F.Dropout(F.ones_like(value), p=rate)
        return value * self._masks[what]

    def hybrid_forward(self, F, inputs, states):
        states = list(states)
        if states:
            # Only the first state (h) is fed back through the recurrent weights.
            states[0] = self._dropped(F, "states", self.drop_states, states[0])
        output, next_states = self.base_cell(self._dropped(F, "inputs", self.drop_inputs, inputs), states)
        return self._dropped(F, "outputs", self.drop_outputs, output), next_states

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None, valid_length=None):
        if self.drop_states:
            return super().unroll(length, inputs, begin_state, layout, merge_outputs, valid_length=valid_length)
        self.reset()
        inputs, axis, F, batch_size = _format_sequence(length, inputs, layout, True)
        states = _begin_state_for(self, F, begin_state, inputs, batch_size)
        if self.drop_inputs:
            inputs = F.Dropout(inputs, p=self.drop_inputs, axes=(axis,))
        outputs, states = self.base_cell.unroll(length, inputs, states, layout, merge_outputs=True,
                                                valid_length=valid_length)
        if self.drop_outputs:
            outputs = F.Dropout(outputs, p=self.drop_outputs, axes=(axis,))
        # The base cell's outputs come merged: None keeps them so.
        merge = True if merge_outputs is None else merge_outputs
        outputs, _, _, _ = _format_sequence(length, outputs, layout, merge)
        if valid_length is not None:
            outputs = _mask_variable_length(F, outputs, length, valid_length, axis, merge)
        return outputs, states


def dynamic_unroll(cell, inputs, begin_state, drop_inputs=0, drop_outputs=0, layout="TNC", valid_length=None):
    """Run ``cell`` over the time axis of ``inputs`` with ``F.contrib.foreach`` (one loop node in a
    hybridized graph, however long the sequence) instead of unrolling it step by step. With
    ``valid_length`` each sequence's states stop changing after its last step (the returned states
    are those there) and its outputs past it are zero. ``drop_inputs``/``drop_outputs`` apply
    dropout with one mask along time. Returns ``(outputs, states)``, outputs in ``layout``."""
    from ....ndarray import NDArray

    F = ndarray if isinstance(inputs, NDArray) else symbol
    if layout not in ("TNC", "NTC"):
        raise ValueError("dynamic_unroll: layout must be 'TNC' or 'NTC', got %r" % (layout,))
    if layout == "NTC":
        inputs = F.swapaxes(inputs, dim1=0, dim2=1)
    if drop_inputs:
        inputs = F.Dropout(inputs, p=drop_inputs, axes=(0,))
    states = list(begin_state)
    if valid_length is None:
        outputs, states = F.contrib.foreach(lambda data, previous: cell(data, previous), inputs, states)
    else:
        def step(data, loop_state):
            previous, time = loop_state[:-1], loop_state[-1]
            output, new_states = cell(data, previous)
            # Sequences already past their end keep the states they had there.
            running = F.broadcast_greater(valid_length, time)
            kept = [F.where(running, new, old) for new, old in zip(new_states, previous)]
            return output, kept + [time + 1]

        outputs, states = F.contrib.foreach(step, inputs, states + [F.zeros((1,))])
        states = states[:-1]
        outputs = F.SequenceMask(outputs, sequence_length=valid_length, use_sequence_length=True, axis=0)
    if drop_outputs:
        outputs = F.Dropout(outputs, p=drop_outputs, axes=(0,))
    if layout == "NTC":
        outputs = F.swapaxes(outputs, dim1=0, dim2=1)
    return outputs, states
