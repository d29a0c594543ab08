"""MXNet's NumPy-compatible array interface (``mxnet.numpy``) is not built in oxnet yet.

The module exists so that programs which import it beside the legacy NDArray API keep working;
using any of its names raises an error that says so.
"""


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        "mxnet.numpy.%s: oxnet implements MXNet's NDArray (mx.nd) and Symbol (mx.sym) interfaces; "
        "the mx.np interface is not available yet" % name)
