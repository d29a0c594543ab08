"""ONNX model -> MXNet symbol and parameters: MXNet 1.9.1's ``mx.contrib.onnx`` import functions.

Initializers become parameters under their ONNX names (BatchNorm's statistics as auxiliary states); nodes whose
inputs are all constants (weights reshaped or transposed in the graph, shape tensors) are evaluated once with
ONNX's reference evaluator instead of becoming operators.
"""

import numpy as np

from .. import ndarray as nd
from .. import symbol as _symbol
from ..context import cpu
from ._deps import require_onnx
from ._import_ops import IMPORTS


class ONNXNode:
    """One ONNX node as an import translation sees it."""

    def __init__(self, importer, node):
        self._importer = importer
        self.op_type = node.op_type
        self.name = node.name or node.output[0]
        self.inputs = list(node.input)
        self.outputs = list(node.output)
        onnx = importer.onnx
        self.attrs = {}
        for attr in node.attribute:
            value = onnx.helper.get_attribute_value(attr)
            if isinstance(value, bytes):
                value = value.decode("utf-8")
            elif isinstance(value, list) and value and isinstance(value[0], bytes):
                value = [v.decode("utf-8") for v in value]
            self.attrs[attr.name] = value

    def attr(self, key, default=None):
        return self.attrs.get(key, default)

    def has(self, k):
        return k < len(self.inputs) and self.inputs[k] != ""

    def x(self, k):
        """Input `k` as a Symbol (constants become parameters)."""
        return self._importer.symbol(self.inputs[k])

    def const(self, k):
        """Input `k`'s value when it is a constant, else None."""
        return self._importer.constants.get(self.inputs[k]) if self.has(k) else None

    def rank(self, k):
        return self._importer.ranks.get(self.inputs[k])

    def shape(self, k):
        return self._importer.shapes.get(self.inputs[k])

    def unsupported(self, detail):
        return NotImplementedError("ONNX import of operator %s (node '%s'): %s is not supported"
                                   % (self.op_type, self.name, detail))


class _GraphImporter:
    def __init__(self, onnx, model):
        self.onnx = onnx
        self.graph = model.graph
        self.opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=13)
        self.constants = {}
        self.symbols = {}
        self.params = {}
        self.param_vars = {}
        # constant name -> (initializer name) of which it is the 2-D transpose, so that a MatMul on it reads the
        # original weight as FullyConnected's weight
        self.transposed_from = {}
        self.ranks, self.shapes = self._tensor_shapes(model)

    def _tensor_shapes(self, model):
        try:
            inferred = self.onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001  (shapes only refine the translation; without them it still runs)
            inferred = model
        ranks, shapes = {}, {}
        graph = inferred.graph
        for info in list(graph.value_info) + list(graph.input) + list(graph.output):
            tensor_type = info.type.tensor_type
            if tensor_type.HasField("shape"):
                dims = tensor_type.shape.dim
                ranks[info.name] = len(dims)
                if all(d.HasField("dim_value") for d in dims):
                    shapes[info.name] = tuple(d.dim_value for d in dims)
        return ranks, shapes

    def symbol(self, name):
        if name in self.symbols:
            return self.symbols[name]
        if name in self.constants:
            return self.param(name, self.constants[name])
        raise ValueError("ONNX import: tensor '%s' is read before any node writes it" % name)

    def param(self, name, value):
        """The parameter variable holding `value`; a name already holding another value gets a new one."""
        value = np.asarray(value)
        held = self.params.get(name)
        if held is not None and not (held.dtype == value.dtype and np.array_equal(held, value)):
            k = 1
            while "%s_%d" % (name, k) in self.params:
                k += 1
            name = "%s_%d" % (name, k)
        if name not in self.params:
            self.params[name] = value
            self.param_vars[name] = _symbol.var(name, shape=value.shape, dtype=value.dtype)
        return self.param_vars[name]

    def _fold(self, node):
        """Evaluates a node whose inputs are all constants; False where the reference evaluator cannot."""
        from onnx.reference import ReferenceEvaluator
        helper = self.onnx.helper
        inputs = [i for i in node.input if i]
        graph = helper.make_graph(
            [node], "fold",
            [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(self.constants[i].dtype), None)
             for i in inputs],
            [helper.make_empty_tensor_value_info(o) for o in node.output if o])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        try:
            values = ReferenceEvaluator(model).run(None, {i: self.constants[i] for i in inputs})
        except Exception:  # noqa: BLE001  (then the node is translated like any other)
            return False
        for name, value in zip([o for o in node.output if o], values):
            self.constants[name] = np.asarray(value)
        if node.op_type == "Transpose" and node.input[0] in self.constants and self.constants[node.input[0]].ndim == 2:
            self.transposed_from[node.output[0]] = node.input[0]
        return True

    def convert(self):
        numpy_helper = self.onnx.numpy_helper
        for tensor in self.graph.initializer:
            self.constants[tensor.name] = numpy_helper.to_array(tensor)
        for info in self.graph.input:
            if info.name not in self.constants:
                self.symbols[info.name] = _symbol.var(info.name)
        for node in self.graph.node:
            if node.op_type == "Shape" and node.input[0] in self.shapes and not node.attribute:
                # the model declares this shape fixed
                self.constants[node.output[0]] = np.array(self.shapes[node.input[0]], dtype=np.int64)
                continue
            constant_inputs = all(i in self.constants for i in node.input if i)
            if constant_inputs and not node.op_type.startswith("Random") and self._fold(node):
                continue
            translate = IMPORTS.get(node.op_type)
            n = ONNXNode(self, node)
            if translate is None or node.domain not in ("", "ai.onnx"):
                raise NotImplementedError("ONNX import: operator %s (node '%s') is not supported"
                                          % (node.op_type, n.name))
            results = translate(self, n)
            if not isinstance(results, (list, tuple)):
                results = [results]
            for name, result in zip(node.output, results):
                if name:
                    self.symbols[name] = result
        outputs = [self.symbol(o.name) for o in self.graph.output]
        sym = outputs[0] if len(outputs) == 1 else _symbol.Group(outputs)
        arg_params = {name: nd.array(self.params[name], dtype=self.params[name].dtype)
                      for name in sym.list_arguments() if name in self.params}
        aux_params = {name: nd.array(self.params[name], dtype=self.params[name].dtype)
                      for name in sym.list_auxiliary_states() if name in self.params}
        return sym, arg_params, aux_params


def _load(model_file):
    onnx = require_onnx()
    return onnx, onnx.load_model(model_file)


def import_model(model_file):
    """Imports an ONNX model file as (sym, arg_params, aux_params)."""
    onnx, model = _load(model_file)
    return _GraphImporter(onnx, model).convert()


def get_model_metadata(model_file):
    """Names and shapes of an ONNX model's inputs and outputs:
    ``{'input_tensor_data': [(name, shape, elem_type)], 'output_tensor_data': [(name, shape)]}``
    (unknown dimensions read 0)."""
    _, model = _load(model_file)
    graph = model.graph
    initializers = {t.name for t in graph.initializer}

    def dims(info):
        return tuple(d.dim_value for d in info.type.tensor_type.shape.dim)

    inputs = [(i.name, dims(i), i.type.tensor_type.elem_type) for i in graph.input if i.name not in initializers]
    outputs = [(o.name, dims(o)) for o in graph.output]
    return {"input_tensor_data": inputs, "output_tensor_data": outputs}


def import_to_gluon(model_file, ctx=None):
    """Imports an ONNX model file as a gluon SymbolBlock with its parameters loaded on `ctx`."""
    from ..gluon import SymbolBlock
    sym, arg_params, aux_params = import_model(model_file)
    data_names = [name for name, _, _ in get_model_metadata(model_file)["input_tensor_data"]]
    net = SymbolBlock(outputs=sym, inputs=[_symbol.var(name) for name in data_names])
    ctx = ctx or cpu()
    params = net.collect_params()
    for name, value in list(arg_params.items()) + list(aux_params.items()):
        if name in params:
            params[name].shape = value.shape
            params[name]._load_init(value, ctx)
    return net
