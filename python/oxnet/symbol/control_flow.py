"""Symbolic control flow (MXNet's ``mx.sym.contrib.foreach / while_loop / cond``).

The user's Python function is called once on new variables inside an ``AttrScope`` that marks
every node it builds with ``__subgraph_name__``; that part of the graph is cut from the rest
(values it reads from outside become new variables) and held by one ``_foreach``,
``_while_loop`` or ``_cond`` node, which runs it per iteration. The outside values become the
node's inputs. Inputs are matched by identity, not by name, so two inputs that happen to share
a name (two outputs of one node) stay apart.
"""

import copy

from .. import _core
from ..ndarray.control_flow import _regroup  # the same structure rebuilding for symbols
from ..attribute import AttrScope, current as _current_attr_scope
from ..name import NameManager
from .symbol import Symbol, Group, var, _create

__all__ = ["foreach", "while_loop", "cond"]

_SUBGRAPH_ATTR = "__subgraph_name__"


def _flatten(args, inout_str):
    """A (nested) list of symbols as a flat list of single-output symbols, and its format."""
    if isinstance(args, Symbol):
        length = len(args)
        if length > 1:
            return [args[i] for i in range(length)], length
        return [args], 0
    if not isinstance(args, (list, tuple)):
        raise AssertionError("%s must be (nested) list of Symbol, but got %s of type %s" % (inout_str, args, type(args)))
    flat, fmts = [], []
    for item in args:
        arg, fmt = _flatten(item, inout_str)
        flat.extend(arg)
        fmts.append(fmt)
    return flat, fmts


def _check_symbols(items, message):
    if not all(isinstance(item, Symbol) for item in items):
        raise AssertionError(message)


def _key(symbol):
    """The identity of a single-output symbol's value."""
    return symbol.handle.entry_keys()[0]


def _unique_subgraph_name(name):
    """``name`` numbered per use (``foreach0``, ``foreach1``), inside an enclosing subgraph's name."""
    outer = _current_attr_scope()._attr.get(_SUBGRAPH_ATTR, "")
    if outer:
        name = outer + "$" + name
    AttrScope._subgraph_names[name] += 1
    return name + str(AttrScope._subgraph_names[name] - 1)


def _in_scope(symbol, scope):
    return symbol.handle.attr(_SUBGRAPH_ATTR) == scope


def _subgraph_outputs(outputs, scope):
    """The subgraph's outputs, each a node of the subgraph and each distinct: an input, an
    outside value or a repeated value goes through ``identity`` (which the scope marks)."""
    result, seen = [], set()
    for out in outputs:
        if out.handle.op_name() == "null" or not _in_scope(out, scope) or _key(out) in seen:
            out = _create("identity", out)
        seen.add(_key(out))
        result.append(out)
    return Group(result)


def _variable_copy(variable):
    """A new variable with ``variable``'s name and attributes (outside any subgraph scope)."""
    attrs = dict(variable.handle.attr_dict()).get(variable.name, {})
    attrs = {k: v for k, v in attrs.items() if k != _SUBGRAPH_ATTR}
    return Symbol(_core.SymbolHandle.variable(variable.name, attrs))


class _NodeInputs:
    """The inputs of one control flow node, shared by its subgraphs: each outside value once, and
    each variable a subgraph made for itself (a parameter) once, as a copy outside."""

    def __init__(self):
        self.symbols = []
        self._slots = {}

    def slot(self, key, make):
        if key not in self._slots:
            self._slots[key] = len(self.symbols)
            self.symbols.append(make())
        return self._slots[key]


def _cut(graph, scope):
    """The subgraph cut from the rest, its input symbols, and the outside value of each input
    that stands for one (by input key)."""
    handle, pairs = graph.handle.cut_subgraph(scope)
    outside = {var.entry_keys()[0]: Symbol(value) for var, value in pairs}
    return Symbol(handle), [Symbol(h) for h in handle.input_symbols()], outside


def _input_slot(node_inputs, symbol, outside):
    """The node input feeding subgraph input ``symbol`` (an outside value or a made variable)."""
    key = _key(symbol)
    if key in outside:
        value = outside[key]
        return node_inputs.slot(("outside", _key(value)), lambda: value)
    return node_inputs.slot(("variable", key), lambda: _variable_copy(symbol))


def _node(op_name, subgraphs, inputs, attrs):
    name = NameManager.current.get(None, op_name)
    annotations = dict(_current_attr_scope().get(None))
    attrs = {k: str(v) for k, v in attrs.items()}
    attrs.update(annotations)
    return Symbol(_core.SymbolHandle.create_with_subgraphs(
        op_name, name, [g.handle for g in subgraphs], [s.handle for s in inputs], attrs))


def foreach(body, data, init_states, name="foreach"):
    """Run ``body`` over ``data`` along axis 0 as one ``_foreach`` graph node.

    ``out, states = body(data_slice, states)``; returns the outputs of all iterations stacked
    along axis 0 and the final states, in the formats ``body`` gives them.
    """
    flat_data, data_fmt = _flatten(data, "foreach input")
    _check_symbols(flat_data, "data should be a symbol or a nested list of symbols")
    flat_states, state_fmt = _flatten(init_states, "foreach states")
    _check_symbols(flat_states, "init_states should be a symbol or a nested list of symbols")

    scope = _unique_subgraph_name(name)
    with AttrScope(**{_SUBGRAPH_ATTR: scope}):
        data_vars = [var(s.name) for s in flat_data]
        state_vars = [var(s.name) for s in flat_states]
        outs, states = body(_regroup(data_vars, data_fmt)[0], _regroup(state_vars, copy.deepcopy(state_fmt))[0])
        flat_out, out_fmt = _flatten(outs, "foreach output")
        flat_new_states, new_state_fmt = _flatten(states, "foreach loop_vars")
        assert state_fmt == new_state_fmt, "The input and output loop_vars have different format"
        _check_symbols(flat_out, "the output should be an NDArray or a nested list of NDArrays")
        _check_symbols(flat_new_states, "the output states should be an NDArray or a nested list of NDArrays")
        graph = _subgraph_outputs(flat_out + flat_new_states, scope)

    graph, graph_inputs, outside = _cut(graph, scope)
    position = {_key(s): i for i, s in enumerate(graph_inputs)}
    in_data_locs, in_state_locs = [], []
    for v in data_vars:
        if _key(v) not in position:
            raise AssertionError("the data arrays have to be used in the loop body")
        in_data_locs.append(position[_key(v)])
    for v in state_vars:
        if _key(v) not in position:
            raise AssertionError("the state arrays have to be used in the loop body")
        in_state_locs.append(position[_key(v)])
    own = set(in_data_locs) | set(in_state_locs)
    remain = _NodeInputs()
    remain_locs = []
    for i, symbol in enumerate(graph_inputs):
        if i not in own:
            _input_slot(remain, symbol, outside)
            remain_locs.append(i)

    num_out_data = len(flat_out)
    num_outputs = num_out_data + len(flat_new_states)
    ret = _node("_foreach", [graph], flat_data + flat_states + remain.symbols, {
        "num_outputs": num_outputs, "num_out_data": num_out_data, "in_state_locs": in_state_locs,
        "in_data_locs": in_data_locs, "remain_locs": remain_locs})
    outs, _ = _regroup([ret[i] for i in range(num_out_data)], out_fmt)
    states, _ = _regroup([ret[i] for i in range(num_out_data, num_outputs)], new_state_fmt)
    return outs, states


def _to_python_scalar(value, type_, name):
    if hasattr(value, "asscalar"):
        value = value.asscalar()
    try:
        return type_(value)
    except (TypeError, ValueError):
        raise ValueError("Cannot convert %s to python %s" % (name, type_.__name__))


def _make_subgraph(graph_vars, graph_func, name):
    """Call ``graph_func`` on new variables named as ``graph_vars`` inside a fresh subgraph
    scope. Returns (its outputs as a graph, the scope, the new variables, the number of step
    outputs, the output format, the loop variables' format)."""
    scope = _unique_subgraph_name(name)
    with AttrScope(**{_SUBGRAPH_ATTR: scope}):
        flat_vars, var_fmt = _flatten(graph_vars, "loop_vars")
        new_vars = [var(s.name) for s in flat_vars]
        outputs, states, out_fmt, state_fmt = graph_func(_regroup(new_vars, var_fmt)[0])
        graph = _subgraph_outputs(outputs + states, scope)
    return graph, scope, new_vars, len(outputs), out_fmt, state_fmt


def while_loop(cond, func, loop_vars, max_iterations=None, name="while_loop"):
    """Run ``func`` while ``cond`` holds, at most ``max_iterations`` times, as one
    ``_while_loop`` graph node. Returns the step outputs stacked along axis 0 (``max_iterations``
    rows; the rows of iterations that did not run are zeros) and the final loop variables."""
    def _cond_wrapper(current):
        result = cond(*current)
        if not isinstance(result, Symbol):
            raise ValueError("Return of cond must be a Symbol")
        return [], [result], [], []

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
        if isinstance(new_loop_vars, Symbol):
            new_loop_vars = [new_loop_vars]
        step_output, out_fmt = _flatten(step_output, "while output")
        new_loop_vars, var_fmt = _flatten(new_loop_vars, "while loop_vars")
        if len(current) != len(new_loop_vars):
            raise ValueError("The number of loop_vars should be consistent during the loop")
        return step_output, new_loop_vars, out_fmt, var_fmt

    flat_loop_vars, _ = _flatten(loop_vars, "while loop_vars")
    _check_symbols(flat_loop_vars, "loop_vars should be a symbol or a nested list of symbols")
    if max_iterations is None:
        raise ValueError("max_iterations should be specified")
    max_iterations = _to_python_scalar(max_iterations, int, "max_iteration")
    if len(loop_vars) == 0:
        raise ValueError("loop_vars should contain at least one element")

    cond_g, cond_scope, cond_vars, _, _, _ = _make_subgraph(loop_vars, _cond_wrapper, name + "_cond")
    func_g, func_scope, func_vars, num_out_data, out_fmt, var_fmt = _make_subgraph(loop_vars, _func_wrapper, name + "_func")
    num_outputs = num_out_data + len(flat_loop_vars)

    node_inputs = _NodeInputs()
    graphs, all_locs = [], []
    func_var_locs = [-1] * len(flat_loop_vars)
    for graph, scope, graph_vars in ((cond_g, cond_scope, cond_vars), (func_g, func_scope, func_vars)):
        graph, graph_inputs, outside = _cut(graph, scope)
        var_index = {_key(v): k for k, v in enumerate(graph_vars)}
        locs = []
        for i, symbol in enumerate(graph_inputs):
            k = var_index.get(_key(symbol))
            if k is None:
                locs.append(_input_slot(node_inputs, symbol, outside))
                continue
            locs.append(node_inputs.slot(("loop_var", k), lambda k=k: flat_loop_vars[k]))
            if scope == func_scope:
                func_var_locs[k] = i
        graphs.append(graph)
        all_locs.append(locs)
    for i_th, loc in enumerate(func_var_locs, 1):
        if loc == -1:
            raise ValueError("The %d-th loop_var doesn't involve into the computation" % i_th)
    result = _node("_while_loop", graphs, node_inputs.symbols, {
        "max_iterations": max_iterations, "cond_input_locs": all_locs[0], "func_input_locs": all_locs[1],
        "func_var_locs": func_var_locs, "num_out_data": num_out_data, "num_outputs": num_outputs})
    outputs, _ = _regroup([result[i] for i in range(num_out_data)], out_fmt)
    final_loop_vars, _ = _regroup([result[i] for i in range(num_out_data, num_outputs)], var_fmt)
    if isinstance(loop_vars, Symbol):
        final_loop_vars = final_loop_vars[0]  # as the imperative version returns them
    return outputs, final_loop_vars


def cond(pred, then_func, else_func, name="cond"):
    """``then_func()`` if the scalar symbol ``pred`` is non-zero when run, else ``else_func()``,
    as one ``_cond`` graph node."""
    def _branch(func, suffix):
        scope = _unique_subgraph_name(name + suffix)
        with AttrScope(**{_SUBGRAPH_ATTR: scope}):
            outputs, fmt = _flatten(func(), "cond outputs")
            graph = _subgraph_outputs(outputs, scope)
        return graph, scope, len(outputs), fmt

    pred_g, pred_scope, pred_outputs, _ = _branch(lambda: pred, "_pred")
    if pred_outputs != 1:
        raise ValueError("pred should always be a single output")
    then_g, then_scope, then_outputs, then_fmt = _branch(then_func, "_then")
    else_g, else_scope, else_outputs, _ = _branch(else_func, "_else")
    if then_outputs != else_outputs:
        raise ValueError("Number of outputs differs between then-branch and else-branch")

    node_inputs = _NodeInputs()
    graphs, all_locs = [], []
    for graph, scope in ((pred_g, pred_scope), (then_g, then_scope), (else_g, else_scope)):
        graph, graph_inputs, outside = _cut(graph, scope)
        graphs.append(graph)
        all_locs.append([_input_slot(node_inputs, symbol, outside) for symbol in graph_inputs])
    result = _node("_cond", graphs, node_inputs.symbols, {
        "cond_input_locs": all_locs[0], "then_input_locs": all_locs[1], "else_input_locs": all_locs[2],
        "num_outputs": then_outputs})
    outputs, _ = _regroup([result[i] for i in range(then_outputs)], then_fmt)
    return outputs
