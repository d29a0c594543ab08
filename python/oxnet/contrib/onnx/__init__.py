"""ONNX import and export under MXNet 1.9.1's ``mxnet.contrib.onnx`` names; ``mx.onnx`` is the same code."""

from ...onnx import export_model, get_model_metadata, import_model, import_to_gluon

__all__ = ["export_model", "get_model_metadata", "import_model", "import_to_gluon"]
