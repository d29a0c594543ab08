"""Symbolic recurrent cells (MXNet's ``mxnet.rnn``): each cell builds the graph of one time step
from ``mx.sym`` operators, ``unroll`` chains the steps over a sequence, and ``FusedRNNCell``
emits the whole sequence as one fused ``RNN`` operator. Weights are variables kept in an
``RNNParams`` container, so cells that share a container share their weights."""

import functools
import warnings

from .. import initializer as init
from .. import ndarray, symbol
from ..base import numeric_types, string_types

__all__ = ["RNNParams", "BaseRNNCell", "RNNCell", "LSTMCell", "GRUCell", "FusedRNNCell", "SequentialRNNCell",
           "DropoutCell", "ModifierCell", "ZoneoutCell", "ResidualCell", "BidirectionalCell", "BaseConvRNNCell",
           "ConvRNNCell", "ConvLSTMCell", "ConvGRUCell"]


def _normalize_sequence(length, inputs, layout, merge, in_layout=None):
    """Bring ``inputs`` (one symbol with a time axis, or a list of per-step symbols) to the form
    ``merge`` asks for: a list of steps (False), one symbol in ``layout`` (True) or as given
    (None). Returns ``(inputs, time_axis)``."""
    if inputs is None:
        raise ValueError("unroll(inputs=None) is not supported: create the input variables outside unroll")
    axis = layout.find("T")
    in_axis = axis if in_layout is None else in_layout.find("T")
    if isinstance(inputs, symbol.Symbol):
        if merge is False:
            if len(inputs.list_outputs()) != 1:
                raise ValueError("unroll takes a single-output symbol as its input sequence; convert a grouped "
                                 "symbol to a list of steps with list(inputs) first")
            inputs = list(symbol.split(inputs, axis=in_axis, num_outputs=length, squeeze_axis=1))
    else:
        if length is not None and len(inputs) != length:
            raise ValueError("unroll: length %d does not match the %d input steps" % (length, len(inputs)))
        if merge is True:
            inputs = symbol.Concat(*[symbol.expand_dims(step, axis=axis) for step in inputs], dim=axis)
            in_axis = axis
    if isinstance(inputs, symbol.Symbol) and axis != in_axis:
        inputs = symbol.swapaxes(inputs, dim1=axis, dim2=in_axis)
    return inputs, axis


class RNNParams:
    """The weight variables of one or more cells, created on first request with the container's
    prefix prepended to their names."""

    def __init__(self, prefix=""):
        self._prefix = prefix
        self._params = {}

    def get(self, name, **kwargs):
        """The variable ``prefix + name``, created (with ``kwargs`` for ``mx.sym.Variable``) if
        it does not exist yet."""
        full_name = self._prefix + name
        if full_name not in self._params:
            self._params[full_name] = symbol.Variable(full_name, **kwargs)
        return self._params[full_name]


class BaseRNNCell:
    """Base class of the symbolic cells. ``prefix`` starts the names of the cell's operators
    (and of its weights when it creates its own ``RNNParams``); ``params`` shares another
    container's weights."""

    def __init__(self, prefix="", params=None):
        self._own_params = params is None
        self._prefix = prefix
        self._params = RNNParams(prefix) if params is None else params
        self._modified = False
        self.reset()

    def reset(self):
        """Restart the step and begin-state counters (which number the operators' names) before
        building another graph with this cell."""
        self._init_counter = -1
        self._counter = -1
        for cell in getattr(self, "_cells", ()):
            cell.reset()

    def __call__(self, inputs, states):
        """One time step: ``(output, next_states)`` for the step's input and the states of the
        previous step (or ``begin_state()``)."""
        raise NotImplementedError()

    @property
    def params(self):
        """The cell's weight container (asking for it means it may be shared from now on)."""
        self._own_params = False
        return self._params

    @property
    def state_info(self):
        """One dict per state: its ``shape`` (0 for the unknown batch size) and ``__layout__``."""
        raise NotImplementedError()

    @property
    def state_shape(self):
        return [info["shape"] for info in self.state_info]

    @property
    def _gate_names(self):
        return ()

    def _check_not_modified(self):
        if self._modified:
            raise AssertionError("After applying modifier cells (e.g. DropoutCell) the base cell cannot be called "
                                 "directly. Call the modifier cell instead.")

    def begin_state(self, func=symbol.zeros, **kwargs):
        """The states of the first step, made by ``func`` (``mx.sym.zeros`` by default, or
        ``mx.sym.Variable`` to feed them as inputs) named ``<prefix>begin_state_<i>``, each given
        its ``state_info`` (shape and layout) and ``kwargs``."""
        self._check_not_modified()
        states = []
        for info in self.state_info:
            self._init_counter += 1
            name = "%sbegin_state_%d" % (self._prefix, self._init_counter)
            if info is not None:
                kwargs.update(info)
            states.append(func(name=name, **kwargs))
        return states

    def unpack_weights(self, args):
        """``args`` (a name -> NDArray dict such as ``Module.get_params()[0]``) with this cell's
        stacked gate weights split into one weight and bias per gate (``<prefix>i2h_f_weight``)."""
        args = dict(args)
        if not self._gate_names:
            return args
        hidden = self._num_hidden
        for group in ("i2h", "h2h"):
            weight = args.pop("%s%s_weight" % (self._prefix, group))
            bias = args.pop("%s%s_bias" % (self._prefix, group))
            for j, gate in enumerate(self._gate_names):
                rows = slice(j * hidden, (j + 1) * hidden)
                args["%s%s%s_weight" % (self._prefix, group, gate)] = weight[rows].copy()
                args["%s%s%s_bias" % (self._prefix, group, gate)] = bias[rows].copy()
        return args

    def pack_weights(self, args):
        """The inverse of ``unpack_weights``: per-gate weights stacked back into one array."""
        args = dict(args)
        if not self._gate_names:
            return args
        for group in ("i2h", "h2h"):
            for kind in ("weight", "bias"):
                parts = [args.pop("%s%s%s_%s" % (self._prefix, group, gate, kind)) for gate in self._gate_names]
                args["%s%s_%s" % (self._prefix, group, kind)] = ndarray.concatenate(parts)
        return args

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None):
        """The cell applied over ``length`` steps. ``inputs`` is one symbol laid out as
        ``layout`` (split into steps here) or a list of per-step symbols. Returns the outputs
        (a list of steps, or one symbol in ``layout`` with ``merge_outputs=True``) and the states
        after the last step."""
        self.reset()
        inputs, _ = _normalize_sequence(length, inputs, layout, False)
        states = self.begin_state() if begin_state is None else begin_state
        outputs = []
        for step in range(length):
            output, states = self(inputs[step], states)
            outputs.append(output)
        outputs, _ = _normalize_sequence(length, outputs, layout, merge_outputs)
        return outputs, states

    def _get_activation(self, inputs, activation, **kwargs):
        """``activation`` applied to ``inputs``: an ``Activation`` act_type name, or a callable."""
        if isinstance(activation, string_types):
            return symbol.Activation(inputs, act_type=activation, **kwargs)
        return activation(inputs, **kwargs)


def _batch_major_state(num_hidden):
    return {"shape": (0, num_hidden), "__layout__": "NC"}


class RNNCell(BaseRNNCell):
    """Elman cell: ``h' = activation(W_i x + b_i + W_h h + b_h)``."""

    def __init__(self, num_hidden, activation="tanh", prefix="rnn_", params=None):
        super().__init__(prefix=prefix, params=params)
        self._num_hidden = num_hidden
        self._activation = activation
        self._iW = self.params.get("i2h_weight")
        self._iB = self.params.get("i2h_bias")
        self._hW = self.params.get("h2h_weight")
        self._hB = self.params.get("h2h_bias")

    @property
    def state_info(self):
        return [_batch_major_state(self._num_hidden)]

    @property
    def _gate_names(self):
        return ("",)

    def __call__(self, inputs, states):
        self._counter += 1
        name = "%st%d_" % (self._prefix, self._counter)
        i2h = symbol.FullyConnected(data=inputs, weight=self._iW, bias=self._iB, num_hidden=self._num_hidden,
                                    name="%si2h" % name)
        h2h = symbol.FullyConnected(data=states[0], weight=self._hW, bias=self._hB, num_hidden=self._num_hidden,
                                    name="%sh2h" % name)
        output = self._get_activation(i2h + h2h, self._activation, name="%sout" % name)
        return output, [output]


class LSTMCell(BaseRNNCell):
    """LSTM cell with gates in the order input, forget, cell, output; ``forget_bias`` initializes
    the forget gate's part of ``i2h_bias`` (through ``mx.init.LSTMBias``)."""

    def __init__(self, num_hidden, prefix="lstm_", params=None, forget_bias=1.0):
        super().__init__(prefix=prefix, params=params)
        self._num_hidden = num_hidden
        self._iW = self.params.get("i2h_weight")
        self._hW = self.params.get("h2h_weight")
        self._iB = self.params.get("i2h_bias", init=init.LSTMBias(forget_bias=forget_bias))
        self._hB = self.params.get("h2h_bias")

    @property
    def state_info(self):
        return [_batch_major_state(self._num_hidden), _batch_major_state(self._num_hidden)]

    @property
    def _gate_names(self):
        return ["_i", "_f", "_c", "_o"]

    def __call__(self, inputs, states):
        self._counter += 1
        name = "%st%d_" % (self._prefix, self._counter)
        i2h = symbol.FullyConnected(data=inputs, weight=self._iW, bias=self._iB, num_hidden=self._num_hidden * 4,
                                    name="%si2h" % name)
        h2h = symbol.FullyConnected(data=states[0], weight=self._hW, bias=self._hB,
                                    num_hidden=self._num_hidden * 4, name="%sh2h" % name)
        gates = symbol.SliceChannel(i2h + h2h, num_outputs=4, name="%sslice" % name)
        in_gate = symbol.Activation(gates[0], act_type="sigmoid", name="%si" % name)
        forget_gate = symbol.Activation(gates[1], act_type="sigmoid", name="%sf" % name)
        in_transform = symbol.Activation(gates[2], act_type="tanh", name="%sc" % name)
        out_gate = symbol.Activation(gates[3], act_type="sigmoid", name="%so" % name)
        next_c = symbol._internal._plus(forget_gate * states[1], in_gate * in_transform, name="%sstate" % name)
        next_h = symbol._internal._mul(out_gate, symbol.Activation(next_c, act_type="tanh"), name="%sout" % name)
        return next_h, [next_h, next_c]


class GRUCell(BaseRNNCell):
    """GRU cell as cuDNN computes it (the reset gate scales ``W_h h + b_h``), gates in the order
    reset, update, new."""

    def __init__(self, num_hidden, prefix="gru_", params=None):
        super().__init__(prefix=prefix, params=params)
        self._num_hidden = num_hidden
        self._iW = self.params.get("i2h_weight")
        self._iB = self.params.get("i2h_bias")
        self._hW = self.params.get("h2h_weight")
        self._hB = self.params.get("h2h_bias")

    @property
    def state_info(self):
        return [_batch_major_state(self._num_hidden)]

    @property
    def _gate_names(self):
        return ["_r", "_z", "_o"]

    def __call__(self, inputs, states):
        self._counter += 1
        name = "%st%d_" % (self._prefix, self._counter)
        prev_h = states[0]
        i2h = symbol.FullyConnected(data=inputs, weight=self._iW, bias=self._iB, num_hidden=self._num_hidden * 3,
                                    name="%s_i2h" % name)
        h2h = symbol.FullyConnected(data=prev_h, weight=self._hW, bias=self._hB, num_hidden=self._num_hidden * 3,
                                    name="%s_h2h" % name)
        i2h_r, i2h_z, i2h_n = symbol.SliceChannel(i2h, num_outputs=3, name="%s_i2h_slice" % name)
        h2h_r, h2h_z, h2h_n = symbol.SliceChannel(h2h, num_outputs=3, name="%s_h2h_slice" % name)
        reset_gate = symbol.Activation(i2h_r + h2h_r, act_type="sigmoid", name="%s_r_act" % name)
        update_gate = symbol.Activation(i2h_z + h2h_z, act_type="sigmoid", name="%s_z_act" % name)
        candidate = symbol.Activation(i2h_n + reset_gate * h2h_n, act_type="tanh", name="%s_h_act" % name)
        next_h = symbol._internal._plus((1.0 - update_gate) * candidate, update_gate * prev_h, name="%sout" % name)
        return next_h, [next_h]


class FusedRNNCell(BaseRNNCell):
    """A whole (multi-layer, optionally bidirectional) RNN as one fused ``RNN`` operator over the
    sequence, its weights packed into one ``<prefix>parameters`` vector. It cannot be stepped;
    ``unfuse()`` gives the equivalent stack of step cells. ``mode`` is 'rnn_relu', 'rnn_tanh',
    'lstm' or 'gru'; with ``get_next_state`` ``unroll`` also returns the final states."""

    _GATES = {"rnn_relu": [""], "rnn_tanh": [""], "lstm": ["_i", "_f", "_c", "_o"], "gru": ["_r", "_z", "_o"]}

    def __init__(self, num_hidden, num_layers=1, mode="lstm", bidirectional=False, dropout=0.0,
                 get_next_state=False, forget_bias=1.0, prefix=None, params=None):
        if mode not in self._GATES:
            raise ValueError("FusedRNNCell: mode must be one of %s, got %r" % (", ".join(self._GATES), mode))
        super().__init__(prefix="%s_" % mode if prefix is None else prefix, params=params)
        self._num_hidden = num_hidden
        self._num_layers = num_layers
        self._mode = mode
        self._bidirectional = bidirectional
        self._dropout = dropout
        self._get_next_state = get_next_state
        self._directions = ["l", "r"] if bidirectional else ["l"]
        initializer = init.FusedRNN(None, num_hidden, num_layers, mode, bidirectional, forget_bias)
        self._parameter = self.params.get("parameters", init=initializer)

    @property
    def state_info(self):
        shape = (len(self._directions) * self._num_layers, 0, self._num_hidden)
        return [{"shape": shape, "__layout__": "LNC"} for _ in range(2 if self._mode == "lstm" else 1)]

    @property
    def _gate_names(self):
        return self._GATES[self._mode]

    @property
    def _num_gates(self):
        return len(self._gate_names)

    def _slice_weights(self, arr, num_input, num_hidden):
        """Views of the packed vector ``arr``, by per-gate weight name: every layer's and
        direction's input and recurrent weights first, then all their biases (the fused
        operator's layout)."""
        views = {}
        offset = 0
        num_directions = len(self._directions)

        def take(name, size, shape=None):
            nonlocal offset
            part = arr[offset:offset + size]
            views[name] = part if shape is None else part.reshape(shape)
            offset += size

        for layer in range(self._num_layers):
            layer_input = num_input if layer == 0 else num_directions * num_hidden
            for direction in self._directions:
                for gate in self._gate_names:
                    take("%s%s%d_i2h%s_weight" % (self._prefix, direction, layer, gate), layer_input * num_hidden,
                         (num_hidden, layer_input))
                for gate in self._gate_names:
                    take("%s%s%d_h2h%s_weight" % (self._prefix, direction, layer, gate), num_hidden * num_hidden,
                         (num_hidden, num_hidden))
        for layer in range(self._num_layers):
            for direction in self._directions:
                for group in ("i2h", "h2h"):
                    for gate in self._gate_names:
                        take("%s%s%d_%s%s_bias" % (self._prefix, direction, layer, group, gate), num_hidden)
        if offset != arr.size:
            raise ValueError("FusedRNNCell: the parameter vector has %d values, the cell's weights take %d"
                             % (arr.size, offset))
        return views

    def unpack_weights(self, args):
        args = dict(args)
        arr = args.pop(self._parameter.name)
        directions, gates, hidden = len(self._directions), self._num_gates, self._num_hidden
        # size = gates*hidden*directions*(num_input + hidden + 2)
        #        + (layers-1)*gates*hidden*directions*(directions*hidden + hidden + 2)
        num_input = (arr.size // directions // hidden // gates
                     - (self._num_layers - 1) * (hidden + directions * hidden + 2) - hidden - 2)
        views = self._slice_weights(arr, num_input, hidden)
        args.update({name: view.copy() for name, view in views.items()})
        return args

    def pack_weights(self, args):
        args = dict(args)
        directions, gates, hidden = len(self._directions), self._num_gates, self._num_hidden
        first = args["%sl0_i2h%s_weight" % (self._prefix, self._gate_names[0])]
        num_input = first.shape[1]
        total = ((num_input + hidden + 2) * hidden * gates * directions
                 + (self._num_layers - 1) * gates * hidden * (hidden + directions * hidden + 2) * directions)
        arr = ndarray.zeros((total,), ctx=first.context, dtype=first.dtype)
        for name, view in self._slice_weights(arr, num_input, hidden).items():
            view[:] = args.pop(name)
        args[self._parameter.name] = arr
        return args

    def __call__(self, inputs, states):
        raise NotImplementedError("FusedRNNCell cannot be stepped. Please use unroll")

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None):
        self.reset()
        inputs, axis = _normalize_sequence(length, inputs, layout, True)
        if axis == 1:
            warnings.warn("NTC layout detected. Consider using TNC for FusedRNNCell for faster speed")
            inputs = symbol.swapaxes(inputs, dim1=0, dim2=1)
        elif axis != 0:
            raise ValueError("FusedRNNCell: unsupported layout %s" % layout)
        states = self.begin_state() if begin_state is None else begin_state
        state_inputs = {"state": states[0]}
        if self._mode == "lstm":
            state_inputs["state_cell"] = states[1]
        rnn = symbol.RNN(data=inputs, parameters=self._parameter, state_size=self._num_hidden,
                         num_layers=self._num_layers, bidirectional=self._bidirectional, p=self._dropout,
                         state_outputs=self._get_next_state, mode=self._mode, name=self._prefix + "rnn",
                         **state_inputs)
        if self._get_next_state:
            next_states = [rnn[i] for i in range(1, 3 if self._mode == "lstm" else 2)]
            for state in next_states:
                state._set_attr(__layout__="LNC")
            outputs = rnn[0]
        else:
            outputs, next_states = rnn, []
        if axis == 1:
            outputs = symbol.swapaxes(outputs, dim1=0, dim2=1)
        outputs, _ = _normalize_sequence(length, outputs, layout, merge_outputs)
        return outputs, next_states

    def unfuse(self):
        """The same network as a ``SequentialRNNCell`` of step cells (one per layer, bidirectional
        pairs where bidirectional, dropout between layers), with the per-layer weight names that
        ``unpack_weights`` produces."""
        def make_cell(prefix):
            if self._mode == "lstm":
                return LSTMCell(self._num_hidden, prefix=prefix)
            if self._mode == "gru":
                return GRUCell(self._num_hidden, prefix=prefix)
            return RNNCell(self._num_hidden, activation=self._mode[len("rnn_"):], prefix=prefix)

        stack = SequentialRNNCell()
        for layer in range(self._num_layers):
            if self._bidirectional:
                stack.add(BidirectionalCell(make_cell("%sl%d_" % (self._prefix, layer)),
                                            make_cell("%sr%d_" % (self._prefix, layer)),
                                            output_prefix="%sbi_l%d_" % (self._prefix, layer)))
            else:
                stack.add(make_cell("%sl%d_" % (self._prefix, layer)))
            if self._dropout > 0 and layer != self._num_layers - 1:
                stack.add(DropoutCell(self._dropout, prefix="%s_dropout%d_" % (self._prefix, layer)))
        return stack


class SequentialRNNCell(BaseRNNCell):
    """Cells stacked in order: each one's output is the next one's input; the states are the
    cells' states concatenated."""

    def __init__(self, params=None):
        super().__init__(prefix="", params=params)
        self._override_cell_params = params is not None
        self._cells = []

    def add(self, cell):
        """Append ``cell`` to the stack (its weights join this cell's container)."""
        self._cells.append(cell)
        if self._override_cell_params:
            if not cell._own_params:
                raise AssertionError("Either specify params for SequentialRNNCell or child cells, not both.")
            cell.params._params.update(self.params._params)
        self.params._params.update(cell.params._params)

    @property
    def state_info(self):
        return [info for cell in self._cells for info in cell.state_info]

    def begin_state(self, **kwargs):
        self._check_not_modified()
        return [state for cell in self._cells for state in cell.begin_state(**kwargs)]

    def unpack_weights(self, args):
        for cell in self._cells:
            args = cell.unpack_weights(args)
        return args

    def pack_weights(self, args):
        for cell in self._cells:
            args = cell.pack_weights(args)
        return args

    def _split_states(self, states):
        """``states`` cut into each cell's share."""
        shares, start = [], 0
        for cell in self._cells:
            count = len(cell.state_info)
            shares.append(states[start:start + count])
            start += count
        return shares

    def __call__(self, inputs, states):
        self._counter += 1
        next_states = []
        for cell, cell_states in zip(self._cells, self._split_states(states)):
            if isinstance(cell, BidirectionalCell):
                raise AssertionError("a SequentialRNNCell holding a BidirectionalCell cannot be stepped; use unroll")
            inputs, cell_states = cell(inputs, cell_states)
            next_states.extend(cell_states)
        return inputs, next_states

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None):
        self.reset()
        begin_state = self.begin_state() if begin_state is None else begin_state
        next_states = []
        last = len(self._cells) - 1
        for i, (cell, cell_states) in enumerate(zip(self._cells, self._split_states(begin_state))):
            inputs, cell_states = cell.unroll(length, inputs=inputs, begin_state=cell_states, layout=layout,
                                              merge_outputs=merge_outputs if i == last else None)
            next_states.extend(cell_states)
        return inputs, next_states


class DropoutCell(BaseRNNCell):
    """Dropout on the input of each step (no states)."""

    def __init__(self, dropout, prefix="dropout_", params=None):
        super().__init__(prefix, params)
        if not isinstance(dropout, numeric_types):
            raise AssertionError("dropout probability must be a number")
        self.dropout = dropout

    @property
    def state_info(self):
        return []

    def __call__(self, inputs, states):
        if self.dropout > 0:
            inputs = symbol.Dropout(data=inputs, p=self.dropout)
        return inputs, states

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None):
        self.reset()
        inputs, _ = _normalize_sequence(length, inputs, layout, merge_outputs)
        if isinstance(inputs, symbol.Symbol):
            # The whole sequence at once: one Dropout node.
            return self(inputs, [])
        return super().unroll(length, inputs, begin_state=begin_state, layout=layout, merge_outputs=merge_outputs)


class ModifierCell(BaseRNNCell):
    """Base class of the cells that wrap another (``base_cell``) and change its steps; the base
    cell must then be used only through the modifier."""

    def __init__(self, base_cell):
        super().__init__()
        base_cell._modified = True
        self.base_cell = base_cell

    @property
    def params(self):
        self._own_params = False
        return self.base_cell.params

    @property
    def state_info(self):
        return self.base_cell.state_info

    def begin_state(self, init_sym=symbol.zeros, **kwargs):
        self._check_not_modified()
        self.base_cell._modified = False
        try:
            return self.base_cell.begin_state(init_sym, **kwargs)
        finally:
            self.base_cell._modified = True

    def unpack_weights(self, args):
        return self.base_cell.unpack_weights(args)

    def pack_weights(self, args):
        return self.base_cell.pack_weights(args)

    def __call__(self, inputs, states):
        raise NotImplementedError()


class ZoneoutCell(ModifierCell):
    """Zoneout (Krueger et al. 2016): in training, each output and state value keeps its
    previous step's value with probability ``zoneout_outputs`` / ``zoneout_states``."""

    def __init__(self, base_cell, zoneout_outputs=0.0, zoneout_states=0.0):
        if isinstance(base_cell, FusedRNNCell):
            raise AssertionError("FusedRNNCell doesn't support zoneout. Please unfuse first.")
        if isinstance(base_cell, BidirectionalCell):
            raise AssertionError("BidirectionalCell doesn't support zoneout since it doesn't support step. "
                                 "Please add ZoneoutCell to the cells underneath instead.")
        super().__init__(base_cell)
        self.zoneout_outputs = zoneout_outputs
        self.zoneout_states = zoneout_states
        self.prev_output = None

    def reset(self):
        super().reset()
        self.prev_output = None

    def __call__(self, inputs, states):
        next_output, next_states = self.base_cell(inputs, states)

        def keep_new(p, like):
            # Dropout of ones: 0 where the old value is kept, 1/(1-p) (true) elsewhere.
            return symbol.Dropout(symbol.ones_like(like), p=p)

        # Before the first step the "previous output" is zeros shaped like the output.
        prev_output = self.prev_output if self.prev_output is not None else symbol.zeros((0, 0))
        output = next_output
        if self.zoneout_outputs != 0.0:
            output = symbol.where(keep_new(self.zoneout_outputs, next_output), next_output, prev_output)
        if self.zoneout_states != 0.0:
            next_states = [symbol.where(keep_new(self.zoneout_states, new), new, old)
                           for new, old in zip(next_states, states)]
        self.prev_output = output
        return output, next_states


class ResidualCell(ModifierCell):
    """Adds each step's input to the base cell's output (Wu et al. 2016)."""

    def __call__(self, inputs, states):
        output, states = self.base_cell(inputs, states)
        return symbol.elemwise_add(output, inputs, name="%s_plus_residual" % output.name), states

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None):
        self.reset()
        self.base_cell._modified = False
        try:
            outputs, states = self.base_cell.unroll(length, inputs=inputs, begin_state=begin_state, layout=layout,
                                                    merge_outputs=merge_outputs)
        finally:
            self.base_cell._modified = True
        if merge_outputs is None:
            merge_outputs = isinstance(outputs, symbol.Symbol)
        inputs, _ = _normalize_sequence(length, inputs, layout, merge_outputs)
        if merge_outputs:
            return symbol.elemwise_add(outputs, inputs, name="%s_plus_residual" % outputs.name), states
        outputs = [symbol.elemwise_add(output, step, name="%s_plus_residual" % output.name)
                   for output, step in zip(outputs, inputs)]
        return outputs, states


class BidirectionalCell(BaseRNNCell):
    """``l_cell`` unrolled forwards and ``r_cell`` backwards over the sequence, their outputs
    concatenated per step (named ``<output_prefix>t<i>``, or ``<output_prefix>out`` merged)."""

    def __init__(self, l_cell, r_cell, params=None, output_prefix="bi_"):
        super().__init__("", params=params)
        self._output_prefix = output_prefix
        self._override_cell_params = params is not None
        if self._override_cell_params:
            if not (l_cell._own_params and r_cell._own_params):
                raise AssertionError("Either specify params for BidirectionalCell or child cells, not both.")
            l_cell.params._params.update(self.params._params)
            r_cell.params._params.update(self.params._params)
        self.params._params.update(l_cell.params._params)
        self.params._params.update(r_cell.params._params)
        self._cells = [l_cell, r_cell]

    def unpack_weights(self, args):
        for cell in self._cells:
            args = cell.unpack_weights(args)
        return args

    def pack_weights(self, args):
        for cell in self._cells:
            args = cell.pack_weights(args)
        return args

    def __call__(self, inputs, states):
        raise NotImplementedError("Bidirectional cannot be stepped. Please use unroll")

    @property
    def state_info(self):
        return [info for cell in self._cells for info in cell.state_info]

    def begin_state(self, **kwargs):
        self._check_not_modified()
        return [state for cell in self._cells for state in cell.begin_state(**kwargs)]

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None):
        self.reset()
        inputs, axis = _normalize_sequence(length, inputs, layout, False)
        states = self.begin_state() if begin_state is None else begin_state
        l_cell, r_cell = self._cells
        num_l_states = len(l_cell.state_info)
        l_outputs, l_states = l_cell.unroll(length, inputs=inputs, begin_state=states[:num_l_states],
                                            layout=layout, merge_outputs=merge_outputs)
        r_outputs, r_states = r_cell.unroll(length, inputs=list(reversed(inputs)),
                                            begin_state=states[num_l_states:], layout=layout,
                                            merge_outputs=merge_outputs)
        if merge_outputs is None:
            merge_outputs = isinstance(l_outputs, symbol.Symbol) and isinstance(r_outputs, symbol.Symbol)
            if not merge_outputs:
                if isinstance(l_outputs, symbol.Symbol):
                    l_outputs = list(symbol.SliceChannel(l_outputs, axis=axis, num_outputs=length, squeeze_axis=1))
                if isinstance(r_outputs, symbol.Symbol):
                    r_outputs = list(symbol.SliceChannel(r_outputs, axis=axis, num_outputs=length, squeeze_axis=1))
        if merge_outputs:
            outputs = symbol.Concat(l_outputs, symbol.reverse(r_outputs, axis=axis), dim=2,
                                    name="%sout" % self._output_prefix)
        else:
            outputs = [symbol.Concat(l_out, r_out, dim=1, name="%st%d" % (self._output_prefix, i))
                       for i, (l_out, r_out) in enumerate(zip(l_outputs, reversed(r_outputs)))]
        return outputs, [l_states, r_states]


class BaseConvRNNCell(BaseRNNCell):
    """Base class of the convolutional cells: the input-to-state and state-to-state transforms
    are convolutions (the state keeps the spatial size the input convolution gives)."""

    def __init__(self, input_shape, num_hidden, h2h_kernel, h2h_dilate, i2h_kernel, i2h_stride, i2h_pad,
                 i2h_dilate, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                 h2h_bias_initializer, activation, prefix="", params=None, conv_layout="NCHW"):
        super().__init__(prefix=prefix, params=params)
        if h2h_kernel[0] % 2 != 1 or h2h_kernel[1] % 2 != 1:
            raise AssertionError("Only support odd number, get h2h_kernel= %s" % str(h2h_kernel))
        self._h2h_kernel = h2h_kernel
        # "Same" padding, so the state keeps its spatial size from step to step.
        self._h2h_pad = (h2h_dilate[0] * (h2h_kernel[0] - 1) // 2, h2h_dilate[1] * (h2h_kernel[1] - 1) // 2)
        self._h2h_dilate = h2h_dilate
        self._i2h_kernel = i2h_kernel
        self._i2h_stride = i2h_stride
        self._i2h_pad = i2h_pad
        self._i2h_dilate = i2h_dilate
        self._num_hidden = num_hidden
        self._input_shape = input_shape
        self._conv_layout = conv_layout
        self._activation = activation

        probe = symbol.Convolution(data=symbol.Variable("data"), num_filter=num_hidden, kernel=i2h_kernel,
                                   stride=i2h_stride, pad=i2h_pad, dilate=i2h_dilate, layout=conv_layout)
        state_shape = probe.infer_shape(data=input_shape)[1][0]
        self._state_shape = (0,) + tuple(state_shape[1:])

        self._iW = self.params.get("i2h_weight", init=i2h_weight_initializer)
        self._hW = self.params.get("h2h_weight", init=h2h_weight_initializer)
        self._iB = self.params.get("i2h_bias", init=i2h_bias_initializer)
        self._hB = self.params.get("h2h_bias", init=h2h_bias_initializer)

    @property
    def _num_gates(self):
        return len(self._gate_names)

    def _state(self):
        return {"shape": self._state_shape, "__layout__": self._conv_layout}

    @property
    def state_info(self):
        return [self._state(), self._state()]

    def _conv_forward(self, inputs, states, name):
        filters = self._num_hidden * self._num_gates
        i2h = symbol.Convolution(name="%si2h" % name, data=inputs, num_filter=filters, kernel=self._i2h_kernel,
                                 stride=self._i2h_stride, pad=self._i2h_pad, dilate=self._i2h_dilate,
                                 weight=self._iW, bias=self._iB, layout=self._conv_layout)
        h2h = symbol.Convolution(name="%sh2h" % name, data=states[0], num_filter=filters, kernel=self._h2h_kernel,
                                 dilate=self._h2h_dilate, pad=self._h2h_pad, stride=(1, 1), weight=self._hW,
                                 bias=self._hB, layout=self._conv_layout)
        return i2h, h2h

    def __call__(self, inputs, states):
        raise NotImplementedError("BaseConvRNNCell is abstract class for convolutional RNN")


_LEAKY = functools.partial(symbol.LeakyReLU, act_type="leaky", slope=0.2)


class ConvRNNCell(BaseConvRNNCell):
    """Convolutional Elman cell."""

    def __init__(self, input_shape, num_hidden, h2h_kernel=(3, 3), h2h_dilate=(1, 1), i2h_kernel=(3, 3),
                 i2h_stride=(1, 1), i2h_pad=(1, 1), i2h_dilate=(1, 1), i2h_weight_initializer=None,
                 h2h_weight_initializer=None, i2h_bias_initializer="zeros", h2h_bias_initializer="zeros",
                 activation=_LEAKY, prefix="ConvRNN_", params=None, conv_layout="NCHW"):
        super().__init__(input_shape, num_hidden, h2h_kernel, h2h_dilate, i2h_kernel, i2h_stride, i2h_pad,
                         i2h_dilate, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, activation, prefix=prefix, params=params, conv_layout=conv_layout)

    @property
    def _gate_names(self):
        return ("",)

    @property
    def state_info(self):
        return [self._state()]

    def __call__(self, inputs, states):
        self._counter += 1
        name = "%st%d_" % (self._prefix, self._counter)
        i2h, h2h = self._conv_forward(inputs, states, name)
        output = self._get_activation(i2h + h2h, self._activation, name="%sout" % name)
        return output, [output]


class ConvLSTMCell(BaseConvRNNCell):
    """Convolutional LSTM cell (Shi et al. 2015)."""

    def __init__(self, input_shape, num_hidden, h2h_kernel=(3, 3), h2h_dilate=(1, 1), i2h_kernel=(3, 3),
                 i2h_stride=(1, 1), i2h_pad=(1, 1), i2h_dilate=(1, 1), i2h_weight_initializer=None,
                 h2h_weight_initializer=None, i2h_bias_initializer="zeros", h2h_bias_initializer="zeros",
                 activation=_LEAKY, prefix="ConvLSTM_", params=None, conv_layout="NCHW"):
        super().__init__(input_shape, num_hidden, h2h_kernel, h2h_dilate, i2h_kernel, i2h_stride, i2h_pad,
                         i2h_dilate, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, activation, prefix=prefix, params=params, conv_layout=conv_layout)

    @property
    def _gate_names(self):
        return ["_i", "_f", "_c", "_o"]

    def __call__(self, inputs, states):
        self._counter += 1
        name = "%st%d_" % (self._prefix, self._counter)
        i2h, h2h = self._conv_forward(inputs, states, name)
        gates = symbol.SliceChannel(i2h + h2h, num_outputs=4, axis=self._conv_layout.find("C"),
                                    name="%sslice" % name)
        in_gate = symbol.Activation(gates[0], act_type="sigmoid", name="%si" % name)
        forget_gate = symbol.Activation(gates[1], act_type="sigmoid", name="%sf" % name)
        in_transform = self._get_activation(gates[2], self._activation, name="%sc" % name)
        out_gate = symbol.Activation(gates[3], act_type="sigmoid", name="%so" % name)
        next_c = symbol._internal._plus(forget_gate * states[1], in_gate * in_transform, name="%sstate" % name)
        next_h = symbol._internal._mul(out_gate, self._get_activation(next_c, self._activation),
                                       name="%sout" % name)
        return next_h, [next_h, next_c]


class ConvGRUCell(BaseConvRNNCell):
    """Convolutional GRU cell."""

    def __init__(self, input_shape, num_hidden, h2h_kernel=(3, 3), h2h_dilate=(1, 1), i2h_kernel=(3, 3),
                 i2h_stride=(1, 1), i2h_pad=(1, 1), i2h_dilate=(1, 1), i2h_weight_initializer=None,
                 h2h_weight_initializer=None, i2h_bias_initializer="zeros", h2h_bias_initializer="zeros",
                 activation=_LEAKY, prefix="ConvGRU_", params=None, conv_layout="NCHW"):
        super().__init__(input_shape, num_hidden, h2h_kernel, h2h_dilate, i2h_kernel, i2h_stride, i2h_pad,
                         i2h_dilate, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, activation, prefix=prefix, params=params, conv_layout=conv_layout)

    @property
    def _gate_names(self):
        return ["_r", "_z", "_o"]

    @property
    def state_info(self):
        return [self._state()]

    def __call__(self, inputs, states):
        self._counter += 1
        name = "%st%d_" % (self._prefix, self._counter)
        i2h, h2h = self._conv_forward(inputs, states, name)
        i2h_r, i2h_z, i2h_n = symbol.SliceChannel(i2h, num_outputs=3, name="%s_i2h_slice" % name)
        h2h_r, h2h_z, h2h_n = symbol.SliceChannel(h2h, num_outputs=3, name="%s_h2h_slice" % name)
        reset_gate = symbol.Activation(i2h_r + h2h_r, act_type="sigmoid", name="%s_r_act" % name)
        update_gate = symbol.Activation(i2h_z + h2h_z, act_type="sigmoid", name="%s_z_act" % name)
        candidate = self._get_activation(i2h_n + reset_gate * h2h_n, self._activation, name="%s_h_act" % name)
        next_h = symbol._internal._plus((1.0 - update_gate) * candidate, update_gate * states[0],
                                        name="%sout" % name)
        return next_h, [next_h]
