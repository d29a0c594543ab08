"""Symbolic API (MXNet's ``mxnet.symbol``); operator functions come from the registry."""

import sys
import types

from .. import _core
from .symbol import Symbol, var, Variable, Group, load, load_json, zeros, ones, full, arange, _operator_function
from .executor import Executor
from ..ndarray import register as _register
from ..ndarray.register import _docstring

_namespaces = _register.namespace_modules(__name__)
globals().update(_namespaces)  # _internal, contrib, linalg, image
random = types.ModuleType(__name__ + ".random", "Random sampling operators.")
sys.modules[random.__name__] = random

_OPERATORS = {}
for _name, _aliases, _doc, _variadic, _params in _core.list_ops():
    _full_doc = _docstring(_name, _doc, _params, _aliases)
    for _callable_name in [_name] + list(_aliases):
        _fn = _operator_function(_callable_name, _full_doc)
        _OPERATORS[_callable_name] = _fn
        if _callable_name.startswith("_random_"):
            random.__dict__[_callable_name[len("_random_"):]] = _fn
        _register.place(_callable_name, _fn, globals(), _namespaces)


def _fluent_operator(name):
    """The operator a fluent method ``symbol.<name>(...)`` stands for, if any."""
    if name.startswith("_"):
        return None
    return _OPERATORS.get(name)


def _make_helper(name, ops):
    array_op, scalar_op, rscalar_op = ops

    def helper(lhs, rhs):
        from .symbol import _create
        if isinstance(lhs, Symbol) and isinstance(rhs, Symbol):
            return _create(array_op, lhs, rhs)
        if isinstance(rhs, Symbol):
            return _create(rscalar_op, rhs, scalar=float(lhs))
        return _create(scalar_op, lhs, scalar=float(rhs))
    helper.__name__ = name
    return helper


from ..ndarray.ndarray import _HELPERS  # noqa: E402

for _helper_name, _helper_ops in _HELPERS.items():
    globals()[_helper_name] = _make_helper(_helper_name, _helper_ops)

from . import control_flow as _control_flow  # noqa: E402
contrib.foreach, contrib.while_loop, contrib.cond = _control_flow.foreach, _control_flow.while_loop, _control_flow.cond  # noqa: F821
