"""Network summaries and drawings (MXNet's ``mxnet.visualization``, ``mx.viz``)."""

import json
import re
import warnings

import numpy as np

from .symbol import Symbol

# Variables with these name endings are a layer's learnable parameters (hidden by
# ``plot_network(hide_weights=True)``; counted by ``print_summary`` unless they are auxiliary
# states such as BatchNorm's moving mean and variance).
_WEIGHT_LIKE = ("_weight", "_bias", "_beta", "_gamma", "_moving_var", "_moving_mean",
                "_running_var", "_running_mean")


def _check_symbol(symbol):
    if not isinstance(symbol, Symbol):
        raise TypeError("symbol must be a Symbol, got %s" % type(symbol).__name__)


def _graph(symbol):
    """The nodes of the symbol's JSON (each with name, op, attrs and inputs [node, output, 0])."""
    return json.loads(symbol.tojson())["nodes"]


def _infer(symbol, shape, dtype=None):
    """Shapes (and dtypes) of every internal output, by output name ('fc1_output', 'data')."""
    internals = symbol.get_internals()
    names = internals.list_outputs()
    shapes = types = {}
    if shape is not None:
        _, out_shapes, _ = internals.infer_shape_partial(**shape)
        if out_shapes is None:
            raise ValueError("Input shape is incomplete")
        shapes = dict(zip(names, out_shapes))
    if dtype is not None:
        _, out_types, _ = internals.infer_type(**dtype)
        if out_types is None:
            raise ValueError("Input type is incomplete")
        types = dict(zip(names, out_types))
    return shapes, types


def _entry_key(nodes, entry, available):
    """The output name of input entry ``[node, index, version]``."""
    node = nodes[entry[0]]
    if node["op"] == "null":
        return node["name"]
    single = node["name"] + "_output"
    return single if single in available else "%s_output%d" % (node["name"], entry[1])


def _known(shape):
    return shape is not None and len(shape) > 0 and all(d > 0 for d in shape)


def print_summary(symbol, shape=None, line_length=120, positions=(.44, .64, .74, 1.)):
    """Print a table of the network's layers: name and type, output shape (without the batch
    axis), learnable parameters, and the layers feeding each.

    Parameters
    ----------
    symbol : Symbol
    shape : dict of str to tuple, optional
        Input shapes; without them output shapes are left blank and only parameters whose shapes
        follow from the layers' attributes alone (an Embedding's) are counted.
    line_length : int
        Width of the table.
    positions : sequence of float or int
        Where each column ends: fractions of ``line_length``, or absolute columns.
    """
    _check_symbol(symbol)
    shapes, _ = _infer(symbol, shape)
    parameter_shapes = shapes
    if shape is None:
        # Parameters whose shapes the attributes alone decide (an Embedding's weight).
        internals = symbol.get_internals()
        arg_shapes, _, _ = internals.infer_shape_partial()
        parameter_shapes = dict(zip(internals.list_arguments(), arg_shapes or []))
    inputs_given = set(shape or {})
    auxiliary = set(symbol.list_auxiliary_states())
    nodes = _graph(symbol)
    positions = list(positions)
    if positions[-1] <= 1:
        positions = [int(line_length * p) for p in positions]

    def is_parameter(node):
        name = node["name"]
        return (node["op"] == "null" and name.endswith(_WEIGHT_LIKE) and name not in auxiliary
                and name not in inputs_given)

    def print_row(fields):
        line = ""
        for field, end in zip(fields, positions):
            line = (line + str(field))[:end]
            line += " " * (end - len(line))
        print(line)

    def out_shape(node, index):
        if node["op"] == "null":
            key = node["name"]
        else:
            key = _entry_key(nodes, [index, 0, 0], shapes)
        found = shapes.get(key)
        return "x".join(str(d) for d in found[1:]) if found else ""

    # Rows: every operator, and the variables that are the network's inputs (not parameters,
    # not auxiliary states).
    rows = [i for i, node in enumerate(nodes)
            if node["op"] != "null" or not (is_parameter(node) or node["name"] in auxiliary)]
    shown = set(rows)
    print("_" * line_length)
    print_row(["Layer (type)", "Output Shape", "Param #", "Previous Layer"])
    print("=" * line_length)
    total = 0
    for position, i in enumerate(rows):
        node = nodes[i]
        params = 0
        previous = []
        for entry in node.get("inputs", []):
            source = nodes[entry[0]]
            if is_parameter(source):
                found = parameter_shapes.get(source["name"])
                params += int(np.prod(found)) if _known(found) else 0
            elif entry[0] in shown and source["name"] not in previous:
                previous.append(source["name"])
        total += params
        print_row(["%s(%s)" % (node["name"], node["op"]), out_shape(node, i), params,
                   previous[0] if previous else ""])
        for name in previous[1:]:
            print_row(["", "", "", name])
        print(("=" if position == len(rows) - 1 else "_") * line_length)
    print("Total params: %d" % total)
    print("_" * line_length)


# Fill colours by kind of layer (MXNet's palette).
_COLORS = ("#8dd3c7", "#fb8072", "#ffffb3", "#bebada", "#80b1d3", "#fdb462", "#b3de69", "#fccde5")


def _dims(text):
    return "x".join(re.findall(r"\d+", text))


def _label_and_color(node):
    op, attrs = node["op"], node.get("attrs", {})
    if op == "Convolution":
        return ("Convolution\n%s/%s, %s" % (_dims(attrs["kernel"]), _dims(attrs["stride"]) if "stride" in attrs else "1",
                                            attrs["num_filter"]), _COLORS[1])
    if op == "FullyConnected":
        return "FullyConnected\n%s" % attrs["num_hidden"], _COLORS[1]
    if op == "BatchNorm":
        return node["name"], _COLORS[3]
    if op in ("Activation", "LeakyReLU"):
        # LeakyReLU's act_type defaults to 'leaky'; Activation's is required.
        return "%s\n%s" % (op, attrs.get("act_type", "leaky" if op == "LeakyReLU" else "")), _COLORS[2]
    if op == "Pooling":
        return ("Pooling\n%s, %s/%s" % (attrs.get("pool_type", "max"), _dims(attrs["kernel"]) if "kernel" in attrs else "[]",
                                        _dims(attrs["stride"]) if "stride" in attrs else "1"), _COLORS[4])
    if op in ("Concat", "Flatten", "Reshape"):
        return node["name"], _COLORS[5]
    if op == "Softmax":
        return node["name"], _COLORS[6]
    if op == "Custom":
        return attrs.get("op_type", node["name"]), _COLORS[7]
    return node["name"], _COLORS[7]


def plot_network(symbol, title="plot", save_format="pdf", shape=None, dtype=None, node_attrs=None,
                 hide_weights=True):
    """A drawing of the network as a ``graphviz.Digraph`` (render it with ``.render()``,
    ``.view()``, or display it in a notebook).

    Needs the ``graphviz`` Python package (``pip install graphviz``); rendering to a file also
    needs Graphviz's ``dot`` program.

    Parameters
    ----------
    symbol : Symbol
    title : str
        The graph's name (and the default file name of ``render``).
    save_format : str
        The format ``render`` writes: 'pdf', 'png', 'svg', ...
    shape : dict of str to tuple, optional
        Input shapes: edges are labelled with the shapes flowing along them (batch axis left out).
    dtype : dict of str to numpy dtype, optional
        Input dtypes: edge labels also give the dtype.
    node_attrs : dict, optional
        Graphviz node attributes overriding the defaults (e.g. ``{"fixedsize": "false"}``).
    hide_weights : bool
        Leave out weight, bias and other parameter variables.
    """
    try:
        from graphviz import Digraph
    except ImportError:
        raise ImportError("mx.viz.plot_network needs the graphviz Python package (pip install graphviz); "
                          "rendering the drawing also needs Graphviz's dot program") from None
    _check_symbol(symbol)
    shapes, types = _infer(symbol, shape, dtype)
    nodes = _graph(symbol)
    names = [node["name"] for node in nodes]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        warnings.warn("There are multiple variables with the same name in your graph, this may result in cyclic "
                      "graph. Repeated names: " + ",".join(repeated), RuntimeWarning)
    style = {"shape": "box", "fixedsize": "true", "width": "1.3", "height": "0.8034", "style": "filled"}
    style.update(node_attrs or {})
    dot = Digraph(name=title, format=save_format)
    weights = set()
    for node in nodes:
        attrs = dict(style)
        if node["op"] == "null":
            if node["name"].endswith(_WEIGHT_LIKE):
                # Hidden weights get no node and no edges; shown ones get no styled node either,
                # only the plain one their edges create.
                weights.add(node["name"])
                continue
            attrs.update(shape="oval", fillcolor=_COLORS[0])
            label = node["name"]
        else:
            label, attrs["fillcolor"] = _label_and_color(node)
        dot.node(name=node["name"], label=label, **attrs)
    for node in nodes:
        if node["op"] == "null":
            continue
        for entry in node["inputs"]:
            source = nodes[entry[0]]["name"]
            if hide_weights and source in weights:
                continue
            label = ""
            key = _entry_key(nodes, entry, shapes or types)
            if shapes.get(key) is not None:
                label = "x".join(str(d) for d in shapes[key][1:])
            if types.get(key) is not None:
                label += "(%s)" % np.dtype(types[key]).name
            dot.edge(tail_name=node["name"], head_name=source, dir="back", arrowtail="open", label=label)
    return dot
