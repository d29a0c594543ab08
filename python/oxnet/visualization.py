"""Network summaries and drawings (MXNet's ``mxnet.visualization``, ``mx.viz``)."""

import numpy as np

from .symbol import Symbol

_PARAMETER_SUFFIXES = ("_weight", "_bias", "_beta", "_gamma", "_moving_var", "_moving_mean",
                       "_running_var", "_running_mean")


def _nodes(symbol):
    if not isinstance(symbol, Symbol):
        raise TypeError("symbol must be a Symbol")
    return symbol.handle.node_summary()


def _output_shapes(symbol, shape):
    """Output shape of every node (its first output), by node name, when input shapes are given."""
    if not shape:
        return {}
    internals = symbol.get_internals()
    _, out_shapes, _ = internals.infer_shape_partial(**shape)
    shapes = {}
    for name, out in zip(internals.list_outputs(), out_shapes):
        node = name[: -len("_output")] if name.endswith("_output") else name
        shapes.setdefault(node, out)
    return shapes


def print_summary(symbol, shape=None, line_length=120, positions=(0.44, 0.64, 0.74, 1.0)):
    """Print one row per operator: output shape, parameter count and the layers feeding it."""
    nodes = _nodes(symbol)
    shapes = _output_shapes(symbol, shape)
    shape = shape or {}
    columns = [int(line_length * p) for p in positions]

    def row(fields):
        line = ""
        for field, stop in zip(fields, columns):
            line = (line + str(field))[: stop - 1].ljust(stop)
        print(line)

    print("_" * line_length)
    row(["Layer (type)", "Output Shape", "Param #", "Previous Layer"])
    print("=" * line_length)
    ops = {name: op for name, op, _ in nodes}
    total = 0
    for name, op, inputs in nodes:
        if op == "null":
            continue
        params = 0
        for inp in inputs:
            if ops.get(inp) == "null" and inp.endswith(_PARAMETER_SUFFIXES) and inp in shapes:
                params += int(np.prod(shapes[inp])) if shapes[inp] else 0
        previous = [i for i in inputs if ops.get(i) != "null" or i in shape]
        total += params
        row(["%s(%s)" % (name, op), "x".join(str(d) for d in shapes.get(name, ())), params, ", ".join(previous)])
        print("_" * line_length)
    print("Total params: %d" % total)
    print("_" * line_length)


class DotGraph:
    """Graphviz DOT text of a network; ``render`` needs the ``graphviz`` package."""

    def __init__(self, source, title, save_format):
        self.source = source
        self.title = title
        self.format = save_format

    def render(self, filename=None, **kwargs):
        try:
            import graphviz
        except ImportError:
            raise ImportError("Draw network requires graphviz library") from None
        return graphviz.Source(self.source, format=self.format).render(filename or self.title, **kwargs)

    def _repr_svg_(self):
        import graphviz
        return graphviz.Source(self.source)._repr_image_svg_xml()


def _label(op, attrs):
    if op == "FullyConnected":
        return "FullyConnected\\n%s" % attrs.get("num_hidden", "")
    if op in ("Convolution", "Deconvolution"):
        kernel = attrs.get("kernel", "").strip("()").replace(", ", "x").rstrip(",")
        stride = attrs.get("stride", "1").strip("()").replace(", ", "x").rstrip(",")
        return "%s\\n%s/%s, %s" % (op, kernel, stride, attrs.get("num_filter", ""))
    if op == "Activation" or op == "LeakyReLU":
        return "%s\\n%s" % (op, attrs.get("act_type", ""))
    if op == "Pooling":
        return "Pooling\\n%s" % attrs.get("pool_type", "max")
    return op


def plot_network(symbol, title="plot", save_format="pdf", shape=None, dtype=None, node_attrs=None,
                 hide_weights=True):
    """A drawing of the network as DOT text (a ``graphviz.Digraph``-like object); edges carry
    output shapes when input shapes are given."""
    nodes = _nodes(symbol)
    shapes = _output_shapes(symbol, shape)
    attr_dict = symbol.attr_dict()
    hidden = set()
    lines = ['digraph "%s" {' % title, "  rankdir=BT;"]
    style = dict(shape="box", fixedsize="true", width="1.3", height="0.8034", style="filled")
    style.update(node_attrs or {})
    common = ", ".join('%s="%s"' % kv for kv in sorted(style.items()))
    for name, op, _ in nodes:
        if op == "null":
            if hide_weights and name.endswith(_PARAMETER_SUFFIXES):
                hidden.add(name)
                continue
            lines.append('  "%s" [label="%s", %s, shape="oval", fillcolor="#8dd3c7"];' % (name, name, common))
        else:
            label = _label(op, attr_dict.get(name, {}))
            lines.append('  "%s" [label="%s", %s, fillcolor="#fb8072"];' % (name, label, common))
    for name, op, inputs in nodes:
        for inp in inputs:
            if inp in hidden:
                continue
            edge_label = "x".join(str(d) for d in shapes.get(inp, ())) if shape else ""
            lines.append('  "%s" -> "%s" [dir=back, arrowtail=open, label="%s"];' % (name, inp, edge_label))
    lines.append("}")
    return DotGraph("\n".join(lines) + "\n", title, save_format)
