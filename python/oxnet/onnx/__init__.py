"""ONNX export and import (MXNet's ``mxnet.onnx``; import lives in ``mxnet.contrib.onnx`` in MXNet 1.9.1 and
is offered here too). Needs the optional packages `onnx` (and `onnxruntime` to run the models):
``pip install onnx onnxruntime``."""

from ._export import export_model, get_operator_support
from ._import import import_model, get_model_metadata, import_to_gluon

__all__ = ["export_model", "get_operator_support", "import_model", "get_model_metadata", "import_to_gluon"]
