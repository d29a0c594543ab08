"""The casts ``amp.init`` puts in front of operators.

Each operator AMP's lists name gets a policy that casts its inputs before it runs: to the target
dtype, to float32, or to the widest float type among them (``amp_multicast`` for symbols). The
policies sit in the NDArray and Symbol call paths, so the generated ``mx.nd``/``mx.sym``
functions, arithmetic and fluent methods all go through them, as they go through the patched
module functions in MXNet.
"""

import logging

import numpy as np

from ... import _core
from ...base import bfloat16, dtype_name
from ...ndarray import NDArray
from ...ndarray import ndarray as _ndarray_module
from ...symbol import Symbol
from ...symbol import symbol as _symbol_module


def _device_floats(array):
    """The float types AMP casts between on ``array``'s device (MXNet: bfloat16 on CPU, float16
    on GPU, float32 on both)."""
    return (bfloat16, np.float32) if array.context.device_type == "cpu" else (np.float16, np.float32)


def _amp_cast_array(array, dtype):
    return _core.invoke("amp_cast", (array,), {"dtype": dtype_name(dtype)}, None)


def cast_array(value, dtype):
    """``value`` in ``dtype`` if it is an array of another float type AMP casts on its device."""
    if isinstance(value, NDArray) and value.dtype != dtype and value.dtype in _device_floats(value):
        return _amp_cast_array(value, dtype)
    return value


def _condition_met(condition, kwargs):
    """Whether a conditional float32 operator was called with one of the listed values."""
    if condition is None:
        return True
    param, values = condition
    return param in kwargs and kwargs[param] in values


def _keeps_dtype(fp32_params, position):
    """Whether the input at ``position`` (an index or a keyword) stays as it is."""
    if not fp32_params:
        return False
    if isinstance(position, int):
        return position < len(fp32_params) and bool(fp32_params[position])
    return position in fp32_params


# ---- NDArray policies: (args, kwargs) -> (args, kwargs) ------------------------------------------

def _array_casts(dtype, fp32_params=None, condition=None):
    def policy(args, kwargs):
        if not _condition_met(condition, kwargs):
            return args, kwargs
        args = tuple(x if _keeps_dtype(fp32_params, i) else cast_array(x, dtype) for i, x in enumerate(args))
        kwargs = {k: v if _keeps_dtype(fp32_params, k) else cast_array(v, dtype) for k, v in kwargs.items()}
        return args, kwargs
    return policy


def _array_widest(target_dtype):
    def policy(args, kwargs):
        arrays = [x for x in list(args) + list(kwargs.values()) if isinstance(x, NDArray)]
        widest = np.float32 if any(a.dtype == np.float32 for a in arrays) else target_dtype

        def recast(x):
            if isinstance(x, NDArray) and x.dtype != widest and x.dtype == target_dtype:
                return _amp_cast_array(x, widest)
            return x
        return tuple(recast(x) for x in args), {k: recast(v) for k, v in kwargs.items()}
    return policy


def _array_loss_scaling(loss_scaler):
    def policy(args, kwargs):
        kwargs = dict(kwargs)
        kwargs["grad_scale"] = kwargs.get("grad_scale", 1.0) * loss_scaler.loss_scale
        return args, kwargs
    return policy


# ---- Symbol policies: (op_name, args, kwargs, build, create) -> Symbol -----------------------------
# ``build(args, kwargs)`` makes the operator's node (through the policies listed before this one);
# ``create(op_name, *args, **kwargs)`` makes any node directly (the casts).

def _symbol_casts(dtype, fp32_params=None, condition=None):
    dtype = dtype_name(dtype)

    def policy(_op_name, args, kwargs, build, create):
        node = build(args, kwargs)
        if not _condition_met(condition, kwargs):
            return node
        children = node.get_children()
        if children is None:
            return node
        aux = set(node.list_auxiliary_states())
        atomic = node._gen_atomic_symbol()
        inputs = {}
        for position, (name, child) in enumerate(zip(atomic.list_inputs(), children)):
            keep = child.name in aux or _keeps_dtype(fp32_params, position)
            inputs[name] = child if keep else create("amp_cast", child, dtype=dtype)
        return atomic(**inputs)
    return policy


def _symbol_widest():
    def policy(_op_name, args, kwargs, build, create):
        args, kwargs = list(args), dict(kwargs)
        slots = [(args, i) for i, a in enumerate(args) if isinstance(a, (Symbol, NDArray))]
        slots += [(kwargs, k) for k, v in kwargs.items() if isinstance(v, (Symbol, NDArray))]
        inputs = [container[key] for container, key in slots]
        if any(isinstance(x, Symbol) for x in inputs):
            cast = create("amp_multicast", *inputs, num_outputs=len(inputs))
            for (container, key), output in zip(slots, cast):
                container[key] = output
        return build(tuple(args), kwargs)
    return policy


def _symbol_loss_warning():
    def policy(op_name, args, kwargs, build, _create):
        logging.warning("%s does not support dynamic loss scaling in symbolic and hybridized execution.", op_name)
        return build(args, kwargs)
    return policy


# ---- installation --------------------------------------------------------------------------------

def _registered_names():
    return {spelling for name, aliases, *_ in _core.list_ops() for spelling in [name, *aliases]}


def install(target_dtype, target_ops, fp32_ops, conditional_fp32_ops, widest_ops, fp32_params, loss_outputs,
            loss_scaler):
    """Put the casts in the NDArray and Symbol call paths. ``target_dtype`` is a NumPy dtype
    (MXNet's ``bfloat16`` record dtype for bfloat16); the lists name operators as programs call
    them. Raises AttributeError for a name that is no registered operator."""
    array_policies, symbol_policies = {}, {}
    known = _registered_names()

    def add(name, array_policy, symbol_policy):
        if name not in known:
            raise AttributeError("amp.init: no operator is named '%s'" % name)
        # A later policy wraps the earlier ones of the same operator (MXNet wraps the wrapped
        # function again).
        array_policies.setdefault(name, []).insert(0, array_policy)
        symbol_policies.setdefault(name, []).append(symbol_policy)

    for name in target_ops:
        params = (fp32_params or {}).get(name)
        add(name, _array_casts(target_dtype, params), _symbol_casts(target_dtype, params))
    for name in fp32_ops:
        add(name, _array_casts(np.float32), _symbol_casts(np.float32))
    for name, param, values in conditional_fp32_ops:
        add(name, _array_casts(np.float32, condition=(param, values)),
            _symbol_casts(np.float32, condition=(param, values)))
    for name in widest_ops:
        add(name, _array_widest(target_dtype), _symbol_widest())
    for name in loss_outputs:
        if name in known:
            add(name, _array_loss_scaling(loss_scaler), _symbol_loss_warning())

    def invoke(name, args, kwargs=None, out=None):
        policies = array_policies.get(name)
        if policies is not None:
            kwargs = kwargs or {}
            for policy in policies:
                args, kwargs = policy(args, kwargs)
        return _core.invoke(name, args, kwargs or None, out)

    create = _symbol_module._create_node

    def create_symbol(op_name, args, kwargs):
        build = lambda a, k: create(op_name, *a, **k)  # noqa: E731
        for policy in symbol_policies.get(op_name, ()):
            build = (lambda p, inner: lambda a, k: p(op_name, a, k, inner, create))(policy, build)
        return build(tuple(args), kwargs)

    _ndarray_module._route_operators(invoke)
    _symbol_module._operator_hook = create_symbol
