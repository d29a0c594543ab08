"""The optional `onnx` package, imported only when an ONNX function runs."""

_INSTALL_HINT = "pip install onnx onnxruntime"


def require_onnx():
    """The `onnx` module, or an ImportError that says how to install it."""
    try:
        import onnx
    except ImportError as err:
        raise ImportError("ONNX import and export need the 'onnx' package (and 'onnxruntime' to run the "
                          "exported models): %s" % _INSTALL_HINT) from err
    return onnx
