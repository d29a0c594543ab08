"""Imperative differentiation with MXNet 1.x semantics (``mx.autograd``).

Operations on arrays that belong to a graph (marked with ``attach_grad`` or ``mark_variables``)
are recorded while ``record()`` is active; ``backward`` / ``grad`` run the gradient pass on the
recorded graph. Gradients are graphs of registered operators, computed by the same engine.
"""

from . import _core
from .ndarray.ndarray import NDArray


def set_recording(is_recording):
    """Set whether operations are recorded; returns the previous state."""
    return _core.set_recording(bool(is_recording))


def set_training(train_mode):
    """Set training mode (affects Dropout, BatchNorm); returns the previous state."""
    return _core.set_training(bool(train_mode))


def is_recording():
    return _core.is_recording()


def is_training():
    return _core.is_training()


class _RecordingStateScope:
    """Sets recording and training flags on entry and restores them on exit."""

    def __init__(self, is_record, train_mode):
        self._enter_is_record = is_record
        self._enter_train_mode = train_mode
        self._prev_is_record = None
        self._prev_train_mode = None

    def __enter__(self):
        if self._enter_is_record is not None:
            self._prev_is_record = set_recording(self._enter_is_record)
        if self._enter_train_mode is not None:
            self._prev_train_mode = set_training(self._enter_train_mode)
        return self

    def __exit__(self, ptype, value, trace):
        if self._enter_is_record is not None and self._prev_is_record != self._enter_is_record:
            set_recording(self._prev_is_record)
        if self._enter_train_mode is not None and self._prev_train_mode != self._enter_train_mode:
            set_training(self._prev_train_mode)


def record(train_mode=True):
    """Scope in which operations are recorded for differentiation."""
    return _RecordingStateScope(True, train_mode)


def pause(train_mode=False):
    """Scope in which recording is off (e.g. to compute metrics inside ``record``)."""
    return _RecordingStateScope(False, train_mode)


def train_mode():
    """Scope in which operators behave as in training, without changing recording."""
    return _RecordingStateScope(None, True)


def predict_mode():
    """Scope in which operators behave as in inference, without changing recording."""
    return _RecordingStateScope(None, False)


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def mark_variables(variables, gradients, grad_reqs="write"):
    """Mark arrays as variables whose gradients are stored into ``gradients``."""
    variables, gradients = _as_list(variables), _as_list(gradients)
    if isinstance(grad_reqs, str):
        grad_reqs = [grad_reqs] * len(variables)
    marked = _core.mark_variables([v.handle for v in variables], [g.handle for g in gradients], list(grad_reqs))
    for var, handle in zip(variables, marked):
        var.handle = handle


def _head_grads(heads, head_grads):
    if head_grads is None:
        return [None] * len(heads)
    head_grads = _as_list(head_grads)
    if len(head_grads) != len(heads):
        raise ValueError("heads and head_grads must have the same length")
    return [None if g is None else g.handle for g in head_grads]


def backward(heads, head_grads=None, retain_graph=False, train_mode=True):
    """Compute the gradients of ``heads`` with respect to the marked variables."""
    heads = _as_list(heads)
    _core.backward([h.handle for h in heads], _head_grads(heads, head_grads), None,
                   bool(retain_graph), False, bool(train_mode))


def grad(heads, variables, head_grads=None, retain_graph=None, create_graph=False, train_mode=True):
    """Return the gradients of ``heads`` with respect to ``variables`` (without touching ``.grad``).

    With ``create_graph=True`` the gradient computation is itself recorded, so the results can be
    differentiated again (higher-order gradients).
    """
    heads = _as_list(heads)
    variables = _as_list(variables)
    if retain_graph is None:
        retain_graph = create_graph
    handles = _core.backward([h.handle for h in heads], _head_grads(heads, head_grads),
                             [v.handle for v in variables], bool(retain_graph), bool(create_graph),
                             bool(train_mode))
    return [NDArray(h) for h in handles]


def to_dot(heads, title="autograd"):
    """Graphviz DOT text of the graph recorded for ``heads`` (an oxnet extension for teaching:
    render it with ``dot -Tsvg``, or view it as a tape of recorded operators)."""
    return _core.graph_dot([h.handle for h in _as_list(heads)], title)


def get_symbol(x):
    """The graph recorded for ``x`` as a Symbol (inputs become variables ``var0``, ``var1``, ...)."""
    from .symbol import Symbol
    return Symbol(_core.recorded_symbol([h.handle for h in _as_list(x)]))


class Function:
    """A differentiable operation with forward and backward written in Python (MXNet's
    ``autograd.Function``). Subclass it, implement ``forward`` and ``backward``, and call an
    instance once; ``save_for_backward`` keeps arrays for ``backward`` in ``saved_tensors``."""

    def __init__(self):
        self._used = False
        self.saved_tensors = ()

    def save_for_backward(self, *args):
        self.saved_tensors = args

    def __call__(self, *inputs):
        if self._used:
            raise RuntimeError("Each Function instance can only be called once. Please create another instance.")
        self._used = True
        with pause(train_mode=is_training()):
            outputs = self.forward(*inputs)
        single = isinstance(outputs, NDArray)
        outs = [outputs] if single else list(outputs)
        if is_recording():
            handles = _core.record_function(self, [x.handle for x in inputs], [o.handle for o in outs])
            for out, handle in zip(outs, handles):
                out.handle = handle
        return outs[0] if single else outs

    def forward(self, *inputs):
        raise NotImplementedError

    def backward(self, *output_grads):
        raise NotImplementedError
