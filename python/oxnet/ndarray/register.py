"""Generate ``mx.nd.<op>`` functions from the core operator registry (no per-op Python code)."""

from .. import _core
from .ndarray import _invoke, _wrap


def _docstring(name, doc, params, aliases):
    lines = [doc, "", "Parameters", "----------"]
    for pname, ptype, default, pdoc in params:
        req = "required" if default is None else "optional, default=%s" % default
        lines.append("%s : %s, %s" % (pname, ptype, req))
        if pdoc:
            lines.append("    " + pdoc)
    lines += ["out : NDArray, optional", "    The output NDArray to hold the result.", "",
              "Returns", "-------", "out : NDArray or list of NDArrays", "    The output of this function."]
    if aliases:
        lines += ["", "Aliases: " + ", ".join(aliases)]
    return "\n".join(lines)


def _make_function(op_name, doc):
    def op_function(*args, out=None, name=None, **kwargs):
        if None in args:  # an absent optional input (`bias=None` passed positionally)
            args = tuple(a for a in args if a is not None)
        result = _invoke(op_name, args, kwargs or None, out)
        return out if out is not None else _wrap(result)

    op_function.__name__ = op_name
    op_function.__qualname__ = op_name
    op_function.__doc__ = doc
    return op_function


def generate(public, internal, contrib):
    """Install every registered operator (and alias) into the given namespaces (dicts):
    ``_contrib_<name>`` also becomes ``contrib.<name>``."""
    for name, aliases, doc, _variadic, params in _core.list_ops():
        full_doc = _docstring(name, doc, params, aliases)
        for callable_name in [name] + list(aliases):
            fn = _make_function(callable_name, full_doc)
            if callable_name.startswith("_contrib_"):
                contrib[callable_name[len("_contrib_"):]] = fn
            if callable_name.startswith("_"):
                internal[callable_name] = fn
            public.setdefault(callable_name, fn)
