"""Generate ``mx.nd.<op>`` functions from the core operator registry (no per-op Python code)."""

import functools
import operator
import sys
import types

from .. import _core
from .ndarray import _invoke_into, _invoke_operator

_is_none = functools.partial(operator.is_, None)

# Operator-name prefixes MXNet exposes as sub-namespaces of both `mx.nd` and `mx.sym`:
# `_contrib_foo` is also `contrib.foo`, `_image_crop` is `image.crop`. One table for both APIs.
SUBNAMESPACES = (
    ("contrib", "_contrib_", "Contributed operators (MXNet's _contrib_ names)."),
    ("linalg", "_linalg_", "Linear algebra operators (MXNet's _linalg_ names)."),
    ("image", "_image_", "Image operators (MXNet's _image_ names): HWC images and CHW tensors."),
)


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
        # An absent optional input (`bias=None` passed positionally) is dropped. Identity tests:
        # `None in args` would call NDArray.__eq__ on every argument.
        if any(map(_is_none, args)):
            args = tuple(a for a in args if a is not None)
        if out is not None:
            return _invoke_into(_invoke_operator, op_name, args, kwargs or None, out)
        return _invoke_operator(op_name, args, kwargs or None, None)

    op_function.__name__ = op_name
    op_function.__qualname__ = op_name
    op_function.__doc__ = doc
    return op_function


def namespace_modules(package):
    """The ``_internal`` module and one module per entry of ``SUBNAMESPACES`` for ``package``
    (``oxnet.ndarray`` or ``oxnet.symbol``), registered in ``sys.modules`` so that
    ``from oxnet.ndarray import image`` and ``import oxnet.symbol.contrib`` work."""
    modules = {"_internal": types.ModuleType(package + "._internal", "Internal operators (names with a leading underscore).")}
    for attr, _prefix, doc in SUBNAMESPACES:
        modules[attr] = types.ModuleType(package + "." + attr, doc)
    for module in modules.values():
        sys.modules[module.__name__] = module
    return modules


def place(callable_name, fn, public, modules):
    """Install one operator function under its name in ``public`` (the package's globals), in
    ``_internal`` when the name starts with an underscore, and in the sub-namespace its prefix
    names (without the prefix)."""
    for attr, prefix, _doc in SUBNAMESPACES:
        if callable_name.startswith(prefix):
            modules[attr].__dict__[callable_name[len(prefix):]] = fn
    if callable_name.startswith("_"):
        modules["_internal"].__dict__[callable_name] = fn
    public.setdefault(callable_name, fn)


def generate(public, modules):
    """Install every registered operator (and alias) with ``place``."""
    for name, aliases, doc, _variadic, params in _core.list_ops():
        full_doc = _docstring(name, doc, params, aliases)
        for callable_name in [name] + list(aliases):
            place(callable_name, _make_function(callable_name, full_doc), public, modules)
