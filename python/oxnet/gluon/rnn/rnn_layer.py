"""Fused recurrent layers (MXNet's ``gluon.rnn.RNN/LSTM/GRU``): all layers and directions of a
stack run as one ``RNN`` operator over the whole sequence, with MXNet 1.x's parameter names
(``l0_i2h_weight``, ``r1_h2h_bias``, ``l0_h2r_weight``, ...) concatenated into the operator's
parameter vector.

With ``use_sequence_length=True`` a call takes each sequence's length as well
(``layer(data, states, sequence_length)``): padding steps give zero outputs and no gradient, the
final states are each sequence's states at its own last step, and a bidirectional layer's reverse
direction starts at each sequence's own end, so results do not depend on the padding."""

import re

from ... import ndarray, symbol
from ...ndarray import NDArray
from ..block import HybridBlock

__all__ = ["RNN", "LSTM", "GRU"]

_GATES = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 3}
_STRUCTURAL_NAME = re.compile(r"(l|r)(\d+)_(i2h|h2h|h2r)_(weight|bias)\Z")


class _RNNLayer(HybridBlock):
    """A stack of ``num_layers`` recurrent layers (both directions when ``bidirectional``) over
    ``layout`` 'TNC' or 'NTC' data. Called with ``states=None`` it starts from zeros and returns
    only the output; given states it returns ``(output, new_states)``. With
    ``use_sequence_length`` it also takes a (batch,) ``sequence_length``."""

    def __init__(self, hidden_size, num_layers, layout, dropout, bidirectional, input_size,
                 i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer, h2h_bias_initializer,
                 mode, projection_size, lstm_state_clip_min, lstm_state_clip_max, lstm_state_clip_nan, dtype,
                 use_sequence_length=False, h2r_weight_initializer=None, **kwargs):
        super().__init__(**kwargs)
        if layout not in ("TNC", "NTC"):
            raise ValueError("Invalid layout %s; must be one of ['TNC' or 'NTC']" % layout)
        self._hidden_size = hidden_size
        self._projection_size = projection_size or None
        self._use_sequence_length = use_sequence_length
        self._num_layers = num_layers
        self._mode = mode
        self._layout = layout
        self._dropout = dropout
        self._dir = 2 if bidirectional else 1
        self._input_size = input_size
        self._lstm_state_clip_min = lstm_state_clip_min
        self._lstm_state_clip_max = lstm_state_clip_max
        self._lstm_state_clip_nan = lstm_state_clip_nan
        self._dtype = dtype
        self._gates = _GATES[mode]
        rows, inputs, state = self._gates * hidden_size, input_size, self._state_width()
        for layer in range(num_layers):
            for direction in "lr"[:self._dir]:
                name = "%s%d_" % (direction, layer)
                self._register_param(name + "i2h_weight", (rows, inputs), i2h_weight_initializer, dtype)
                self._register_param(name + "h2h_weight", (rows, state), h2h_weight_initializer, dtype)
                if self._projection_size:
                    self._register_param(name + "h2r_weight", (state, hidden_size), h2r_weight_initializer, dtype)
                self._register_param(name + "i2h_bias", (rows,), i2h_bias_initializer, dtype)
                self._register_param(name + "h2h_bias", (rows,), h2h_bias_initializer, dtype)
            inputs = state * self._dir

    def _state_width(self):
        """Width of the recurrent state and of each direction's output (LSTMP's projection)."""
        return self._projection_size or self._hidden_size

    def _register_param(self, name, shape, init, dtype):
        param = self.params.get(name, shape=shape, init=init, allow_deferred_init=True, dtype=dtype)
        setattr(self, name, param)

    def __repr__(self):
        shape = self.l0_i2h_weight.shape
        text = "%s(%s -> %d, %s" % (self.__class__.__name__, shape[1] if shape[1] else None,
                                     shape[0] // self._gates, self._layout)
        if self._num_layers != 1:
            text += ", num_layers=%d" % self._num_layers
        if self._dropout != 0:
            text += ", dropout=%s" % self._dropout
        if self._dir == 2:
            text += ", bidirectional"
        return text + ")"

    def infer_shape(self, inputs, *args):
        """Input weight shapes from the data's feature size (the graph cannot infer them: they
        reach the operator flattened and concatenated)."""
        if len(inputs.shape) != 3:
            raise ValueError("%s: input data should be 3-D (%s), got shape %s"
                             % (self.__class__.__name__, self._layout, inputs.shape))
        features = inputs.shape[2]
        for layer in range(self._num_layers):
            for direction in "lr"[:self._dir]:
                getattr(self, "%s%d_i2h_weight" % (direction, layer)).shape = (self._gates * self._hidden_size,
                                                                              features)
            features = self._state_width() * self._dir

    def _unfuse(self):
        """The same stack as recurrent cells (a ``HybridSequentialRNNCell`` of one cell, or one
        ``BidirectionalCell``, per layer, with a ``DropoutCell`` between layers), sharing this
        layer's parameters: what the fused operator computes, step by step (MXNet 1.x's
        ``_unfuse``; also for LSTMP layers, which MXNet's refuses)."""
        from . import rnn_cell
        from ..contrib.rnn import LSTMPCell

        if self._lstm_state_clip_min is not None or self._lstm_state_clip_max is not None:
            raise AssertionError("%s._unfuse: the recurrent cells have no state clipping" % self.__class__.__name__)

        def cell(prefix, input_size):
            if self._projection_size:
                return LSTMPCell(self._hidden_size, self._projection_size, input_size=input_size, prefix=prefix)
            if self._mode == "lstm":
                return rnn_cell.LSTMCell(self._hidden_size, input_size=input_size, prefix=prefix)
            if self._mode == "gru":
                return rnn_cell.GRUCell(self._hidden_size, input_size=input_size, prefix=prefix)
            return rnn_cell.RNNCell(self._hidden_size, activation=self._mode[len("rnn_"):], input_size=input_size,
                                    prefix=prefix)

        stack = rnn_cell.HybridSequentialRNNCell(prefix=self.prefix, params=self.params)
        with stack.name_scope():
            width = self._input_size
            for layer in range(self._num_layers):
                if self._dir == 2:
                    stack.add(rnn_cell.BidirectionalCell(cell("l%d_" % layer, width), cell("r%d_" % layer, width)))
                else:
                    stack.add(cell("l%d_" % layer, width))
                if self._dropout and layer + 1 < self._num_layers:
                    stack.add(rnn_cell.DropoutCell(self._dropout))
                width = self._state_width() * self._dir
        return stack

    def _collect_params_with_prefix(self, prefix=""):
        # MXNet 1.x saves fused layers under the names of the cells they replaced
        # (`_unfused.0.l_cell.i2h_weight`), so files stay interchangeable with it.
        if prefix:
            prefix += "."
        bidirectional = self._dir == 2
        names = {}
        for key, param in self._reg_params.items():
            direction, layer, group, kind = _STRUCTURAL_NAME.match(key).groups()
            cell = "%s_cell." % direction if bidirectional else ""
            names["%s_unfused.%s.%s%s_%s" % (prefix, layer, cell, group, kind)] = param
        return names

    def state_info(self, batch_size=0):
        widths = [self._state_width()] + ([self._hidden_size] if self._mode == "lstm" else [])
        return [{"shape": (self._num_layers * self._dir, batch_size, width), "__layout__": "LNC", "dtype": self._dtype}
                for width in widths]

    def cast(self, dtype):
        super().cast(dtype)
        self._dtype = dtype

    def begin_state(self, batch_size=0, func=ndarray.zeros, **kwargs):
        """Initial states: ``func(name=..., shape=..., **kwargs)`` for each state (zeros by default).
        For symbols pass ``func=mx.sym.zeros``; batch size 0 is then inferred from the data."""
        states = []
        for i, info in enumerate(self.state_info(batch_size)):
            info.update(kwargs)
            states.append(func(name="%sh0_%d" % (self.prefix, i), **info))
        return states

    def __call__(self, inputs, states=None, sequence_length=None, **kwargs):
        if self._use_sequence_length and sequence_length is None:
            raise ValueError("%s was made with use_sequence_length=True: call it with a (batch,) sequence_length"
                             % self.__class__.__name__)
        skip_states = states is None
        if skip_states:
            if isinstance(inputs, NDArray):
                batch_size = inputs.shape[self._layout.find("N")]
                states = self.begin_state(batch_size, ctx=inputs.context, dtype=inputs.dtype)
            else:
                states = self.begin_state(0, func=symbol.zeros)
        elif isinstance(states, (NDArray, symbol.Symbol)):
            states = [states]
        if self._use_sequence_length:
            output, new_states = super().__call__(inputs, states, sequence_length, **kwargs)
        else:
            output, new_states = super().__call__(inputs, states, **kwargs)
        return output if skip_states else (output, new_states)

    def hybrid_forward(self, F, inputs, states, sequence_length=None, **params):
        if F is ndarray:
            batch_size = inputs.shape[self._layout.find("N")]
            for state, info in zip(states, self.state_info(batch_size)):
                if state.shape != info["shape"]:
                    raise ValueError("Invalid recurrent state shape. Expecting %s, got %s."
                                     % (str(info["shape"]), str(state.shape)))
        if self._layout == "NTC":
            inputs = F.swapaxes(inputs, dim1=0, dim2=1)
        # The RNN operator's parameter vector: every weight, then every bias, each by layer,
        # direction and i2h/h2h/h2r (cuDNN's order, which MXNet adopted).
        groups = ("i2h", "h2h", "h2r") if self._projection_size else ("i2h", "h2h")
        flat = [params["%s%d_%s_%s" % (direction, layer, group, kind)].reshape(-1)
                for kind in ("weight", "bias")
                for layer in range(self._num_layers)
                for direction in "lr"[:self._dir]
                for group in groups
                if group != "h2r" or kind == "weight"]
        weights = F._internal._rnn_param_concat(*flat, dim=0, num_args=len(flat))
        clip = {}
        if self._lstm_state_clip_min is not None:
            clip = {"lstm_state_clip_min": self._lstm_state_clip_min, "lstm_state_clip_max": self._lstm_state_clip_max,
                    "lstm_state_clip_nan": self._lstm_state_clip_nan}
        lengths = [sequence_length] if self._use_sequence_length else []
        result = F.RNN(inputs, weights, *states, *lengths, state_size=self._hidden_size, num_layers=self._num_layers,
                       bidirectional=self._dir == 2, p=self._dropout, state_outputs=True, mode=self._mode,
                       projection_size=self._projection_size, use_sequence_length=self._use_sequence_length, **clip)
        output, new_states = result[0], [result[i] for i in range(1, 3 if self._mode == "lstm" else 2)]
        if self._layout == "NTC":
            output = F.swapaxes(output, dim1=0, dim2=1)
        return output, new_states


class RNN(_RNNLayer):
    """Elman RNN layers, ``h_t = act(W_ih x_t + b_ih + W_hh h_(t-1) + b_hh)`` with ``activation``
    'relu' (default) or 'tanh'."""

    def __init__(self, hidden_size, num_layers=1, activation="relu", layout="TNC", dropout=0, bidirectional=False,
                 i2h_weight_initializer=None, h2h_weight_initializer=None, i2h_bias_initializer="zeros",
                 h2h_bias_initializer="zeros", input_size=0, dtype="float32", **kwargs):
        if activation not in ("relu", "tanh"):
            raise ValueError("RNN: activation must be 'relu' or 'tanh', got %r" % (activation,))
        super().__init__(hidden_size, num_layers, layout, dropout, bidirectional, input_size, i2h_weight_initializer,
                         h2h_weight_initializer, i2h_bias_initializer, h2h_bias_initializer, "rnn_" + activation,
                         None, None, None, False, dtype, **kwargs)


class LSTM(_RNNLayer):
    """Long short-term memory layers (gates i, f, g, o); states are ``[h, c]``. ``state_clip_min``
    and ``state_clip_max`` clip the cell state (``state_clip_nan`` also replaces NaN).
    ``projection_size`` makes it an LSTMP: h is projected to that size (``h2r_weight``), which is
    then the output and the recurrent state while the cell keeps ``hidden_size``."""

    def __init__(self, hidden_size, num_layers=1, layout="TNC", dropout=0, bidirectional=False, input_size=0,
                 i2h_weight_initializer=None, h2h_weight_initializer=None, i2h_bias_initializer="zeros",
                 h2h_bias_initializer="zeros", projection_size=None, h2r_weight_initializer=None,
                 state_clip_min=None, state_clip_max=None, state_clip_nan=False, dtype="float32", **kwargs):
        super().__init__(hidden_size, num_layers, layout, dropout, bidirectional, input_size, i2h_weight_initializer,
                         h2h_weight_initializer, i2h_bias_initializer, h2h_bias_initializer, "lstm",
                         projection_size, state_clip_min, state_clip_max, state_clip_nan, dtype,
                         h2r_weight_initializer=h2r_weight_initializer, **kwargs)


class GRU(_RNNLayer):
    """Gated recurrent unit layers in cuDNN's form (the reset gate scales ``W_hn h + b_hn``)."""

    def __init__(self, hidden_size, num_layers=1, layout="TNC", dropout=0, bidirectional=False, input_size=0,
                 i2h_weight_initializer=None, h2h_weight_initializer=None, i2h_bias_initializer="zeros",
                 h2h_bias_initializer="zeros", dtype="float32", **kwargs):
        super().__init__(hidden_size, num_layers, layout, dropout, bidirectional, input_size, i2h_weight_initializer,
                         h2h_weight_initializer, i2h_bias_initializer, h2h_bias_initializer, "gru",
                         None, None, None, False, dtype, **kwargs)
