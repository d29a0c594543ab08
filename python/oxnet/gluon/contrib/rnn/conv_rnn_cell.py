"""Convolutional recurrent cells (MXNet's ``gluon.contrib.rnn.Conv{1,2,3}D{RNN,LSTM,GRU}Cell``,
Shi et al. 2015): the input-to-state and state-to-state products of the RNN, LSTM and GRU cells
become convolutions, so inputs and states are feature maps (channels first: 'NCW', 'NCHW',
'NCDHW'). The state-to-state convolution keeps the state's spatial shape (odd kernel, padded);
the input-to-state one, at stride 1 with ``i2h_pad`` and ``i2h_dilate``, gives that shape. The
gate arithmetic is the dense cells' own."""

from ...rnn.rnn_cell import GRUCell, HybridRecurrentCell, LSTMCell, RNNCell

__all__ = ["Conv1DRNNCell", "Conv2DRNNCell", "Conv3DRNNCell", "Conv1DLSTMCell", "Conv2DLSTMCell",
           "Conv3DLSTMCell", "Conv1DGRUCell", "Conv2DGRUCell", "Conv3DGRUCell"]

_LAYOUTS = {1: "NCW", 2: "NCHW", 3: "NCDHW"}


def _per_axis(value, dims, what):
    values = (value,) * dims if isinstance(value, int) else tuple(value)
    if len(values) != dims:
        raise ValueError("%s must have %d value(s) for a %dD convolutional cell, got %s" % (what, dims, dims, value))
    return values


class _ConvCell(HybridRecurrentCell):
    """What every convolutional cell adds to its dense cell: parameters shaped as convolution
    weights and the two projections as convolutions. ``input_shape`` is one example's shape,
    channels first; a channel count of 0 is inferred from the first input."""

    def __init__(self, input_shape, hidden_channels, i2h_kernel, h2h_kernel, i2h_pad, i2h_dilate, h2h_dilate,
                 i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer, h2h_bias_initializer,
                 dims, conv_layout, gates, prefix, params):
        HybridRecurrentCell.__init__(self, prefix=prefix, params=params)
        if conv_layout != _LAYOUTS[dims]:
            raise ValueError("%s: conv_layout %r is not supported; use %r (channels first)"
                             % (self.__class__.__name__, conv_layout, _LAYOUTS[dims]))
        input_shape = tuple(input_shape)
        if len(input_shape) != dims + 1:
            raise ValueError("%s: input_shape must be (channels, %d spatial sizes), got %s"
                             % (self.__class__.__name__, dims, input_shape))
        self._hidden_size = hidden_channels
        self._rows = rows = gates * hidden_channels
        self._input_shape = input_shape
        self._conv_layout = conv_layout
        self._i2h_kernel = _per_axis(i2h_kernel, dims, "i2h_kernel")
        self._h2h_kernel = _per_axis(h2h_kernel, dims, "h2h_kernel")
        if any(k % 2 == 0 for k in self._h2h_kernel):
            raise ValueError("%s: h2h_kernel must be odd (the state keeps its shape), got %s"
                             % (self.__class__.__name__, self._h2h_kernel))
        self._i2h_pad = _per_axis(i2h_pad, dims, "i2h_pad")
        self._i2h_dilate = _per_axis(i2h_dilate, dims, "i2h_dilate")
        self._h2h_dilate = _per_axis(h2h_dilate, dims, "h2h_dilate")
        self._h2h_pad = tuple(d * (k - 1) // 2 for d, k in zip(self._h2h_dilate, self._h2h_kernel))
        self._state_shape = (hidden_channels,) + tuple(
            size + 2 * pad - dilate * (kernel - 1)
            for size, pad, dilate, kernel in zip(input_shape[1:], self._i2h_pad, self._i2h_dilate, self._i2h_kernel))
        if any(size <= 0 for size in self._state_shape[1:]):
            raise ValueError("%s: i2h_kernel %s leaves no state for inputs of shape %s"
                             % (self.__class__.__name__, self._i2h_kernel, input_shape))
        self.i2h_weight = self.params.get("i2h_weight", shape=(rows, input_shape[0]) + self._i2h_kernel,
                                          init=i2h_weight_initializer, allow_deferred_init=True)
        self.h2h_weight = self.params.get("h2h_weight", shape=(rows, hidden_channels) + self._h2h_kernel,
                                          init=h2h_weight_initializer, allow_deferred_init=True)
        self.i2h_bias = self.params.get("i2h_bias", shape=(rows,), init=i2h_bias_initializer, allow_deferred_init=True)
        self.h2h_bias = self.params.get("h2h_bias", shape=(rows,), init=h2h_bias_initializer, allow_deferred_init=True)

    def state_info(self, batch_size=0):
        return [{"shape": (batch_size,) + self._state_shape, "__layout__": self._conv_layout}
                for _ in range(self._num_states)]

    def __repr__(self):
        return "%s(%s -> %s, i2h_kernel=%s, h2h_kernel=%s)" % (self.__class__.__name__, self._input_shape,
                                                               self._state_shape, self._i2h_kernel, self._h2h_kernel)

    def _projections(self, F, inputs, state, i2h_weight, h2h_weight, i2h_bias, h2h_bias):
        prefix = "t%d_" % self._counter
        i2h = F.Convolution(data=inputs, weight=i2h_weight, bias=i2h_bias, num_filter=self._rows,
                            kernel=self._i2h_kernel, pad=self._i2h_pad, dilate=self._i2h_dilate,
                            layout=self._conv_layout, name=prefix + "i2h")
        h2h = F.Convolution(data=state, weight=h2h_weight, bias=h2h_bias, num_filter=self._rows,
                            kernel=self._h2h_kernel, pad=self._h2h_pad, dilate=self._h2h_dilate,
                            layout=self._conv_layout, name=prefix + "h2h")
        return prefix, i2h, h2h


def _cell_class(name, dims, dense, gates, num_states):
    """A convolutional cell class: `_ConvCell`'s parameters and projections, `dense`'s gates."""

    def __init__(self, input_shape, hidden_channels, i2h_kernel, h2h_kernel, i2h_pad=(0,) * dims,
                 i2h_dilate=(1,) * dims, h2h_dilate=(1,) * dims, i2h_weight_initializer=None,
                 h2h_weight_initializer=None, i2h_bias_initializer="zeros", h2h_bias_initializer="zeros",
                 conv_layout=_LAYOUTS[dims], activation="tanh", prefix=None, params=None):
        _ConvCell.__init__(self, input_shape, hidden_channels, i2h_kernel, h2h_kernel, i2h_pad, i2h_dilate,
                           h2h_dilate, i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                           h2h_bias_initializer, dims, conv_layout, gates, prefix, params)
        self._activation = activation
        self._recurrent_activation = "sigmoid"

    doc = ("%dD convolutional %s cell: ``%s`` with convolutions for its input-to-state and "
           "state-to-state products. %s" % (dims, dense.__name__[:-4], dense.__name__, "States ``[h, c]``." if num_states == 2 else "States ``[h]``."))
    return type(name, (_ConvCell, dense), {"__init__": __init__, "__doc__": doc, "_num_states": num_states,
                                           "_alias": lambda self: "conv_" + dense._alias(self)})


Conv1DRNNCell = _cell_class("Conv1DRNNCell", 1, RNNCell, 1, 1)
Conv2DRNNCell = _cell_class("Conv2DRNNCell", 2, RNNCell, 1, 1)
Conv3DRNNCell = _cell_class("Conv3DRNNCell", 3, RNNCell, 1, 1)
Conv1DLSTMCell = _cell_class("Conv1DLSTMCell", 1, LSTMCell, 4, 2)
Conv2DLSTMCell = _cell_class("Conv2DLSTMCell", 2, LSTMCell, 4, 2)
Conv3DLSTMCell = _cell_class("Conv3DLSTMCell", 3, LSTMCell, 4, 2)
Conv1DGRUCell = _cell_class("Conv1DGRUCell", 1, GRUCell, 3, 1)
Conv2DGRUCell = _cell_class("Conv2DGRUCell", 2, GRUCell, 3, 1)
Conv3DGRUCell = _cell_class("Conv3DGRUCell", 3, GRUCell, 3, 1)
