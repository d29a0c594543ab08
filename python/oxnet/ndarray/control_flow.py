"""Imperative control flow (MXNet's ``mx.nd.contrib.foreach / while_loop / cond``).

The loops run in Python and call ordinary operators, so autograd records every iteration and
gradients flow through them like through any other code.
"""

from ..base import _as_list
from .ndarray import NDArray

__all__ = ["foreach", "while_loop", "cond"]


def _flatten(args, inout_str):
    """A (nested) list of arrays as a flat list, and its format for ``_regroup``."""
    if isinstance(args, NDArray):
        return [args], 0
    if not isinstance(args, (list, tuple)):
        raise AssertionError("%s must be (nested) list of NDArray, but got %s of type %s" % (inout_str, args, type(args)))
    flat, fmts = [], []
    for item in args:
        arg, fmt = _flatten(item, inout_str)
        flat.extend(arg)
        fmts.append(fmt)
    return flat, fmts


def _regroup(args, fmt):
    """Rebuild what ``_flatten`` flattened: (the structure, the flat items left over)."""
    if isinstance(fmt, int):
        if fmt == 0:
            return args[0], args[1:]
        return args[:fmt], args[fmt:]
    ret = []
    for sub in fmt:
        res, args = _regroup(args, sub)
        ret.append(res)
    return ret, args


def _check_arrays(items, message):
    if not all(isinstance(item, NDArray) for item in items):
        raise AssertionError(message)


def _to_python_scalar(value, type_, name):
    if hasattr(value, "asscalar"):
        value = value.asscalar()
    try:
        return type_(value)
    except (TypeError, ValueError):
        raise ValueError("Cannot convert %s to python %s" % (name, type_.__name__))


def foreach(body, data, init_states):
    """Run ``body`` on each slice of ``data`` along axis 0, carrying states.

    ``out, states = body(data_slice, states)`` per iteration; the outputs of all iterations are
    stacked along a new axis 0, the states of the last iteration are returned as given by
    ``body``. ``data`` is an NDArray or a list of NDArrays (then ``body`` gets a list of slices).
    """
    flat_data, _ = _flatten(data, "foreach input")
    _check_arrays(flat_data, "data should be an NDArray or a nested list of NDArrays")
    flat_states, _ = _flatten(init_states, "foreach states")
    _check_arrays(flat_states, "init_states should be an NDArray or a nested list of NDArrays")

    single_data = isinstance(data, NDArray)
    num_iters = data.shape[0] if single_data else data[0].shape[0]
    states = init_states
    per_step = []
    out_fmt = []
    for i in range(num_iters):
        slices = data[i] if single_data else [d[i] for d in data]
        outs, states = body(slices, states)
        outs, out_fmt = _flatten(outs, "foreach output")
        per_step.append(outs)
    from . import stack
    outputs = [stack(*items) for items in zip(*per_step)]
    outputs, _ = _regroup(outputs, out_fmt)
    return outputs, states


def while_loop(cond, func, loop_vars, max_iterations=None):
    """Run ``func`` while ``cond`` holds, at most ``max_iterations`` times.

    ``cond(*loop_vars)`` gives a scalar; ``func(*loop_vars)`` gives ``(step_output,
    new_loop_vars)``. Returns the step outputs stacked along axis 0 and padded with zeros to
    ``max_iterations`` rows, and the final loop variables (an NDArray when ``loop_vars`` was one).
    When ``cond`` is false at once, the outputs are an empty list (their shapes are unknown).
    """
    def _func_wrapper(current):
        step_output, new_loop_vars = func(*current)
        if step_output is None:
            step_output = []
        if new_loop_vars is None:
            new_loop_vars = []
        if isinstance(step_output, tuple):
            step_output = list(step_output)
        if isinstance(new_loop_vars, tuple):
            new_loop_vars = list(new_loop_vars)
        new_loop_vars = _as_list(new_loop_vars)
        if len(current) != len(new_loop_vars):
            raise ValueError("The length of loop_vars should be consistent during the loop")
        return step_output, new_loop_vars

    if max_iterations is None:
        raise ValueError("max_iterations should be specified")
    max_iterations = _to_python_scalar(max_iterations, int, "max_iteration")
    if len(loop_vars) == 0:
        raise ValueError("loop_vars should contain at least one element")

    steps = 0
    outputs = []
    out_fmt = None
    single_var = isinstance(loop_vars, NDArray)
    loop_vars = _as_list(loop_vars)
    while steps < max_iterations and _to_python_scalar(cond(*loop_vars), bool, "Return value of cond"):
        step_output, loop_vars = _func_wrapper(loop_vars)
        step_output, out_fmt = _flatten(step_output, "while output")
        outputs.append(step_output)
        steps += 1
        if len(step_output) != len(outputs[0]):
            raise ValueError("Number of elements in step_output should be the same in each step")
    from . import concat, zeros
    stacked = []
    for i_th, items in enumerate(zip(*outputs), 1):
        items = [x.expand_dims(0) for x in items]
        if steps != max_iterations and items:
            pad_shape = [max_iterations - steps] + list(items[0].shape[1:])
            items.append(zeros(pad_shape, ctx=items[0].context, dtype=items[0].dtype))
        try:
            stacked.append(concat(*items, dim=0))
        except Exception:
            raise ValueError("\n".join(
                ["Shapes of %d-th elements in step_outputs are inconsistent, which are:" % i_th] +
                ["  Step %d, shape is %s" % (i, str(x.shape)) for i, x in enumerate(items)]))
    if out_fmt is not None:
        stacked, _ = _regroup(stacked, out_fmt)
    if single_var:
        loop_vars = loop_vars[0]
    return stacked, loop_vars


def cond(pred, then_func, else_func):
    """``then_func()`` if the scalar ``pred`` is non-zero, else ``else_func()``."""
    if _to_python_scalar(pred, bool, "pred"):
        return then_func()
    return else_func()
