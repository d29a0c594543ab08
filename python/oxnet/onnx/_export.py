"""MXNet graph -> ONNX model: ``mx.onnx.export_model`` as MXNet 1.9.1 has it.

Unlike MXNet 1.9.1, parameters are initializers only (not graph inputs too, which keeps runtimes from folding
them), sub-graphs that depend on parameters alone (e.g. Gluon's ``_rnn_param_concat`` of reshaped RNN weights)
are evaluated once at export, and the model declares the opset its nodes were written for (13 by default)
rather than the newest one the installed `onnx` knows.
"""

import ast
import functools
import json
import logging
import re

import numpy as np

from .. import _core
from .. import ndarray as nd
from .. import symbol as _symbol
from ..base import MXNetError
from ..context import cpu
from ._deps import require_onnx
from ._export_ops import TRANSLATIONS

SUPPORTED_OPSETS = (12, 13)
DEFAULT_OPSET = 13

# Loss layers: their label input serves training only and is no input of the exported model.
_LOSS_OPS = {"SoftmaxOutput", "LogisticRegressionOutput", "LinearRegressionOutput", "MAERegressionOutput"}

_REQUIRED = object()


@functools.lru_cache(maxsize=1)
def _canonical_op_names():
    names = {}
    for name, aliases, *_ in _core.list_ops():
        names[name] = name
        for alias in aliases:
            names[alias] = name
    return names


def get_operator_support(opset_version=None):
    """The MXNet operators (names and aliases) that export to ONNX at `opset_version` (default: 13)."""
    require_onnx()
    if opset_version is not None and opset_version < min(SUPPORTED_OPSETS):
        return []
    return sorted(name for name, canonical in _canonical_op_names().items() if canonical in TRANSLATIONS)


def _parse_attr(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


class MXNode:
    """One MXNet operator node as a translation sees it."""

    def __init__(self, exporter, nid, node, op):
        self._exporter = exporter
        self.nid = nid
        self.name = node["name"]
        self.op = op
        self.attrs = dict(node.get("attrs", {}))
        entries = [(i[0], i[1]) for i in node["inputs"]]
        self.inputs = [exporter.tensor_name(e) for e in entries]
        self.in_shapes = [exporter.shapes[e] for e in entries]
        self.in_dtypes = [exporter.dtypes[e] for e in entries]

    @property
    def out_shapes(self):
        return _ByIndex(lambda k: self._exporter.shapes[(self.nid, k)])

    @property
    def out_dtypes(self):
        return _ByIndex(lambda k: self._exporter.dtypes[(self.nid, k)])

    def out(self, k):
        """The tensor name of output `k`."""
        return self._exporter.tensor_name((self.nid, k))

    def used(self, k):
        return (self.nid, k) in self._exporter.shapes

    def unsupported(self, detail):
        return NotImplementedError("ONNX export of operator %s (node '%s'): %s is not supported"
                                   % (self.op, self.name, detail))

    def _raw(self, key, default):
        text = self.attrs.get(key)
        if text is None:
            if default is _REQUIRED:
                raise MXNetError("ONNX export of operator %s (node '%s'): attribute '%s' is missing"
                                 % (self.op, self.name, key))
            return default
        return text

    def str(self, key, default=_REQUIRED):
        return str(self._raw(key, default))

    def opt_str(self, key):
        return self.attrs.get(key)

    def bool(self, key, default=_REQUIRED):
        value = self._raw(key, default)
        return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "1")

    def int(self, key, default=_REQUIRED):
        value = self._raw(key, default)
        return int(_parse_attr(value)) if isinstance(value, str) else int(value)

    def opt_int(self, key):
        value = _parse_attr(self.attrs.get(key, "None"))
        return None if value is None else int(value)

    def float(self, key, default=_REQUIRED):
        return float(self._raw(key, default))

    def opt_float(self, key):
        text = self.attrs.get(key, "None")
        return None if text == "None" else float(text)

    def ints(self, key, default=_REQUIRED):
        value = self._raw(key, default)
        value = _parse_attr(value) if isinstance(value, str) else value
        if isinstance(value, (int, type(None))) and not isinstance(value, bool):
            return (value,)
        return tuple(value)

    def opt_ints(self, key):
        value = _parse_attr(self.attrs.get(key, "None"))
        if value is None:
            return None
        return (value,) if isinstance(value, int) else tuple(value)


class _ByIndex:
    def __init__(self, fetch):
        self._fetch = fetch

    def __getitem__(self, k):
        return self._fetch(k)


class GraphBuilder:
    """The ONNX graph under construction: nodes, initializers and unique names."""

    def __init__(self, onnx, opset, dynamic):
        self.onnx = onnx
        self.opset = opset
        self.dynamic = dynamic
        self.nodes = []
        self.initializers = {}
        self.scope = "graph"
        self._tensor_names = set()
        self._node_names = set()
        self._scalars = {}

    @staticmethod
    def _unique(base, used):
        name, k = base, 0
        while name in used:
            k += 1
            name = "%s_%d" % (base, k)
        used.add(name)
        return name

    def fresh(self, base):
        return self._unique(base, self._tensor_names)

    def op(self, op_type, inputs, outputs=None, name=None, **attrs):
        """Adds a node; `outputs` is a name, a list of names, a count, or None for one new name. Returns the
        output name, or the list of them when `outputs` is a list or a count."""
        hint = "%s_%s" % (self.scope, op_type.lower())
        if outputs is None or isinstance(outputs, str):
            names, single = [outputs or self.fresh(hint)], True
        elif isinstance(outputs, int):
            names, single = [self.fresh("%s%d" % (hint, k)) for k in range(outputs)], False
        else:
            names, single = list(outputs), False
        node_name = self._unique(name or hint, self._node_names)
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), names, name=node_name, **attrs))
        return names[0] if single else names

    def const(self, array, hint):
        name = self.fresh(hint)
        self.initializers[name] = np.asarray(array)
        return name

    def ints(self, values, hint=None):
        return self.const(np.asarray(values, dtype=np.int64), hint or self.scope + "_ints")

    def scalar(self, value, dtype):
        """A 0-d constant of `dtype`, shared by every use of the same value."""
        array = np.array(value, dtype=dtype)
        key = (array.dtype.str, array.tobytes())
        if key not in self._scalars:
            self._scalars[key] = self.const(array, "scalar_%s" % array.dtype.name)
        return self._scalars[key]

    def value(self, name):
        """The numpy value of a constant tensor, or None for one computed at run time."""
        return self.initializers.get(name)

    def tensor_type(self, dtype):
        return self.onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))

    def tensor_proto(self, array):
        return self.onnx.numpy_helper.from_array(np.asarray(array))

    def shape_of(self, x, static_shape):
        """The shape of `x` as an int64 tensor: computed at run time when the export is dynamic."""
        if self.dynamic:
            return self.op("Shape", [x])
        return self.ints(static_shape, self.scope + "_shape")

    def identity_of(self, source, out):
        return self.op("Identity", [source], out)

    def reshape_const_or_node(self, name, shape):
        """`name` reshaped to `shape`: folded into a new constant when it is one."""
        value = self.value(name)
        if value is not None:
            target = value.reshape(shape)
            return name if target.shape == value.shape else self.const(target, name + "_bcast")
        if len(shape) == 1:
            return name
        return self.op("Reshape", [name, self.ints(shape)])

    def unsqueeze(self, x, axes, out=None, name=None):
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.ints(axes)], out, name=name)
        return self.op("Unsqueeze", [x], out, name=name, axes=axes)

    def squeeze(self, x, axes, out=None, name=None):
        if self.opset >= 13:
            return self.op("Squeeze", [x, self.ints(axes)], out, name=name)
        return self.op("Squeeze", [x], out, name=name, axes=axes)

    def reduce(self, op_type, x, axes, keepdims, out=None, name=None):
        if op_type == "ReduceSum" and self.opset >= 13:
            return self.op(op_type, [x, self.ints(axes)], out, name=name, keepdims=keepdims)
        return self.op(op_type, [x], out, name=name, axes=axes, keepdims=keepdims)


def _graph_output_name(mx_name):
    """MXNet 1.9.1's names for graph outputs: the node name without `_output` (RNN states get 1 and 2)."""
    for suffix, tail in (("_state_output", "1"), ("_statecell_output", "2"), ("_output", "")):
        if mx_name.endswith(suffix):
            return mx_name[:-len(suffix)] + tail
    numbered = re.match(r"^(.*)_output([0-9])$", mx_name)
    if numbered:
        return numbered.group(1) + numbered.group(2)
    return mx_name


def _is_random(op):
    return op.startswith(("_random_", "_sample_"))


class _Exporter:
    def __init__(self, onnx, sym, params, opset, dynamic, verbose):
        self.onnx = onnx
        self.sym = sym
        self.params = params
        self.verbose = verbose
        self.graph = json.loads(sym.tojson())
        self.nodes = self.graph["nodes"]
        self.heads = [(h[0], h[1]) for h in self.graph["heads"]]
        canonical = _canonical_op_names()
        self.ops = [canonical.get(node["op"], node["op"]) for node in self.nodes]
        self.builder = GraphBuilder(onnx, opset, dynamic)
        self.names = {}
        self.shapes = {}
        self.dtypes = {}
        self.labels = set()

    # ------------------------------------------------------------------ graph facts

    def _variables(self):
        """(data input node ids in MXNet's input order, parameter node ids)."""
        consumers = {}
        for nid, node in enumerate(self.nodes):
            for index, entry in enumerate(node["inputs"]):
                consumers.setdefault(entry[0], []).append((self.ops[nid], index))
        by_name = {}
        params = []
        for nid, node in enumerate(self.nodes):
            if self.ops[nid] != "null":
                continue
            if node["name"] in self.params:
                params.append(nid)
                continue
            uses = consumers.get(nid, [])
            is_label = uses and all(op in _LOSS_OPS and index == 1 for op, index in uses)
            if is_label:
                self.labels.add(nid)
            else:
                by_name[node["name"]] = nid
        data = [by_name[name] for name in self.sym.list_inputs() if name in by_name]
        return data, params

    def _probe(self, entries):
        probe = dict(self.graph, heads=[[nid, k, 0] for nid, k in entries])
        return _symbol.load_json(json.dumps(probe))

    def _infer(self, data, in_shapes, in_types):
        """Shapes and dtypes of every tensor the graph uses, from the example input shapes."""
        used = {(e[0], e[1]) for node in self.nodes for e in node["inputs"]} | set(self.heads)
        entries = sorted(used)
        probe = self._probe(entries)
        wanted = set(probe.list_inputs())
        shapes = {self.nodes[nid]["name"]: tuple(s) for nid, s in zip(data, in_shapes)}
        types = {self.nodes[nid]["name"]: np.dtype(t) for nid, t in zip(data, in_types)}
        for name, value in self.params.items():
            shapes[name], types[name] = value.shape, value.dtype
        _, out_shapes, _ = probe.infer_shape(**{k: v for k, v in shapes.items() if k in wanted})
        _, out_types, _ = probe.infer_type(**{k: v for k, v in types.items() if k in wanted})
        if out_shapes is None or any(s is None for s in out_shapes):
            raise MXNetError("ONNX export: the shapes of the graph's tensors cannot be inferred from in_shapes %s"
                             % (list(in_shapes),))
        for entry, shape, dtype in zip(entries, out_shapes, out_types):
            self.shapes[entry] = tuple(shape)
            self.dtypes[entry] = np.dtype(dtype)

    def _constant_nodes(self, param_nids):
        """Operator nodes whose value depends on parameters alone."""
        constant = set(param_nids)
        for nid, node in enumerate(self.nodes):
            op = self.ops[nid]
            if op == "null" or _is_random(op):
                continue
            if node["inputs"] and all(e[0] in constant for e in node["inputs"]):
                constant.add(nid)
            elif not node["inputs"] and op not in TRANSLATIONS:
                constant.add(nid)
        return constant - set(param_nids)

    def _fold(self, constant):
        """Evaluates the constant tensors that the rest of the graph reads; returns {entry: numpy value}."""
        read_at_run_time = set(self.heads)
        for nid, node in enumerate(self.nodes):
            if nid not in constant:
                read_at_run_time.update((i[0], i[1]) for i in node["inputs"])
        frontier = sorted(e for e in read_at_run_time if e[0] in constant)
        if not frontier:
            return {}
        probe = self._probe(frontier)
        args = {name: nd.array(self.params[name], dtype=self.params[name].dtype) for name in probe.list_arguments()}
        values = probe.eval(ctx=cpu(), **args)
        return {entry: value.asnumpy() for entry, value in zip(frontier, values)}

    # ------------------------------------------------------------------ names

    def tensor_name(self, entry):
        if entry not in self.names:
            nid, k = entry
            base = self.nodes[nid]["name"]
            self.names[entry] = self.builder.fresh(base if k == 0 else "%s_output%d" % (base, k))
        return self.names[entry]

    # ------------------------------------------------------------------ conversion

    def convert(self, in_shapes, in_types, dynamic_input_shapes):
        onnx, b = self.onnx, self.builder
        data, param_nids = self._variables()
        data_names = [self.nodes[nid]["name"] for nid in data]
        if in_shapes is None or len(in_shapes) != len(data):
            raise ValueError("ONNX export: in_shapes must give one shape for each data input %s, got %r"
                             % (data_names, in_shapes))
        if not isinstance(in_types, (list, tuple)):
            in_types = [in_types] * len(in_shapes)
        if len(in_types) != len(in_shapes):
            raise ValueError("ONNX export: the lengths of in_types and in_shapes must be equal")
        if b.dynamic and dynamic_input_shapes is not None:
            if len(dynamic_input_shapes) != len(in_shapes) or any(
                    len(d) != len(s) for d, s in zip(dynamic_input_shapes, in_shapes)):
                raise ValueError("ONNX export: dynamic_input_shapes must match in_shapes in number and ranks")
        elif dynamic_input_shapes is not None:
            raise ValueError("ONNX export: dynamic_input_shapes needs dynamic=True")
        self._infer(data, in_shapes, in_types)

        for nid in data + param_nids:
            self.names[(nid, 0)] = b.fresh(self.nodes[nid]["name"])
        for nid in param_nids:
            b.initializers[self.names[(nid, 0)]] = self.params[self.nodes[nid]["name"]]
        constant = self._constant_nodes(param_nids)
        for entry, value in self._fold(constant).items():
            b.initializers[self.tensor_name(entry)] = value

        output_names = []
        aliased_heads = []
        for entry, mx_name in zip(self.heads, self.sym.list_outputs()):
            name = b.fresh(_graph_output_name(mx_name))
            output_names.append(name)
            if entry in self.names:  # an input, a constant or an output already named
                aliased_heads.append((entry, name))
            else:
                self.names[entry] = name

        for nid, node in enumerate(self.nodes):
            op = self.ops[nid]
            if op == "null" or nid in constant:
                continue
            translate = TRANSLATIONS.get(op)
            if translate is None:
                raise NotImplementedError("ONNX export: operator %s (node '%s') has no ONNX translation; "
                                          "mx.onnx.get_operator_support() lists those that have one"
                                          % (node["op"], node["name"]))
            if self.verbose:
                logging.info("Converting node %d, op %s, name %s", nid, op, node["name"])
            b.scope = node["name"]
            translate(b, MXNode(self, nid, node, op))

        b.scope = "graph"
        for entry, name in aliased_heads:
            b.identity_of(self.names[entry], name)
        self._check_produced(data, constant)

        inputs = []
        for nid, shape, dtype in zip(data, self._declared_input_shapes(in_shapes, dynamic_input_shapes), in_types):
            inputs.append(onnx.helper.make_tensor_value_info(self.names[(nid, 0)], b.tensor_type(dtype), shape))
        outputs = []
        for entry, name in zip(self.heads, output_names):
            shape = [None] * len(self.shapes[entry]) if b.dynamic else list(self.shapes[entry])
            outputs.append(onnx.helper.make_tensor_value_info(name, b.tensor_type(self.dtypes[entry]), shape))
        read = {i for node in b.nodes for i in node.input} | set(output_names)
        initializers = [onnx.numpy_helper.from_array(np.asarray(value, order="C"), name)
                        for name, value in b.initializers.items() if name in read]
        graph = onnx.helper.make_graph(b.nodes, "mxnet_converted_model", inputs, outputs, initializers)
        opset_ids = [onnx.helper.make_opsetid("", b.opset)]
        model = onnx.helper.make_model(graph, opset_imports=opset_ids, producer_name="oxnet",
                                       ir_version=onnx.helper.find_min_ir_version_for(opset_ids))
        onnx.checker.check_model(model)
        return model

    def _declared_input_shapes(self, in_shapes, dynamic_input_shapes):
        if not self.builder.dynamic:
            return [list(s) for s in in_shapes]
        if dynamic_input_shapes is None:
            return [[None] * len(s) for s in in_shapes]
        return [list(s) for s in dynamic_input_shapes]

    def _check_produced(self, data, constant):
        produced = {o for node in self.builder.nodes for o in node.output} | set(self.builder.initializers)
        produced |= {self.names[(nid, 0)] for nid in data}
        for entry in self.shapes:
            skipped = entry[0] in self.labels or entry[0] in constant
            if not skipped and self.names.get(entry) not in produced:
                node = self.nodes[entry[0]]
                raise MXNetError("ONNX export: the translation of operator %s (node '%s') did not produce output %d"
                                 % (node["op"], node["name"], entry[1]))


def _numpy_params(params):
    result = {}
    for key, value in params.items():
        name = key[4:] if key.startswith(("arg:", "aux:")) else key
        result[name] = value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value)
    return result


def _load_model(sym, params):
    if isinstance(sym, str):
        sym = _symbol.load(sym)
    elif not isinstance(sym, _symbol.Symbol):
        raise ValueError("ONNX export: sym must be a Symbol or the path of a -symbol.json file, got %s"
                         % type(sym).__name__)
    if isinstance(params, str):
        loaded = nd.load(params)
        params = loaded if isinstance(loaded, dict) else {}
    elif isinstance(params, (list, tuple)) and len(params) == 2 and all(isinstance(p, dict) for p in params):
        params = dict(params[0], **params[1])
    elif not isinstance(params, dict):
        raise ValueError("ONNX export: params must be a dict, [arg_params, aux_params] or the path of a .params "
                         "file, got %s" % type(params).__name__)
    return sym, _numpy_params(params)


def export_model(sym, params, in_shapes=None, in_types=np.float32, onnx_file_path='model.onnx', verbose=False,
                 dynamic=False, dynamic_input_shapes=None, run_shape_inference=False, input_type=None,
                 input_shape=None, opset_version=None):
    """Exports an MXNet model (a Symbol and its parameters, or their files) to an ONNX file.

    Parameters
    ----------
    sym : Symbol or str
        The graph, or the path of its ``-symbol.json`` file.
    params : dict of str to NDArray, [arg_params, aux_params], or str
        The parameters (keys may carry the ``arg:``/``aux:`` prefixes of checkpoint files), or the path of a
        ``.params`` file.
    in_shapes : list of tuple
        The shape of each data input, in the order of ``sym.list_inputs()`` without parameters and labels.
    in_types : dtype or list of dtype
        The data inputs' types (default float32).
    onnx_file_path : str
        Where the model is written.
    verbose : bool
        Log each node as it is converted.
    dynamic : bool
        Declare input and output dimensions unknown, so that the model runs on other batch sizes (and other
        sizes where the operators allow).
    dynamic_input_shapes : list of tuple
        With ``dynamic``, the declared input shapes (None marks an unknown dimension); default all unknown.
    run_shape_inference : bool
        Annotate the model with ONNX's shape inference (left out if that fails).
    input_type, input_shape
        The former names of ``in_types`` and ``in_shapes``.
    opset_version : int
        The ONNX opset to write: 12 or 13 (default 13). Not in MXNet 1.9.1, which wrote whatever the
        installed `onnx` reported as newest.

    Returns
    -------
    str
        ``onnx_file_path``.
    """
    onnx = require_onnx()
    if input_type is not None:
        in_types = input_type
    if input_shape is not None:
        in_shapes = input_shape
    opset = DEFAULT_OPSET if opset_version is None else int(opset_version)
    if opset not in SUPPORTED_OPSETS:
        raise ValueError("ONNX export writes opsets %s, not %d" % (list(SUPPORTED_OPSETS), opset))
    sym, params = _load_model(sym, params)
    model = _Exporter(onnx, sym, params, opset, dynamic, verbose).convert(in_shapes, in_types, dynamic_input_shapes)
    if run_shape_inference:
        try:
            model = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001  (MXNet keeps the model as exported when ONNX cannot infer it)
            logging.info("ONNX shape inference failed; the model is saved without it")
    with open(onnx_file_path, "wb") as f:
        f.write(model.SerializeToString())
    logging.info("Exported ONNX model to %s (input shapes %s)", onnx_file_path, in_shapes)
    return onnx_file_path
