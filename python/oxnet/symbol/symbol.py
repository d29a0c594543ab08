"""The Symbol class (MXNet's ``mxnet.symbol.Symbol``): a declarative graph built on the core."""

import numpy as np

from .. import _core
from ..attribute import AttrScope
from ..base import MXNetError, dtype_name, np_dtype, numeric_types, string_types
from ..context import current_context
from ..name import NameManager

# MXNet stores a variable's dtype in `__dtype__` as its type flag.
_DTYPE_FLAGS = {"float32": 0, "float64": 1, "float16": 2, "uint8": 3, "int32": 4, "int8": 5, "int64": 6,
                "bool": 7, "bfloat16": 12}


class Symbol:
    """A symbolic graph: one or more outputs of operator and variable nodes."""

    __slots__ = ("handle",)

    def __init__(self, handle):
        self.handle = handle

    # ---- identity and structure ------------------------------------------------------------
    @property
    def name(self):
        """The node name of a single-output symbol; None for a group."""
        return self.handle.name()

    def __repr__(self):
        name = self.name
        if name is None:
            return "<Symbol group [%s]>" % ", ".join(self.list_outputs())
        return "<Symbol %s>" % name

    def __len__(self):
        return self.handle.num_outputs()

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getitem__(self, index):
        if isinstance(index, string_types):
            names = self.list_outputs()
            matches = [i for i, n in enumerate(names) if n == index]
            if not matches:
                raise ValueError("There is no output named '%s'; outputs are: %s" % (index, ", ".join(names)))
            if len(matches) > 1:
                raise ValueError("There are multiple outputs named '%s'" % index)
            index = matches[0]
        if isinstance(index, slice):
            return Group([self[i] for i in range(len(self))[index]])
        if not isinstance(index, int):
            raise TypeError("Symbol only supports integer, slice or string indexing, got %r" % (index,))
        if index < 0:
            index += len(self)
        return Symbol(self.handle.output(index))

    def __copy__(self):
        return Symbol(self.handle)

    def __deepcopy__(self, memo):
        return Symbol(self.handle)

    def __hash__(self):
        return id(self)

    def __getstate__(self):
        return {"json": self.tojson()}

    def __setstate__(self, state):
        self.handle = _core.SymbolHandle.from_json(state["json"])

    def list_arguments(self):
        return self.handle.list_arguments()

    def list_outputs(self):
        return self.handle.list_outputs()

    def list_auxiliary_states(self):
        return self.handle.list_auxiliary_states()

    def list_inputs(self):
        return self.handle.list_inputs()

    def get_internals(self):
        """Every output of every node, as a grouped symbol."""
        return Symbol(self.handle.internals())

    def get_children(self):
        """The inputs of this symbol's node (None for a variable)."""
        children = self.handle.children()
        return None if children is None else Symbol(children)

    # ---- attributes --------------------------------------------------------------------------
    def attr(self, key):
        """The attribute ``key`` of this symbol's node, or None."""
        return self.handle.attr(key)

    def list_attr(self, recursive=False):
        if recursive:
            raise DeprecationWarning("Symbol.list_attr with recursive=True has been deprecated. Please use attr_dict instead.")
        return dict(self.attr_dict().get(self.name, {}))

    def attr_dict(self):
        """Attributes of every node, by node name."""
        return {name: attrs for name, attrs in self.handle.attr_dict()}

    def _set_attr(self, **kwargs):
        for key, value in kwargs.items():
            if not isinstance(value, string_types):
                raise ValueError("Set Attr only accepts string values")
            self.handle.set_attr(key, value)

    # ---- composition -------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        """A copy with its arguments replaced: positionally in ``list_arguments`` order, or by
        name."""
        if kwargs.pop("name", None) is not None:
            raise MXNetError("compose: renaming the composed node is not supported; name the operator when creating it")
        replacements = {}
        if args:
            arguments = self.list_arguments()
            if len(args) > len(arguments):
                raise TypeError("compose: %d positional symbols for %d arguments" % (len(args), len(arguments)))
            for arg_name, value in zip(arguments, args):
                replacements[arg_name] = value
        replacements.update(kwargs)
        for key, value in replacements.items():
            if not isinstance(value, Symbol):
                raise TypeError("Compose expects Symbol as arguments, got %r for '%s'" % (type(value), key))
        return Symbol(self.handle.substitute({k: v.handle for k, v in replacements.items()}))

    def _compose(self, *args, **kwargs):
        self.handle = self(*args, **kwargs).handle

    # ---- arithmetic (MXNet's operator overloads) -----------------------------------------
    def _binary(self, other, array_op, scalar_op):
        if isinstance(other, Symbol):
            return _create(array_op, self, other)
        if isinstance(other, numeric_types):
            return _create(scalar_op, self, scalar=float(other))
        return NotImplemented

    def _rscalar(self, other, scalar_op):
        if isinstance(other, numeric_types):
            return _create(scalar_op, self, scalar=float(other))
        return NotImplemented

    def __add__(self, other):
        return self._binary(other, "_Plus", "_PlusScalar")

    __radd__ = __add__

    def __sub__(self, other):
        return self._binary(other, "_Minus", "_MinusScalar")

    def __rsub__(self, other):
        return self._rscalar(other, "_RMinusScalar")

    def __mul__(self, other):
        return self._binary(other, "_Mul", "_MulScalar")

    __rmul__ = __mul__

    def __truediv__(self, other):
        return self._binary(other, "_Div", "_DivScalar")

    def __rtruediv__(self, other):
        return self._rscalar(other, "_RDivScalar")

    __div__, __rdiv__ = __truediv__, __rtruediv__

    def __mod__(self, other):
        return self._binary(other, "_Mod", "_ModScalar")

    def __rmod__(self, other):
        return self._rscalar(other, "_RModScalar")

    def __pow__(self, other):
        return self._binary(other, "_Power", "_PowerScalar")

    def __rpow__(self, other):
        return self._rscalar(other, "_RPowerScalar")

    def __neg__(self):
        return self.__mul__(-1.0)

    def __eq__(self, other):
        return self._binary(other, "_equal", "_equal_scalar")

    def __ne__(self, other):
        return self._binary(other, "_not_equal", "_not_equal_scalar")

    def __gt__(self, other):
        return self._binary(other, "_greater", "_greater_scalar")

    def __ge__(self, other):
        return self._binary(other, "_greater_equal", "_greater_equal_scalar")

    def __lt__(self, other):
        return self._binary(other, "_lesser", "_lesser_scalar")

    def __le__(self, other):
        return self._binary(other, "_lesser_equal", "_lesser_equal_scalar")

    def __getattr__(self, name):
        # Fluent methods: `x.reshape((2, 3))`, `x.sum(axis=1)` are the operators applied to x.
        from . import _fluent_operator
        operator = _fluent_operator(name)
        if operator is None:
            raise AttributeError("'Symbol' object has no attribute '%s'" % name)
        return lambda *args, **kwargs: operator(self, *args, **kwargs)

    # ---- inference ----------------------------------------------------------------------------
    def _shape_query(self, args, kwargs):
        known = {}
        if args:
            for arg_name, shape in zip(self.list_arguments(), args):
                if shape is not None:
                    known[arg_name] = shape
        known.update({k: v for k, v in kwargs.items() if v is not None})
        for key, shape in known.items():
            if not isinstance(shape, (tuple, list)):
                raise TypeError("Arguments need to be shapes (tuple), got %r for '%s'" % (shape, key))
        # MXNet writes unknown dimensions as 0: such a shape is not known yet.
        return {k: tuple(int(d) for d in v) for k, v in known.items() if all(int(d) > 0 for d in v)}

    def infer_shape(self, *args, **kwargs):
        """(arg_shapes, out_shapes, aux_shapes) from the given argument shapes; all three None
        when the given shapes do not determine every shape."""
        arg, out, aux = self.handle.infer_shape(self._shape_query(args, kwargs))
        if any(s is None for s in arg + out + aux):
            return None, None, None
        return arg, out, aux

    def infer_shape_partial(self, *args, **kwargs):
        """Like infer_shape, with ``()`` where a shape cannot be inferred."""
        arg, out, aux = self.handle.infer_shape(self._shape_query(args, kwargs))
        fill = lambda shapes: [() if s is None else s for s in shapes]
        return fill(arg), fill(out), fill(aux)

    def infer_type(self, *args, **kwargs):
        """(arg_types, out_types, aux_types) as NumPy types."""
        known = {}
        if args:
            for arg_name, dtype in zip(self.list_arguments(), args):
                if dtype is not None:
                    known[arg_name] = dtype_name(dtype)
        known.update({k: dtype_name(v) for k, v in kwargs.items() if v is not None})
        arg, out, aux = self.handle.infer_type(known)
        convert = lambda names: [None if n is None else np_dtype(n) for n in names]
        return convert(arg), convert(out), convert(aux)

    # ---- serialization and display -----------------------------------------------------------
    def tojson(self):
        return self.handle.tojson()

    def save(self, fname, remove_amp_cast=True):
        with open(fname, "w") as f:
            f.write(self.tojson())

    def debug_str(self):
        """The graph as text: outputs, then every node with its inputs (MXNet's layout)."""
        lines = ["Symbol Outputs:"]
        lines += ["\toutput[%d]=%s" % (i, name) for i, name in enumerate(self.list_outputs())]
        for name, op, inputs in self.handle.node_summary():
            if op == "null":
                lines.append("Variable:%s" % name)
                continue
            lines.append("--------------------")
            lines.append("Op:%s, Name=%s" % (op, name))
            lines.append("Inputs:")
            lines += ["\targ[%d]=%s" % (i, inp) for i, inp in enumerate(inputs)]
            attrs = self.attr_dict().get(name, {})
            if attrs:
                lines.append("Attrs:")
                lines += ["\t%s=%s" % kv for kv in sorted(attrs.items())]
        return "\n".join(lines) + "\n"

    def to_dot(self, title="plot"):
        return self.handle.to_dot(title)

    # ---- binding ------------------------------------------------------------------------------
    def _argument_arrays(self, values, names, what, allow_missing=False):
        if values is None:
            return [None] * len(names)
        if isinstance(values, dict):
            result = [values.get(n) for n in names]
            missing = [n for n, v in zip(names, result) if v is None]
            if missing and not allow_missing:
                raise ValueError("%s: no array given for %s" % (what, ", ".join(missing)))
            return result
        values = list(values)
        if len(values) != len(names):
            raise ValueError("Length of %s does not match the number of arguments (%d vs %d: %s)"
                             % (what, len(values), len(names), ", ".join(names)))
        return values

    def bind(self, ctx, args, args_grad=None, grad_req="write", aux_states=None, group2ctx=None, shared_exec=None):
        """An executor computing this symbol with the given arrays (shared, not copied)."""
        from .executor import Executor
        arg_names = self.list_arguments()
        aux_names = self.list_auxiliary_states()
        args = self._argument_arrays(args, arg_names, "args")
        grads = self._argument_arrays(args_grad, arg_names, "args_grad", allow_missing=True)
        aux = self._argument_arrays(aux_states, aux_names, "aux_states")
        if isinstance(grad_req, string_types):
            reqs = [grad_req if g is not None else "null" for g in grads]
        elif isinstance(grad_req, dict):
            reqs = [grad_req.get(n, "null") if g is not None else "null" for n, g in zip(arg_names, grads)]
        else:
            reqs = list(grad_req)
        return Executor(self, ctx or current_context(), args, grads, reqs, aux)

    def simple_bind(self, ctx, grad_req="write", type_dict=None, stype_dict=None, group2ctx=None,
                    shared_arg_names=None, shared_exec=None, shared_buffer=None, **kwargs):
        """Bind with arrays allocated from inferred shapes (kwargs give the input shapes);
        arguments of ``shared_exec`` with the same name and shape are shared, not allocated."""
        from .. import ndarray as nd
        arg_shapes, _, aux_shapes = self.infer_shape(**kwargs)
        if arg_shapes is None:
            partial, _, _ = self.infer_shape_partial(**kwargs)
            unknown = [n for n, s in zip(self.list_arguments(), partial) if s == ()]
            raise MXNetError("simple_bind: cannot infer the shapes of %s from %s" % (", ".join(unknown), kwargs))
        arg_types, _, aux_types = self.infer_type(**(type_dict or {}))
        arg_names = self.list_arguments()
        if isinstance(grad_req, string_types):
            reqs = {n: grad_req for n in arg_names}
        elif isinstance(grad_req, dict):
            reqs = {n: grad_req.get(n, "null") for n in arg_names}
        else:
            reqs = dict(zip(arg_names, grad_req))
        shared_args = shared_exec.arg_dict if shared_exec is not None else {}
        shared_grads = shared_exec.grad_dict if shared_exec is not None else {}
        args, grads = [], []
        for name, shape, dtype in zip(arg_names, arg_shapes, arg_types):
            reuse = shared_args.get(name)
            if reuse is not None and reuse.shape == tuple(shape) and reuse.dtype == dtype:
                args.append(reuse)
                grads.append(shared_grads.get(name) if reqs[name] != "null" else None)
            else:
                args.append(nd.zeros(shape, ctx=ctx, dtype=dtype))
                grads.append(nd.zeros(shape, ctx=ctx, dtype=dtype) if reqs[name] != "null" else None)
            if reqs[name] != "null" and grads[-1] is None:
                grads[-1] = nd.zeros(shape, ctx=ctx, dtype=dtype)
        shared_aux = shared_exec.aux_dict if shared_exec is not None else {}
        aux = []
        for name, shape, dtype in zip(self.list_auxiliary_states(), aux_shapes, aux_types):
            reuse = shared_aux.get(name)
            aux.append(reuse if reuse is not None and reuse.shape == tuple(shape) else nd.zeros(shape, ctx=ctx, dtype=dtype))
        return self.bind(ctx, args, grads, [reqs[n] for n in arg_names], aux)

    def eval(self, ctx=None, **kwargs):
        """Outputs for the given argument arrays (a bind and a forward pass)."""
        executor = self.bind(ctx or current_context(), kwargs)
        return executor.forward()


def _attr_string(value):
    return value if isinstance(value, string_types) else str(value)


def var(name, attr=None, shape=None, lr_mult=None, wd_mult=None, dtype=None, init=None, stype=None, **kwargs):
    """A variable (an input or a parameter) named ``name``."""
    if not isinstance(name, string_types):
        raise TypeError("Expect a string for variable `name`")
    attrs = AttrScope.current.get(attr)
    if shape is not None:
        attrs["__shape__"] = str(tuple(shape))
    if lr_mult is not None:
        attrs["__lr_mult__"] = str(lr_mult)
    if wd_mult is not None:
        attrs["__wd_mult__"] = str(wd_mult)
    if dtype is not None:
        attrs["__dtype__"] = str(_DTYPE_FLAGS[dtype_name(dtype)])
    if init is not None:
        attrs["__init__"] = init if isinstance(init, string_types) else init.dumps()
    if stype is not None:
        attrs["__storage_type__"] = str({"default": 0, "row_sparse": 1, "csr": 2}[stype])
    for key, value in kwargs.items():
        if not (key.startswith("__") and key.endswith("__")):
            raise ValueError("Attribute name=%s is not supported. Additional attributes must start and end with "
                             "double underscores, e.g, __yourattr__" % key)
        attrs[key] = _attr_string(value)
    return Symbol(_core.SymbolHandle.variable(name, {k: _attr_string(v) for k, v in attrs.items()}))


Variable = var


def Group(symbols):
    """Several symbols as one symbol with all their outputs."""
    symbols = list(symbols)
    if not symbols or any(not isinstance(s, Symbol) for s in symbols):
        raise TypeError("Expected a list of symbols as input")
    return Symbol(_core.SymbolHandle.group([s.handle for s in symbols]))


def load_json(json_str):
    """A symbol from MXNet JSON text (current or legacy layout)."""
    if not isinstance(json_str, string_types):
        raise TypeError("fname required to be string")
    return Symbol(_core.SymbolHandle.from_json(json_str))


def load(fname):
    """A symbol from an MXNet ``-symbol.json`` file."""
    if not isinstance(fname, string_types):
        raise TypeError("fname need to be string")
    with open(fname) as f:
        return load_json(f.read())


def _create(op_name, *args, name=None, attr=None, **kwargs):
    """Apply a registered operator to symbols (the body of every generated ``mx.sym.<op>``)."""
    hint = op_name.lower()
    node_name = NameManager.current.get(name, hint)
    kwargs = {k: (v.handle if isinstance(v, Symbol) else v) for k, v in kwargs.items()}
    handle = _core.SymbolHandle.create(op_name, node_name, tuple(_as_symbol_args(args)), kwargs)
    annotations = AttrScope.current.get(attr)
    if annotations:
        node = handle.output(0)
        for key, value in annotations.items():
            node.set_attr(key, _attr_string(value))
    return Symbol(handle)


def _as_symbol_args(args):
    for a in args:
        if a is None:  # an absent optional input (`bias=None` passed positionally)
            continue
        if isinstance(a, Symbol):
            yield a.handle
        elif isinstance(a, (list, tuple)) and a and all(isinstance(s, Symbol) for s in a):
            yield from (s.handle for s in a)
        else:
            yield a


def _operator_function(op_name, doc):
    def op_function(*args, name=None, attr=None, out=None, **kwargs):
        return _create(op_name, *args, name=name, attr=attr, **kwargs)

    op_function.__name__ = op_name
    op_function.__qualname__ = op_name
    op_function.__doc__ = doc
    return op_function


def zeros(shape, dtype=None, **kwargs):
    return _create("_zeros", shape=shape, dtype=dtype_name(dtype or np.float32), **kwargs)


def ones(shape, dtype=None, **kwargs):
    return _create("_ones", shape=shape, dtype=dtype_name(dtype or np.float32), **kwargs)


def full(shape, val, dtype=None, **kwargs):
    return _create("_full", shape=shape, value=float(val), dtype=dtype_name(dtype or np.float32), **kwargs)


def arange(start, stop=None, step=1.0, repeat=1, infer_range=False, name=None, dtype=None):
    kwargs = {"start": start, "step": step, "repeat": repeat, "dtype": dtype_name(dtype or np.float32)}
    if stop is not None:
        kwargs["stop"] = stop
    return _create("_arange", name=name, **kwargs)

