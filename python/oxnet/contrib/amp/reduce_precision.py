"""AMP's graph conversion: the casts ``amp.convert_symbol`` adds to a float32 graph.

One walk over the graph in topological order (MXNet's ReducePrecision pass) gives every operator
the inputs its list asks for:

- float32 operators (and the nodes named in ``excluded_sym_names``) read their inputs through an
  ``amp_cast`` to float32, target-dtype operators through one to the target dtype (except inputs
  that the operator keeps in float32, such as BatchNorm's gamma, and, with
  ``cast_optional_params``, the parameters, which are then stored in the target dtype);
- widest-type operators read through ``amp_cast`` nodes when the dtypes of all their inputs are
  known, through one ``amp_multicast`` otherwise;
- conditional float32 operators cast to float32 when their parameter has one of the listed values;
- any other operator reads its inputs as they are.

A value already cast to a dtype is cast once and shared, and every output of the graph not
known to be float32 gets a final cast to float32. The graph's inputs then get the ``__dtype__``
that type inference (data inputs float32) gives them.
"""

import functools
import json

import numpy as np

from ... import _core
from ...base import MXNetError, dtype_name
from ...symbol import Symbol, load_json
from ...symbol.symbol import _DTYPE_FLAGS

_CASTS = ("amp_cast", "amp_multicast")

# Operators whose outputs MXNet names (its FListOutputNames): a cast of their output is named
# after the output ("pool0_output_amp_cast_float32"), a cast of another operator's output after
# the output's index ("flat0_0_amp_cast_bfloat16").
_NAMED_OUTPUTS = {
    "Activation", "BatchNorm", "CTCLoss", "Convolution", "Custom", "Deconvolution", "Dropout", "FullyConnected",
    "GroupNorm", "InstanceNorm", "L2Normalization", "LRN", "LayerNorm", "LeakyReLU", "MakeLoss", "Pooling", "RNN",
    "SequenceLast", "SequenceMask", "SequenceReverse", "SliceChannel", "SoftmaxActivation", "SoftmaxOutput",
    "SwapAxis", "UpSampling", "elemwise_add", "softmax", "softmin",
}


@functools.lru_cache(maxsize=None)
def _operator_types(op, attrs, first_input_dtype):
    """(input dtypes, output dtypes, indices of auxiliary inputs) that the operator ``op`` with
    ``attrs`` (sorted items) infers from its first input's dtype alone; None for what it leaves
    unknown. Raises MXNetError when the operator refuses that dtype."""
    node = Symbol(_core.SymbolHandle.create(op, "amp_probe", (), dict(attrs)))
    inputs = node.list_inputs()
    arg_types, out_types, aux_types = node.infer_type_partial(**{inputs[0]: first_input_dtype})
    known = dict(zip(node.list_arguments(), arg_types))
    known.update(zip(node.list_auxiliary_states(), aux_types))
    aux = set(node.list_auxiliary_states())
    name = lambda t: None if t is None else dtype_name(t)  # noqa: E731
    return ([name(known.get(i)) for i in inputs], [name(t) for t in out_types],
            frozenset(k for k, i in enumerate(inputs) if i in aux))


class _Conversion:
    """The walk; ``nodes`` are the JSON nodes of the graph, ``outputs[i]`` how many outputs node
    i has."""

    def __init__(self, nodes, outputs, target, lists, excluded, data_names, cast_optional_params):
        self.nodes, self.outputs = nodes, outputs
        self.target = target
        self.target_ops, self.fp32_ops, self.widest_ops, self.conditional = lists
        self.excluded, self.data_names = set(excluded), set(data_names)
        self.cast_optional_params = cast_optional_params
        self.new_nodes, self.new_outputs = [], []
        self.mirror = {}
        # (node, output) of the source graph -> [node, output, version] of the new graph holding
        # that value in float32 / in the target dtype.
        self.in_fp32, self.in_target = {}, {}

    def _append(self, node, outputs):
        self.new_nodes.append(node)
        self.new_outputs.append(outputs)
        return len(self.new_nodes) - 1

    def _copy(self, entry):
        return [self.mirror[entry[0]], entry[1], entry[2] if len(entry) > 2 else 0]

    def _suffix(self, entry):
        source = self.nodes[entry[0]]
        if source["op"] == "null":
            return ""
        if source["op"] in _NAMED_OUTPUTS:
            return "_output%d" % entry[1] if source["op"] == "SliceChannel" else (
                "_output" if entry[1] == 0 else "_%d" % entry[1])
        return "_%d" % entry[1]

    def _cast(self, entry, dtype, known):
        """A new amp_cast of the source graph's ``entry`` to ``dtype``, recorded in ``known``."""
        name = self.nodes[entry[0]]["name"] + self._suffix(entry) + "_amp_cast_" + dtype
        cast = self._append({"op": "amp_cast", "name": name, "attrs": {"dtype": dtype},
                             "inputs": [self._copy(entry)]}, 1)
        known[(entry[0], entry[1])] = [cast, 0, 0]
        return known[(entry[0], entry[1])]

    def _in(self, entry, dtype, known):
        key = (entry[0], entry[1])
        return known[key] if key in known else self._cast(entry, dtype, known)

    def _types(self, node, dtype):
        op, attrs = node["op"], node.get("attrs", {})
        items = tuple(sorted((k, v) for k, v in attrs.items() if not k.startswith("__")))
        return _operator_types(op, items, dtype)

    def _conditional_fp32(self, node):
        conditions = self.conditional.get(node["op"], {})
        attrs = node.get("attrs", {})
        return any(attrs.get(param) in values for param, values in conditions.items())

    def visit(self, nid):
        node = self.nodes[nid]
        op, name, inputs = node["op"], node["name"], node["inputs"]
        is_variable = op == "null"
        new_inputs = []
        outputs_known = None
        if (not is_variable and op in self.fp32_ops) or name in self.excluded:
            outputs_known = self.in_fp32
            for e in inputs:
                key = (e[0], e[1])
                if key in self.in_fp32:
                    new_inputs.append(self.in_fp32[key])
                elif self.nodes[e[0]]["op"] == "null":
                    new_inputs.append(self._copy(e))  # variables are taken to be float32
                else:
                    new_inputs.append(self._cast(e, "float32", self.in_fp32))
        elif not is_variable and op in self.target_ops:
            try:
                in_types, out_types, aux = self._types(node, self.target)
            except MXNetError as error:
                raise MXNetError("amp.convert_symbol: operator %s (node '%s') does not run in %s: %s"
                                 % (op, name, self.target, error)) from None
            in_types = list(in_types) + [None] * (len(inputs) - len(in_types))
            for position, (e, dtype) in enumerate(zip(inputs, in_types)):
                key, source = (e[0], e[1]), self.nodes[e[0]]
                is_parameter = source["op"] == "null" and source["name"] not in self.data_names
                if key in self.in_target:
                    new_inputs.append(self.in_target[key])
                elif ((self.cast_optional_params and is_parameter) or position in aux
                      or dtype not in (self.target, None)):
                    new_inputs.append(self._copy(e))
                    if self.cast_optional_params and source["op"] == "null":
                        self.in_target[key] = self._copy(e)
                else:
                    new_inputs.append(self._cast(e, self.target, self.in_target))
            outputs_known = out_types
        elif not is_variable and op in self.widest_ops and name not in self.excluded:
            if not inputs:
                raise MXNetError("amp.convert_symbol: node '%s' (operator %s) has no inputs" % (name, op))
            keys = [(e[0], e[1]) for e in inputs]
            if all(k in self.in_target or k in self.in_fp32 for k in keys):
                widest = "float32" if any(k in self.in_fp32 for k in keys) else self.target
                known = self.in_fp32 if widest == "float32" else self.in_target
                new_inputs = [self._in(e, widest, known) for e in inputs]
                outputs_known = known
            else:
                first = inputs[0]
                cast = self._append({
                    "op": "amp_multicast",
                    "name": self.nodes[first[0]]["name"] + self._suffix(first) + "_amp_multicast",
                    "attrs": {"num_outputs": str(len(inputs))},
                    "inputs": [self._copy(e) for e in inputs]}, len(inputs))
                new_inputs = [[cast, i, 0] for i in range(len(inputs))]
        elif not is_variable and name not in self.excluded and self._conditional_fp32(node):
            outputs_known = self.in_fp32
            try:
                aux = self._types(node, "float32")[2]
            except MXNetError:
                aux = frozenset()
            for position, e in enumerate(inputs):
                key = (e[0], e[1])
                if key in self.in_fp32:
                    new_inputs.append(self.in_fp32[key])
                elif position in aux:
                    new_inputs.append(self._copy(e))
                else:
                    new_inputs.append(self._cast(e, "float32", self.in_fp32))
        else:
            if inputs:
                first = (inputs[0][0], inputs[0][1])
                dtype = self.target if first in self.in_target else "float32" if first in self.in_fp32 else None
                if dtype is not None:
                    try:
                        outputs_known = self._types(node, dtype)[1]
                    except MXNetError:
                        outputs_known = None
            new_inputs = [self._copy(e) for e in inputs]
        new_id = self._append(dict(node, inputs=new_inputs), self.outputs[nid])
        self.mirror[nid] = new_id
        self._record_outputs(nid, new_id, outputs_known)

    def _record_outputs(self, nid, new_id, known):
        """Note the dtypes of the new node's outputs: ``known`` is the map they all go to, or the
        list of their inferred dtypes."""
        if known is None:
            return
        for i in range(self.outputs[nid]):
            if isinstance(known, dict):
                known[(nid, i)] = [new_id, i, 0]
            elif i < len(known) and known[i] == self.target:
                self.in_target[(nid, i)] = [new_id, i, 0]
            elif i < len(known) and known[i] == "float32":
                self.in_fp32[(nid, i)] = [new_id, i, 0]

    def heads(self, heads):
        return [self._in(h, "float32", self.in_fp32) for h in heads]


def _input_dtypes(graph, data_names):
    """Type inference over ``graph`` with the data inputs float32 and every ``__dtype__`` ignored:
    {input name: dtype name, or None where unknown}."""
    bare = json.loads(json.dumps(graph))
    for node in bare["nodes"]:
        if node["op"] == "null":
            node.get("attrs", {}).pop("__dtype__", None)
    sym = load_json(json.dumps(bare))
    inputs = sym.list_inputs()
    unknown = [n for n in data_names if n not in inputs]
    if unknown:
        raise MXNetError("amp.convert_symbol: data name '%s' is no input of the symbol; its inputs are %s"
                         % (unknown[0], inputs))
    arg_types, _, aux_types = sym.infer_type_partial(**{n: "float32" for n in data_names})
    types = dict(zip(sym.list_arguments(), arg_types))
    types.update(zip(sym.list_auxiliary_states(), aux_types))
    return {n: None if t is None else dtype_name(t) for n, t in types.items()}


def _infer_cast_inputs(nodes, inferred, target):
    """MXNet's AMPInferUnknown: a graph input of unknown dtype read by casts takes the dtype it
    is cast to (by an amp_multicast reading only inputs, the target dtype), unless casts to
    different dtypes read it."""
    result, claimed = dict(inferred), {}

    def claim(name, dtype):
        if name not in claimed:
            if result.get(name) is None:
                claimed[name] = dtype
                result[name] = dtype
        elif claimed[name] != dtype:
            result[name] = inferred.get(name)

    for node in nodes:
        sources = [nodes[e[0]] for e in node["inputs"]]
        if node["op"] == "amp_cast":
            for source in sources:
                if source["op"] == "null":
                    claim(source["name"], node["attrs"]["dtype"])
        elif node["op"] == "amp_multicast" and all(s["op"] == "null" for s in sources):
            for source in sources:
                claim(source["name"], target)
    return result


def convert(sym, target, target_ops, fp32_ops, widest_ops, conditional_fp32_ops, excluded_sym_names, data_names,
            model_param_names, cast_optional_params):
    """``sym`` with AMP's casts for ``target`` ('float16' or 'bfloat16'); ``conditional_fp32_ops``
    is {operator: {parameter: [values]}}. The inputs named in ``model_param_names`` (or, when
    there are none, those that already have one) get the ``__dtype__`` inference gives them."""
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    nodes = graph["nodes"]
    row_ptr = graph["node_row_ptr"]
    outputs = [row_ptr[i + 1] - row_ptr[i] for i in range(len(nodes))]
    walk = _Conversion(nodes, outputs, target, (set(target_ops), set(fp32_ops), set(widest_ops), conditional_fp32_ops),
                       excluded_sym_names, data_names, cast_optional_params)
    for nid in range(len(nodes)):
        walk.visit(nid)
    heads = walk.heads(graph["heads"])
    converted = {
        "nodes": walk.new_nodes,
        "arg_nodes": [i for i, n in enumerate(walk.new_nodes) if n["op"] == "null"],
        "node_row_ptr": np.cumsum([0] + walk.new_outputs).tolist(),
        "heads": heads,
        "attrs": graph.get("attrs", {}),
    }
    inferred = _input_dtypes(converted, data_names)
    if cast_optional_params:
        inferred = _infer_cast_inputs(converted["nodes"], inferred, target)
    flag = lambda name: _DTYPE_FLAGS[inferred.get(name) or "float32"]  # noqa: E731
    model_params = set(model_param_names)
    for node in converted["nodes"]:
        if node["op"] != "null":
            continue
        attrs = node.setdefault("attrs", {})
        if node["name"] in model_params or (not model_params and "__dtype__" in attrs):
            attrs["__dtype__"] = str(flag(node["name"]))
    return load_json(json.dumps(converted))
