"""``mx.nd.CachedOp``: a symbol compiled once and called on NDArrays like an operator."""

from .. import _core
from .ndarray import NDArray


class CachedOp:
    """A compiled graph of ``sym``; call it with one NDArray per ``sym.list_inputs()`` entry.

    The graph runs with the optimized executor passes and is one recorded node under autograd,
    exactly as a hybridized Gluon block. ``flags`` are MXNet's (pairs or a dict): ``static_alloc``
    keeps the planned storage across calls; the others (``static_shape``, ``inline_limit``,
    bulk sizes...) need nothing from oxnet, which compiles a plan per input shape anyway.
    """

    def __init__(self, sym, flags=(), thread_safe=False):
        self._input_names = sym.list_inputs()
        self._num_outputs = len(sym.list_outputs())
        flags = dict(flags)
        static_alloc = str(flags.get("static_alloc", False)).lower() in ("true", "1")
        self._handle = _core.CachedOpHandle(sym.handle, static_alloc=static_alloc)

    def __call__(self, *args, out=None, default_ctx=None):
        if len(args) != len(self._input_names):
            raise ValueError("CachedOp expects %d inputs (%s), got %d"
                             % (len(self._input_names), ", ".join(self._input_names), len(args)))
        outputs = [NDArray(h) for h in self._handle([a.handle for a in args])]
        if out is not None:
            targets = [out] if isinstance(out, NDArray) else list(out)
            if len(targets) != len(outputs):
                raise ValueError("CachedOp has %d output(s), %d given as out" % (len(outputs), len(targets)))
            for result, target in zip(outputs, targets):
                result.copyto(target)
            return out
        return outputs[0] if self._num_outputs == 1 else outputs
