"""mx.viz: print_summary's table (MXNet's layout, learnable parameters only) and plot_network's
graphviz.Digraph, rendered to PNG for the digits model when Graphviz's dot program exists."""

import importlib.util
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import oxnet as mx

ROOT = Path(__file__).resolve().parents[2]


def digits_symbol():
    """The digits CNN of examples/train_digits.py as a symbol, and its parameters."""
    spec = importlib.util.spec_from_file_location("train_digits", ROOT / "examples" / "train_digits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = module.build_net()
    net.initialize()
    net(mx.nd.zeros((1, 1, 8, 8)))
    return net(mx.sym.var("data")), net.collect_params()


def summary_lines(capsys, symbol, shape):
    mx.viz.print_summary(symbol, shape=shape)
    return capsys.readouterr().out.splitlines()


def test_summary_layout_and_learnable_parameter_count(capsys):
    symbol, params = digits_symbol()
    lines = summary_lines(capsys, symbol, {"data": (1, 1, 8, 8)})
    assert lines[0] == "_" * 120 and lines[2] == "=" * 120
    assert lines[1].split() == ["Layer", "(type)", "Output", "Shape", "Param", "#", "Previous", "Layer"]
    assert lines[1].index("Output Shape") == 52 and lines[1].index("Param #") == 76 and lines[1].index("Previous") == 88
    assert lines[3].startswith("data(null)") and lines[3][52:].split()[:2] == ["1x8x8", "0"]
    learnable = sum(int(np.prod(p.shape)) for name, p in params.items() if "running" not in name)
    assert lines[-2] == "Total params: %d" % learnable
    rows = {line.split("(")[0]: line for line in lines if "(" in line and not line.startswith("Layer")}
    batchnorm = next(row for name, row in rows.items() if "batchnorm" in name)
    # gamma and beta of 32 channels; the moving mean and variance are not parameters.
    assert batchnorm[52:].split()[:2] == ["32x8x8", "64"]
    dense = next(row for name, row in rows.items() if name.endswith("dense0_fwd"))
    assert dense[52:].split()[:3] == ["128", str(64 * 2 * 2 * 128 + 128), dense[88:].strip()]


def test_summary_lists_every_input_of_a_layer(capsys):
    a, b = mx.sym.var("a"), mx.sym.var("b")
    lines = summary_lines(capsys, mx.sym.elemwise_add(a, b, name="add"), {"a": (2, 3), "b": (2, 3)})
    add = lines.index(next(l for l in lines if l.startswith("add(elemwise_add)")))
    assert lines[add][88:].strip() == "a" and lines[add + 1].strip() == "b"
    assert lines[-2] == "Total params: 0"


def test_summary_rejects_non_symbols():
    with pytest.raises(TypeError, match="Symbol"):
        mx.viz.print_summary(mx.nd.ones((2, 2)))


def test_plot_network_without_graphviz_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)
    with pytest.raises(ImportError, match="pip install graphviz"):
        mx.viz.plot_network(mx.sym.var("data"))


def test_plot_network_digraph():
    graphviz = pytest.importorskip("graphviz", reason="the graphviz Python package is not installed")
    data = mx.sym.var("data")
    fc1 = mx.sym.FullyConnected(data, num_hidden=8, name="fc1")
    net = mx.sym.SoftmaxOutput(mx.sym.Activation(fc1, act_type="relu", name="relu1"), name="softmax")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph with unique names warns about nothing
        dot = mx.viz.plot_network(net, title="mlp", save_format="svg", shape={"data": (2, 5)},
                                  dtype={"data": np.float32}, node_attrs={"fixedsize": "false"})
    assert isinstance(dot, graphviz.Digraph) and dot.name == "mlp" and dot.format == "svg"
    source = dot.source
    assert "fc1 -> data" in source and 'label="5(float32)"' in source and 'label="8(float32)"' in source
    assert "FullyConnected\n8" in source and "fixedsize=false" in source
    assert "fc1_weight" not in source
    shown = mx.viz.plot_network(net, hide_weights=False).source
    # Shown weights get edges, but no styled node of their own (MXNet draws them as plain ovals).
    assert "fc1 -> fc1_weight" in shown and "\tfc1_weight [" not in shown


def test_plot_network_warns_about_repeated_names():
    pytest.importorskip("graphviz", reason="the graphviz Python package is not installed")
    net = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc")
    net = mx.sym.FullyConnected(net, num_hidden=2, name="fc")
    with pytest.warns(RuntimeWarning, match="Repeated names: fc"):
        mx.viz.plot_network(net)


def test_render_digits_model_to_png(tmp_path):
    pytest.importorskip("graphviz", reason="the graphviz Python package is not installed")
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot program is not installed (apt-get install graphviz)")
    symbol, _ = digits_symbol()
    dot = mx.viz.plot_network(symbol, title="digits", save_format="png", shape={"data": (1, 1, 8, 8)})
    path = Path(dot.render(str(tmp_path / "digits")))
    png = path.read_bytes()
    assert path.suffix == ".png" and png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    # A tall chain of about a dozen layers.
    assert height > 4 * width > 0
