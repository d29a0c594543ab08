"""The early autograd API of MXNet (``mxnet.contrib.autograd``), kept for old programs.

Here one flag, "training", meant both "record operations for differentiation" and "run operators
in training mode" (Dropout drops, BatchNorm uses batch statistics); ``mx.autograd`` later split it
into ``record`` and ``train_mode``. Everything is built on ``mx.autograd``.
"""

import functools

from .. import autograd as _autograd
from ..ndarray import NDArray, zeros_like

__all__ = ["set_is_training", "TrainingStateScope", "train_section", "test_section", "mark_variables",
           "backward", "compute_gradient", "grad_and_loss", "grad"]


def set_is_training(is_train):
    """Turn recording and training mode on or off together; returns the previous recording state
    (as MXNet, which reports recording, the state that decides whether a graph is built)."""
    _autograd.set_training(is_train)
    return _autograd.set_recording(is_train)


class TrainingStateScope:
    """``with`` scope that sets recording and training mode on entry and restores both on exit."""

    def __init__(self, enter_state):
        self._enter_state = bool(enter_state)
        self._prev_recording = None
        self._prev_training = None

    def __enter__(self):
        self._prev_training = _autograd.set_training(self._enter_state)
        self._prev_recording = _autograd.set_recording(self._enter_state)
        return self

    def __exit__(self, ptype, value, trace):
        _autograd.set_training(self._prev_training)
        _autograd.set_recording(self._prev_recording)


def train_section():
    """Scope in which operations are recorded and operators run in training mode."""
    return TrainingStateScope(True)


def test_section():
    """Scope in which nothing is recorded and operators run in inference mode (nests inside
    ``train_section`` for evaluation or updates in the middle of a training step)."""
    return TrainingStateScope(False)


def mark_variables(variables, gradients, grad_reqs="write"):
    """Attach gradient buffers to arrays (``grad_reqs``: 'write', 'add' or 'null', one or per array)."""
    _autograd.mark_variables(variables, gradients, grad_reqs)


def backward(outputs, out_grads=None, retain_graph=False):
    """Differentiate ``outputs`` (a list or tuple) into the marked variables' gradient buffers;
    ``out_grads`` gives each output's head gradient (None for ones)."""
    if not isinstance(outputs, (list, tuple)):
        raise TypeError("backward: outputs must be a list or tuple of NDArrays, got %s" % type(outputs).__name__)
    if out_grads is not None and len(out_grads) != len(outputs):
        raise ValueError("backward: %d outputs but %d out_grads; they must have the same length"
                         % (len(outputs), len(out_grads)))
    _autograd.backward(list(outputs), None if out_grads is None else list(out_grads),
                       retain_graph=retain_graph, train_mode=True)


def compute_gradient(outputs):
    """Deprecated name of ``backward(outputs)``."""
    backward(outputs)


def grad_and_loss(func, argnum=None):
    """Wrap ``func`` so that a call returns ``(gradients, outputs)``: the gradients of its outputs
    with respect to the arguments at ``argnum`` (an index or a list of them; all by default)."""

    @functools.wraps(func)
    def wrapped(*args):
        variables = args
        if argnum is not None:
            indices = argnum if isinstance(argnum, list) else [argnum]
            variables = [args[i] for i in indices]
        for variable in variables:
            if not isinstance(variable, NDArray):
                raise TypeError("grad_and_loss: differentiated arguments must be NDArrays, got %s"
                                % type(variable).__name__)
        grads = [zeros_like(variable) for variable in variables]
        mark_variables(variables, grads)
        with train_section():
            outputs = func(*args)
        compute_gradient([outputs] if isinstance(outputs, NDArray) else outputs)
        return grads, outputs

    return wrapped


def grad(func, argnum=None):
    """Wrap ``func`` so that a call returns only the gradients of ``grad_and_loss``."""
    grad_with_loss = grad_and_loss(func, argnum)

    @functools.wraps(grad_with_loss)
    def wrapped(*args):
        return grad_with_loss(*args)[0]

    return wrapped
