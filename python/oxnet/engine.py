"""Engine settings with MXNet's names (``mxnet.engine``).

MXNet bulks consecutive imperative operators into one engine task to amortise its per-operator
cost. oxnet's engine pushes an operator for about a tenth of MXNet's cost and runs tiny ready
operators on the calling thread, so there is nothing to amortise: the bulk size is accepted and
reported back as MXNet does, and results are the same with any size.
"""

import contextlib

_bulk_size = 15  # MXNet's default (MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD)


def set_bulk_size(size):
    """Set the imperative bulk size; returns the previous one."""
    global _bulk_size
    if int(size) < 0:
        raise ValueError("bulk size must be >= 0, got %r" % (size,))
    previous, _bulk_size = _bulk_size, int(size)
    return previous


@contextlib.contextmanager
def bulk(size):
    """``with mx.engine.bulk(n):`` sets the bulk size for a block and restores it after."""
    previous = set_bulk_size(size)
    try:
        yield
    finally:
        set_bulk_size(previous)
