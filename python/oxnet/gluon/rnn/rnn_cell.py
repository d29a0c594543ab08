"""Recurrent cells (MXNet's ``gluon.rnn`` cells): one time step per call, ``unroll`` for a whole
sequence, and the modifiers that stack, wrap or reverse them. Cells are hybrid blocks, so an
unrolled cell traces into one graph like any other."""

from ... import ndarray, symbol
from ...base import numeric_types, string_types
from ...ndarray import NDArray
from ..block import Block, HybridBlock
from ..nn import LeakyReLU

__all__ = ["RecurrentCell", "HybridRecurrentCell", "RNNCell", "LSTMCell", "GRUCell", "SequentialRNNCell",
           "HybridSequentialRNNCell", "DropoutCell", "ModifierCell", "ZoneoutCell", "ResidualCell",
           "BidirectionalCell"]

_TENSORS = (NDArray, symbol.Symbol)


def _as_list(obj):
    """A list of tensors: a list as given, a multi-output symbol (a split) as its outputs."""
    if isinstance(obj, (list, tuple)):
        return obj
    if isinstance(obj, symbol.Symbol) and len(obj) > 1:
        return list(obj)
    return [obj]


def _namespace(inputs):
    first = inputs if isinstance(inputs, _TENSORS) else inputs[0]
    return symbol if isinstance(first, symbol.Symbol) else ndarray


def _format_sequence(length, inputs, layout, merge, in_layout=None):
    """Bring ``inputs`` (one tensor with a time axis, or a list of per-step tensors) to the form
    ``merge`` asks: a list of steps (False), one tensor in ``layout`` (True) or as given (None).
    Returns ``(inputs, time_axis, F, batch_size)``; batch_size is 0 for symbols."""
    if inputs is None:
        raise ValueError("unroll(inputs=None) is not supported: create the input variables outside unroll")
    axis = layout.find("T")
    in_axis = in_layout.find("T") if in_layout is not None else axis
    F = _namespace(inputs)
    batch_size = 0
    if isinstance(inputs, _TENSORS):
        if F is ndarray:
            batch_size = inputs.shape[layout.find("N")]
            if length is not None and length != inputs.shape[in_axis]:
                raise ValueError("unroll: length %d does not match the %d steps of the input %s"
                                 % (length, inputs.shape[in_axis], inputs.shape))
        if merge is False:
            steps = inputs.shape[in_axis] if F is ndarray else length
            inputs = _as_list(F.split(inputs, axis=in_axis, num_outputs=steps, squeeze_axis=1))
            return inputs, axis, F, batch_size
    else:
        if length is not None and len(inputs) != length:
            raise ValueError("unroll: length %d does not match the %d input steps" % (length, len(inputs)))
        if F is ndarray:
            batch_size = inputs[0].shape[0]
        if merge is True:
            inputs = F.stack(*inputs, axis=axis)
            in_axis = axis
    if isinstance(inputs, _TENSORS) and axis != in_axis:
        inputs = F.swapaxes(inputs, dim1=axis, dim2=in_axis)
    return inputs, axis, F, batch_size


def _begin_state_for(cell, F, begin_state, inputs, batch_size):
    if begin_state is not None:
        return begin_state
    if F is ndarray:
        ctx = inputs.context if isinstance(inputs, NDArray) else inputs[0].context
        with ctx:
            return cell.begin_state(func=F.zeros, batch_size=batch_size)
    return cell.begin_state(func=F.zeros, batch_size=batch_size)


def _mask_variable_length(F, data, length, valid_length, time_axis, merge):
    """Zero the steps past each sequence's ``valid_length``."""
    if not isinstance(data, _TENSORS):
        data = F.stack(*data, axis=time_axis)
    masked = F.SequenceMask(data, sequence_length=valid_length, use_sequence_length=True, axis=time_axis)
    if merge:
        return masked
    return _as_list(F.split(masked, num_outputs=length, axis=time_axis, squeeze_axis=True))


def _reverse_sequences(steps, length, valid_length=None):
    if valid_length is None:
        return list(reversed(steps))
    F = _namespace(steps)
    reversed_steps = F.SequenceReverse(F.stack(*steps, axis=0), sequence_length=valid_length, use_sequence_length=True)
    return _as_list(F.split(reversed_steps, axis=0, num_outputs=length, squeeze_axis=True))


class RecurrentCell(Block):
    """A cell computing one step, ``output, new_states = cell(inputs, states)``."""

    def __init__(self, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        self._modified = False
        self.reset()

    def reset(self):
        """Restart step counting (names of traced nodes, ``begin_state`` names) before a sequence."""
        self._init_counter = -1
        self._counter = -1
        for cell in self._children.values():
            cell.reset()

    def state_info(self, batch_size=0):
        """Shape and layout of each state."""
        raise NotImplementedError()

    def _check_unmodified(self):
        if self._modified:
            raise AssertionError("After applying modifier cells (e.g. ZoneoutCell) the base cell cannot be called "
                                 "directly. Call the modifier cell instead.")

    def begin_state(self, batch_size=0, func=ndarray.zeros, **kwargs):
        """Initial states, one ``func(name=..., shape=..., **kwargs)`` per state."""
        self._check_unmodified()
        states = []
        for info in self.state_info(batch_size):
            self._init_counter += 1
            info = dict(info or {}, **kwargs)
            states.append(func(name="%sbegin_state_%d" % (self._prefix, self._init_counter), **info))
        return states

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None, valid_length=None):
        """Run ``length`` steps. ``inputs`` is one tensor in ``layout`` or a list of steps; outputs
        come back merged into one tensor (``merge_outputs=True``), as a list (False) or in the
        inputs' form (None). With ``valid_length`` outputs past each sequence's end are zero and
        the returned states are those at its last valid step."""
        self.reset()
        inputs, axis, F, batch_size = _format_sequence(length, inputs, layout, False)
        states = _begin_state_for(self, F, begin_state, inputs, batch_size)
        outputs, history = [], []
        for step in range(length):
            output, states = self(inputs[step], states)
            outputs.append(output)
            if valid_length is not None:
                history.append(states)
        if valid_length is not None:
            states = [F.SequenceLast(F.stack(*per_step, axis=0), sequence_length=valid_length,
                                     use_sequence_length=True, axis=0) for per_step in zip(*history)]
            outputs = _mask_variable_length(F, outputs, length, valid_length, axis, True)
        outputs, _, _, _ = _format_sequence(length, outputs, layout, merge_outputs)
        return outputs, states

    def _get_activation(self, F, inputs, activation, **kwargs):
        named = {"tanh": F.tanh, "relu": F.relu, "sigmoid": F.sigmoid, "softsign": F.softsign}.get(activation)
        if named:
            return named(inputs, **kwargs)
        if isinstance(activation, string_types):
            return F.Activation(inputs, act_type=activation, **kwargs)
        if isinstance(activation, LeakyReLU):
            return F.LeakyReLU(inputs, act_type="leaky", slope=activation._alpha, **kwargs)
        return activation(inputs, **kwargs)

    def forward(self, inputs, states):
        self._counter += 1
        return super().forward(inputs, states)


class HybridRecurrentCell(RecurrentCell, HybridBlock):
    """A recurrent cell written once for NDArray and Symbol (``hybrid_forward``)."""

    def hybrid_forward(self, F, x, *args, **kwargs):
        raise NotImplementedError


class _GatedCell(HybridRecurrentCell):
    """A cell with ``gates`` blocks of ``i2h``/``h2h`` weights and biases; the recurrent state is
    ``recurrent_size`` wide (``hidden_size`` unless projected)."""

    def __init__(self, hidden_size, gates, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                 h2h_bias_initializer, input_size, prefix, params, recurrent_size=None):
        super().__init__(prefix=prefix, params=params)
        self._hidden_size = hidden_size
        self._input_size = input_size
        self._rows = rows = gates * hidden_size
        self.i2h_weight = self.params.get("i2h_weight", shape=(rows, input_size), init=i2h_weight_initializer,
                                          allow_deferred_init=True)
        self.h2h_weight = self.params.get("h2h_weight", shape=(rows, recurrent_size or hidden_size),
                                          init=h2h_weight_initializer, allow_deferred_init=True)
        self.i2h_bias = self.params.get("i2h_bias", shape=(rows,), init=i2h_bias_initializer,
                                        allow_deferred_init=True)
        self.h2h_bias = self.params.get("h2h_bias", shape=(rows,), init=h2h_bias_initializer,
                                        allow_deferred_init=True)

    def __repr__(self):
        shape = self.i2h_weight.shape
        return "%s(%s -> %d)" % (self.__class__.__name__, shape[1] if shape[1] else None, shape[0])

    def _projections(self, F, inputs, state, i2h_weight, h2h_weight, i2h_bias, h2h_bias):
        prefix = "t%d_" % self._counter
        i2h = F.FullyConnected(data=inputs, weight=i2h_weight, bias=i2h_bias, num_hidden=self._rows,
                               name=prefix + "i2h")
        h2h = F.FullyConnected(data=state, weight=h2h_weight, bias=h2h_bias, num_hidden=self._rows,
                               name=prefix + "h2h")
        return prefix, i2h, h2h


class RNNCell(_GatedCell):
    """Elman cell: ``h' = activation(W_ih x + b_ih + W_hh h + b_hh)``."""

    def __init__(self, hidden_size, activation="tanh", i2h_weight_initializer=None, h2h_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros", input_size=0, prefix=None, params=None):
        super().__init__(hidden_size, 1, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, input_size, prefix, params)
        self._activation = activation

    def state_info(self, batch_size=0):
        return [{"shape": (batch_size, self._hidden_size), "__layout__": "NC"}]

    def _alias(self):
        return "rnn"

    def __repr__(self):
        shape = self.i2h_weight.shape
        return "%s(%s -> %d, %s)" % (self.__class__.__name__, shape[1] if shape[1] else None, shape[0],
                                     self._activation)

    def hybrid_forward(self, F, inputs, states, i2h_weight, h2h_weight, i2h_bias, h2h_bias):
        prefix, i2h, h2h = self._projections(F, inputs, states[0], i2h_weight, h2h_weight, i2h_bias, h2h_bias)
        output = self._get_activation(F, F.elemwise_add(i2h, h2h, name=prefix + "plus0"), self._activation,
                                      name=prefix + "out")
        return output, [output]


class LSTMCell(_GatedCell):
    """LSTM cell (gates i, f, g, o in that order); states ``[h, c]``."""

    def __init__(self, hidden_size, i2h_weight_initializer=None, h2h_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros", input_size=0, prefix=None, params=None,
                 activation="tanh", recurrent_activation="sigmoid"):
        super().__init__(hidden_size, 4, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, input_size, prefix, params)
        self._activation = activation
        self._recurrent_activation = recurrent_activation

    def state_info(self, batch_size=0):
        return [{"shape": (batch_size, self._hidden_size), "__layout__": "NC"},
                {"shape": (batch_size, self._hidden_size), "__layout__": "NC"}]

    # The node computing h: the step's output, unless a subclass projects it (LSTMP).
    _hidden_name = "out"

    def _alias(self):
        return "lstm"

    def hybrid_forward(self, F, inputs, states, i2h_weight, h2h_weight, i2h_bias, h2h_bias):
        prefix, i2h, h2h = self._projections(F, inputs, states[0], i2h_weight, h2h_weight, i2h_bias, h2h_bias)
        gates = F.SliceChannel(F.elemwise_add(i2h, h2h, name=prefix + "plus0"), num_outputs=4, name=prefix + "slice")
        gate = self._get_activation
        in_gate = gate(F, gates[0], self._recurrent_activation, name=prefix + "i")
        forget_gate = gate(F, gates[1], self._recurrent_activation, name=prefix + "f")
        candidate = gate(F, gates[2], self._activation, name=prefix + "c")
        out_gate = gate(F, gates[3], self._recurrent_activation, name=prefix + "o")
        next_c = F.elemwise_add(F.elemwise_mul(forget_gate, states[1], name=prefix + "mul0"),
                                F.elemwise_mul(in_gate, candidate, name=prefix + "mul1"), name=prefix + "state")
        next_h = F.elemwise_mul(out_gate, F.Activation(next_c, act_type=self._activation, name=prefix + "activation0"),
                                name=prefix + self._hidden_name)
        return next_h, [next_h, next_c]


class GRUCell(_GatedCell):
    """GRU cell in cuDNN's form: ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``,
    ``h' = (1 - z) * n + z * h``."""

    def __init__(self, hidden_size, i2h_weight_initializer=None, h2h_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros", input_size=0, prefix=None, params=None,
                 activation="tanh", recurrent_activation="sigmoid"):
        super().__init__(hidden_size, 3, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, input_size, prefix, params)
        self._activation = activation
        self._recurrent_activation = recurrent_activation

    def state_info(self, batch_size=0):
        return [{"shape": (batch_size, self._hidden_size), "__layout__": "NC"}]

    def _alias(self):
        return "gru"

    def hybrid_forward(self, F, inputs, states, i2h_weight, h2h_weight, i2h_bias, h2h_bias):
        prev_h = states[0]
        prefix, i2h, h2h = self._projections(F, inputs, prev_h, i2h_weight, h2h_weight, i2h_bias, h2h_bias)
        i2h_r, i2h_z, i2h_n = F.SliceChannel(i2h, num_outputs=3, name=prefix + "i2h_slice")
        h2h_r, h2h_z, h2h_n = F.SliceChannel(h2h, num_outputs=3, name=prefix + "h2h_slice")
        def gate(F, x, activation, name):
            # String activations stay Activation nodes, as in MXNet's graphs of this cell.
            if isinstance(activation, string_types):
                return F.Activation(x, act_type=activation, name=name)
            return self._get_activation(F, x, activation, name=name)

        reset = gate(F, F.elemwise_add(i2h_r, h2h_r, name=prefix + "plus0"), self._recurrent_activation,
                     name=prefix + "r_act")
        update = gate(F, F.elemwise_add(i2h_z, h2h_z, name=prefix + "plus1"), self._recurrent_activation,
                      name=prefix + "z_act")
        candidate = gate(F, F.elemwise_add(i2h_n, F.elemwise_mul(reset, h2h_n, name=prefix + "mul0"),
                                           name=prefix + "plus2"), self._activation, name=prefix + "h_act")
        keep = F.elemwise_sub(F.ones_like(update, name=prefix + "ones_like0"), update, name=prefix + "minus0")
        next_h = F.elemwise_add(F.elemwise_mul(keep, candidate, name=prefix + "mul1"),
                                F.elemwise_mul(update, prev_h, name=prefix + "mul20"), name=prefix + "out")
        return next_h, [next_h]


class _StackOfCells:
    """Shared behaviour of the sequential cells: each child gets its slice of the states."""

    def __repr__(self):
        body = "\n".join("(%s): %s" % (key, repr(cell).replace("\n", "\n  ")) for key, cell in self._children.items())
        return "%s(\n%s\n)" % (self.__class__.__name__, body)

    def add(self, cell):
        """Append a cell to the stack."""
        self.register_child(cell)

    def state_info(self, batch_size=0):
        return sum((cell.state_info(batch_size) for cell in self._children.values()), [])

    def begin_state(self, **kwargs):
        self._check_unmodified()
        return sum((cell.begin_state(**kwargs) for cell in self._children.values()), [])

    def _step(self, inputs, states):
        self._counter += 1
        if any(isinstance(cell, BidirectionalCell) for cell in self._children.values()):
            raise AssertionError("a BidirectionalCell cannot be stepped; use unroll")
        next_states, start = [], 0
        for cell in self._children.values():
            count = len(cell.state_info())
            inputs, state = cell(inputs, states[start:start + count])
            start += count
            next_states.extend(state)
        return inputs, next_states

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None, valid_length=None):
        self.reset()
        inputs, _, F, batch_size = _format_sequence(length, inputs, layout, None)
        states = _begin_state_for(self, F, begin_state, inputs, batch_size)
        last = len(self._children) - 1
        next_states, start = [], 0
        for i, cell in enumerate(self._children.values()):
            count = len(cell.state_info())
            inputs, cell_states = cell.unroll(length, inputs=inputs, begin_state=states[start:start + count],
                                              layout=layout, merge_outputs=merge_outputs if i == last else None,
                                              valid_length=valid_length)
            start += count
            next_states.extend(cell_states)
        return inputs, next_states

    def __getitem__(self, i):
        return self._children[str(i)]

    def __len__(self):
        return len(self._children)


class SequentialRNNCell(_StackOfCells, RecurrentCell):
    """Cells stacked on top of each other (any recurrent cells)."""

    def __call__(self, inputs, states):
        return self._step(inputs, states)


class HybridSequentialRNNCell(_StackOfCells, HybridRecurrentCell):
    """Hybrid cells stacked on top of each other."""

    def __call__(self, inputs, states):
        return self._step(inputs, states)

    def hybrid_forward(self, F, inputs, states):
        return self._step(inputs, states)


class DropoutCell(HybridRecurrentCell):
    """Dropout on each step's input (``axes`` share one mask); no states."""

    def __init__(self, rate, axes=(), prefix=None, params=None):
        if not isinstance(rate, numeric_types):
            raise TypeError("DropoutCell: rate must be a number, got %r" % (rate,))
        super().__init__(prefix, params)
        self._rate = rate
        self._axes = axes

    def __repr__(self):
        return "%s(rate=%s, axes=%s)" % (self.__class__.__name__, self._rate, self._axes)

    def state_info(self, batch_size=0):
        return []

    def _alias(self):
        return "dropout"

    def hybrid_forward(self, F, inputs, states):
        if self._rate > 0:
            inputs = F.Dropout(data=inputs, p=self._rate, axes=self._axes, name="t%d_fwd" % self._counter)
        return inputs, states

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None, valid_length=None):
        self.reset()
        inputs, _, F, _ = _format_sequence(length, inputs, layout, merge_outputs)
        if isinstance(inputs, _TENSORS):
            return self.hybrid_forward(F, inputs, begin_state if begin_state else [])
        return super().unroll(length, inputs, begin_state=begin_state, layout=layout, merge_outputs=merge_outputs)


class ModifierCell(HybridRecurrentCell):
    """Wraps a cell to change what it computes; the base cell is then only reachable through it."""

    def __init__(self, base_cell):
        if base_cell._modified:
            raise AssertionError("Cell %s is already modified. One cell cannot be modified twice" % base_cell.name)
        base_cell._modified = True
        super().__init__(prefix=base_cell.prefix + self._alias(), params=None)
        self.base_cell = base_cell

    @property
    def params(self):
        return self.base_cell.params

    def state_info(self, batch_size=0):
        return self.base_cell.state_info(batch_size)

    def begin_state(self, func=symbol.zeros, **kwargs):
        self._check_unmodified()
        self.base_cell._modified = False
        try:
            return self.base_cell.begin_state(func=func, **kwargs)
        finally:
            self.base_cell._modified = True

    def hybrid_forward(self, F, inputs, states):
        raise NotImplementedError

    def __repr__(self):
        return "%s(%s)" % (self.__class__.__name__, self.base_cell)


class ZoneoutCell(ModifierCell):
    """Zoneout: each output and state unit keeps its previous value with probability
    ``zoneout_outputs`` / ``zoneout_states`` during training."""

    def __init__(self, base_cell, zoneout_outputs=0.0, zoneout_states=0.0):
        if isinstance(base_cell, BidirectionalCell):
            raise AssertionError("BidirectionalCell doesn't support zoneout since it doesn't support step. Please add "
                                 "ZoneoutCell to the cells underneath instead.")
        super().__init__(base_cell)
        self.zoneout_outputs = zoneout_outputs
        self.zoneout_states = zoneout_states
        self._prev_output = None

    def __repr__(self):
        return "%s(p_out=%s, p_state=%s, %s)" % (self.__class__.__name__, self.zoneout_outputs, self.zoneout_states,
                                                 self.base_cell)

    def _alias(self):
        return "zoneout"

    def reset(self):
        super().reset()
        self._prev_output = None

    def hybrid_forward(self, F, inputs, states):
        next_output, next_states = self.base_cell(inputs, states)

        def keep_new(p, like):
            return F.Dropout(F.ones_like(like), p=p)

        prev_output = self._prev_output if self._prev_output is not None else F.zeros_like(next_output)
        output = next_output
        if self.zoneout_outputs != 0.0:
            output = F.where(keep_new(self.zoneout_outputs, next_output), next_output, prev_output)
        if self.zoneout_states != 0.0:
            next_states = [F.where(keep_new(self.zoneout_states, new), new, old)
                           for new, old in zip(next_states, states)]
        self._prev_output = output
        return output, next_states


class ResidualCell(ModifierCell):
    """Adds each step's input to the base cell's output."""

    def hybrid_forward(self, F, inputs, states):
        output, states = self.base_cell(inputs, states)
        return F.elemwise_add(output, inputs, name="t%d_fwd" % self._counter), states

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None, valid_length=None):
        self.reset()
        self.base_cell._modified = False
        try:
            outputs, states = self.base_cell.unroll(length, inputs=inputs, begin_state=begin_state, layout=layout,
                                                    merge_outputs=merge_outputs, valid_length=valid_length)
        finally:
            self.base_cell._modified = True
        if merge_outputs is None:
            merge_outputs = isinstance(outputs, _TENSORS)
        inputs, axis, F, _ = _format_sequence(length, inputs, layout, merge_outputs)
        if valid_length is not None:
            inputs = _mask_variable_length(F, inputs, length, valid_length, axis, merge_outputs)
        if merge_outputs:
            return F.elemwise_add(outputs, inputs), states
        return [F.elemwise_add(o, i) for o, i in zip(outputs, inputs)], states


class BidirectionalCell(HybridRecurrentCell):
    """Runs ``l_cell`` forward and ``r_cell`` backward over the sequence and concatenates their
    outputs; it can only be unrolled."""

    def __init__(self, l_cell, r_cell, output_prefix="bi_"):
        super().__init__(prefix="", params=None)
        self.register_child(l_cell, "l_cell")
        self.register_child(r_cell, "r_cell")
        self._output_prefix = output_prefix

    def __call__(self, inputs, states):
        raise NotImplementedError("Bidirectional cannot be stepped. Please use unroll")

    def __repr__(self):
        return "%s(forward=%s, backward=%s)" % (self.__class__.__name__, self._children["l_cell"],
                                               self._children["r_cell"])

    def state_info(self, batch_size=0):
        return sum((cell.state_info(batch_size) for cell in self._children.values()), [])

    def begin_state(self, **kwargs):
        self._check_unmodified()
        return sum((cell.begin_state(**kwargs) for cell in self._children.values()), [])

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None, valid_length=None):
        self.reset()
        inputs, axis, F, batch_size = _format_sequence(length, inputs, layout, False)
        reversed_inputs = _reverse_sequences(inputs, length, valid_length)
        states = _begin_state_for(self, F, begin_state, inputs, batch_size)
        l_cell, r_cell = self._children.values()
        split = len(l_cell.state_info(batch_size))
        l_outputs, l_states = l_cell.unroll(length, inputs=inputs, begin_state=states[:split], layout=layout,
                                            merge_outputs=merge_outputs, valid_length=valid_length)
        r_outputs, r_states = r_cell.unroll(length, inputs=reversed_inputs, begin_state=states[split:],
                                            layout=layout, merge_outputs=False, valid_length=valid_length)
        r_outputs = _reverse_sequences(r_outputs, length, valid_length)
        if merge_outputs is None:
            merge_outputs = isinstance(l_outputs, _TENSORS)
            l_outputs, _, _, _ = _format_sequence(None, l_outputs, layout, merge_outputs)
            r_outputs, _, _, _ = _format_sequence(None, r_outputs, layout, merge_outputs)
        if merge_outputs:
            if not isinstance(r_outputs, _TENSORS):
                r_outputs = F.stack(*r_outputs, axis=axis)
            outputs = F.concat(l_outputs, r_outputs, dim=2, name="%sout" % self._output_prefix)
        else:
            outputs = [F.concat(l, r, dim=1, name="%st%d" % (self._output_prefix, i))
                       for i, (l, r) in enumerate(zip(l_outputs, r_outputs))]
        if valid_length is not None:
            outputs = _mask_variable_length(F, outputs, length, valid_length, axis, merge_outputs)
        return outputs, l_states + r_states
