"""The Symbol class (MXNet's ``mxnet.symbol.Symbol``): a declarative graph built on the core."""

import json
import warnings

import numpy as np

from .. import _core
from ..attribute import AttrScope
from ..base import MXNetError, NotImplementedForSymbol, dtype_name, np_dtype, numeric_types, string_types
from ..context import current_context
from ..name import NameManager
from ..util import is_np_shape

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
        return {"json": self.tojson(remove_amp_cast=False)}

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
        """The inputs of the nodes behind this symbol's outputs (None for a variable)."""
        children = self.handle.children()
        return None if children is None else Symbol(children)

    def _gen_atomic_symbol(self):
        """This symbol's operator applied afresh: the same operator, name and attributes, with
        new variables for its inputs."""
        if len({self[i].name for i in range(len(self))}) != 1 or self[0].handle.op_name() == "null":
            raise MXNetError("_gen_atomic_symbol needs the outputs of one operator node")
        head = self[0]
        attrs = dict(self.handle.attr_dict()).get(head.name, {})
        return Symbol(_core.SymbolHandle.create(head.handle.op_name(), head.name, (), attrs))

    # ---- attributes --------------------------------------------------------------------------
    def attr(self, key):
        """The attribute ``key`` of this symbol's node, or None (``lr_mult`` finds ``__lr_mult__``)."""
        value = self.handle.attr(key)
        if value is None and key in _HIDDEN_KEYS:
            value = self.handle.attr("__%s__" % key)
        return value

    def list_attr(self, recursive=False):
        """The attributes of this symbol's node."""
        if recursive:
            raise DeprecationWarning("Symbol.list_attr with recursive=True has been deprecated. Please use attr_dict instead.")
        return dict(self.attr_dict().get(self.name, {}))

    def attr_dict(self):
        """Attributes of every node, by node name; a ``__lr_mult__``-style attribute is also
        listed under its plain name, as MXNet lists it."""
        return {name: _with_plain_hidden_keys(attrs) for name, attrs in self.handle.attr_dict()}

    def _set_attr(self, **kwargs):
        for key, value in kwargs.items():
            if not isinstance(value, string_types):
                raise ValueError("Set Attr only accepts string values")
            self.handle.set_attr(_stored_attr_key(key), value)

    # ---- composition -------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        """A copy with its arguments replaced: positionally in ``list_arguments`` order, or by
        name; ``name`` renames the copy's head node."""
        new_name = kwargs.pop("name", None)
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
        return Symbol(self.handle.substitute({k: v.handle for k, v in replacements.items()}, new_name))

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

    def __abs__(self):
        return _create("abs", self)

    def __bool__(self):
        raise NotImplementedForSymbol(self.__bool__, "bool")

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
    # Shapes cross into the core with -1 for an unknown dimension and None for an unknown shape,
    # MXNet's NumPy shape semantics; under the legacy semantics (the default) the caller writes
    # and reads them as 0 and () instead.
    def _shape_query(self, args, kwargs):
        given = {}
        if args:
            if len(args) > len(self.list_arguments()):
                raise ValueError("infer_shape: %d positional shapes for %d arguments" % (len(args), len(self.list_arguments())))
            given.update(zip(self.list_arguments(), args))
        given.update(kwargs)
        np_semantics = is_np_shape()
        known = {}
        for name, shape in given.items():
            if shape is None or (not np_semantics and shape == ()):
                continue  # nothing known about it
            if not isinstance(shape, (tuple, list)):
                raise TypeError("Arguments need to be shapes (tuple), got %r for '%s'" % (shape, name))
            dims = [int(d) for d in shape]
            known[name] = [d if np_semantics or d != 0 else -1 for d in dims]
        inputs = set(self.list_inputs())
        unknown_names = [name for name in known if name not in inputs]
        if unknown_names:
            raise MXNetError("infer_shape: keyword argument name %s not found; the symbol's arguments are: %s"
                             % (", ".join(unknown_names), ", ".join(self.list_arguments())))
        return known

    @staticmethod
    def _shapes_for_caller(shapes):
        if is_np_shape():
            return [None if s is None else tuple(s) for s in shapes]
        return [() if s is None else tuple(0 if d < 0 else d for d in s) for s in shapes]

    def infer_shape_partial(self, *args, **kwargs):
        """(arg_shapes, out_shapes, aux_shapes) as far as the given argument shapes determine
        them: unknown dimensions are 0 and unknown shapes () (-1 and None under NumPy shape
        semantics)."""
        arg, out, aux = self.handle.infer_shape(self._shape_query(args, kwargs))
        return self._shapes_for_caller(arg), self._shapes_for_caller(out), self._shapes_for_caller(aux)

    def infer_shape(self, *args, **kwargs):
        """(arg_shapes, out_shapes, aux_shapes) from the given argument shapes; all three None
        (with a warning naming the undetermined arguments) when they do not determine every
        shape."""
        arg, out, aux = self.handle.infer_shape(self._shape_query(args, kwargs))
        complete = lambda s: s is not None and all(d >= 0 for d in s)
        if all(complete(s) for s in arg + out + aux):
            return self._shapes_for_caller(arg), self._shapes_for_caller(out), self._shapes_for_caller(aux)
        undetermined = ["%s: %s" % (name, shape) for name, shape, raw in
                        zip(self.list_arguments(), self._shapes_for_caller(arg), arg) if not complete(raw)]
        warnings.warn("Cannot decide the shapes of these arguments (%s marks an unknown dimension); "
                      "consider giving them:\n\t%s" % ("-1" if is_np_shape() else "0", "\n\t".join(undetermined[:10])),
                      stacklevel=2)
        return None, None, None

    def _type_query(self, args, kwargs):
        known = {}
        if args:
            for arg_name, dtype in zip(self.list_arguments(), args):
                if dtype is not None:
                    known[arg_name] = dtype_name(dtype)
        known.update({k: dtype_name(v) for k, v in kwargs.items() if v is not None})
        arg, out, aux = self.handle.infer_type(known)
        convert = lambda names: [None if n is None else np_dtype(n) for n in names]
        return convert(arg), convert(out), convert(aux)

    def infer_type_partial(self, *args, **kwargs):
        """(arg_types, out_types, aux_types) as NumPy types, None where undetermined."""
        return self._type_query(args, kwargs)

    def infer_type(self, *args, **kwargs):
        """(arg_types, out_types, aux_types) as NumPy types; all three None (with a warning)
        when the given types do not determine every type."""
        arg, out, aux = self._type_query(args, kwargs)
        if any(t is None for t in arg + out + aux):
            undetermined = [name for name, t in zip(self.list_arguments(), arg) if t is None]
            warnings.warn("Cannot decide the types of these arguments; consider giving them:\n\t%s"
                          % "\n\t".join(undetermined[:10]), stacklevel=2)
            return None, None, None
        return arg, out, aux

    # ---- serialization and display -----------------------------------------------------------
    def tojson(self, remove_amp_cast=True):
        """MXNet JSON text of the graph (recording ``is_np_shape`` under NumPy shape semantics).
        With ``remove_amp_cast`` the operators read what the ``amp_cast``/``amp_multicast`` nodes
        in front of them read (the graph's outputs keep theirs), as MXNet saves AMP graphs."""
        text = self.handle.tojson(is_np_shape())
        if remove_amp_cast and ('"amp_cast"' in text or '"amp_multicast"' in text):
            text = json.dumps(_without_amp_casts(json.loads(text)), indent=2)
        return text

    def save(self, fname, remove_amp_cast=True):
        """Write the MXNet JSON to ``fname`` (``remove_amp_cast`` as in ``tojson``); a failed
        save leaves an existing file as it was."""
        _core.write_file(fname, self.tojson(remove_amp_cast).encode("utf-8"))

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
        """An executor computing this symbol with the given arrays (shared, not copied); with
        ``shared_exec`` its intermediate and output memory reuses that executor's (the two must
        then not run at the same time)."""
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
        return Executor(self, ctx or current_context(), args, grads, reqs, aux, shared_exec, group2ctx=group2ctx)

    def simple_bind(self, ctx, grad_req="write", type_dict=None, stype_dict=None, group2ctx=None,
                    shared_arg_names=None, shared_exec=None, shared_buffer=None, **kwargs):
        """Bind with arrays allocated from inferred shapes (kwargs give the input shapes);
        arguments of ``shared_exec`` with the same name and shape are shared, not allocated.

        ``shared_buffer`` (a dict, as MXNet's): arguments not in ``shared_arg_names`` and their
        gradients are views of the buffer's array of that name where it holds enough elements of
        the same dtype on the same device, else new arrays that then replace it there. This is
        how the executors of a BucketingModule share their input arrays."""
        from .. import ndarray as nd
        arg_shapes, _, aux_shapes = self.handle.infer_shape(self._shape_query((), kwargs))
        complete = lambda s: s is not None and all(d >= 0 for d in s)
        if not all(complete(s) for s in arg_shapes + aux_shapes):
            unknown = ["%s: %s" % (n, s) for n, s, raw in zip(self.list_arguments(), self._shapes_for_caller(arg_shapes), arg_shapes)
                       if not complete(raw)]
            raise MXNetError("simple_bind: cannot infer the shapes of %s from %s" % (", ".join(unknown), kwargs))
        if type_dict is None:
            # As MXNet: arguments that declare no dtype are float32.
            attrs = self.attr_dict()
            type_dict = {n: np.float32 for n in self.list_arguments() if "__dtype__" not in attrs.get(n, {})}
        arg_types, _, aux_types = self.infer_type_partial(**type_dict)
        undetermined = [n for n, t in zip(self.list_arguments() + self.list_auxiliary_states(), arg_types + aux_types) if t is None]
        if undetermined:
            raise MXNetError("simple_bind: cannot infer the dtypes of %s from %s" % (", ".join(undetermined), type_dict))
        arg_names = self.list_arguments()
        if isinstance(grad_req, string_types):
            reqs = {n: grad_req for n in arg_names}
        elif isinstance(grad_req, dict):
            reqs = {n: grad_req.get(n, "null") for n in arg_names}
        else:
            reqs = dict(zip(arg_names, grad_req))
        shared_args = shared_exec.arg_dict if shared_exec is not None else {}
        shared_grads = shared_exec.grad_dict if shared_exec is not None else {}
        # As MXNet: a variable of a ctx_group that group2ctx places lives on that context.
        attrs = self.attr_dict()
        group2ctx = dict(group2ctx or {})

        def home(name):
            return group2ctx.get(attrs.get(name, {}).get("__ctx_group__"), ctx)
        shared_names = set(shared_arg_names or ())

        def new_array(name, shape, dtype, buffer_key):
            if shared_buffer is None or name in shared_names:
                return nd.zeros(shape, ctx=home(name), dtype=dtype)
            return _view_or_replace(shared_buffer, buffer_key, shape, dtype, home(name))
        args, grads = [], []
        for name, shape, dtype in zip(arg_names, arg_shapes, arg_types):
            reuse = shared_args.get(name)
            if reuse is not None and reuse.shape == tuple(shape) and reuse.dtype == dtype:
                args.append(reuse)
                grads.append(shared_grads.get(name) if reqs[name] != "null" else None)
            else:
                args.append(new_array(name, shape, dtype, name))
                grads.append(None)
            if reqs[name] != "null" and grads[-1] is None:
                grads[-1] = new_array(name, shape, dtype, "grad of " + name)
        shared_aux = shared_exec.aux_dict if shared_exec is not None else {}
        aux = []
        for name, shape, dtype in zip(self.list_auxiliary_states(), aux_shapes, aux_types):
            reuse = shared_aux.get(name)
            aux.append(reuse if reuse is not None and reuse.shape == tuple(shape) else nd.zeros(shape, ctx=home(name), dtype=dtype))
        return self.bind(ctx, args, grads, [reqs[n] for n in arg_names], aux, group2ctx=group2ctx, shared_exec=shared_exec)

    def eval(self, ctx=None, **kwargs):
        """Outputs for the given argument arrays (a bind and a forward pass)."""
        executor = self.bind(ctx or current_context(), kwargs)
        return executor.forward()


def _view_or_replace(buffer, key, shape, dtype, ctx):
    """A ``shape`` view of ``buffer[key]`` where that array holds enough elements of ``dtype`` on
    ``ctx``; otherwise a new zero array, which becomes ``buffer[key]``."""
    from .. import ndarray as nd
    shape = tuple(shape)
    size = int(np.prod(shape, dtype=np.int64))
    held = buffer.get(key)
    if held is not None and np.dtype(held.dtype) == np.dtype(dtype) and held.context == ctx and held.size >= size:
        return held.reshape((-1,))[:size].reshape(shape)
    array = nd.zeros(shape, ctx=ctx, dtype=dtype)
    buffer[key] = array
    return array


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
    return Symbol(_core.SymbolHandle.variable(name, {_stored_attr_key(k): _attr_string(v) for k, v in attrs.items()}))


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
    with open(fname, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MXNetError("load '%s': not a symbol JSON file: the byte at offset %d (0x%02x) is not UTF-8 text"
                         % (fname, e.start, raw[e.start])) from None
    try:
        return load_json(text)
    except MXNetError as e:
        raise MXNetError("load '%s': %s" % (fname, e)) from None


# Keyword arguments of any operator that MXNet stores as the node's ``__key__`` attributes
# rather than operator parameters; the variables the operator creates for its own inputs
# (``fc1_weight``, ...) receive them too, so ``FullyConnected(..., lr_mult=0)`` freezes its weight.
_HIDDEN_KEYS = ("ctx_group", "lr_mult", "wd_mult", "force_mirroring", "mirror_stage", "profiler_scope")


def _stored_attr_key(key):
    """The key an attribute is stored under: a hidden key such as ``lr_mult`` as ``__lr_mult__``."""
    for hidden in _HIDDEN_KEYS:
        if key == hidden:
            return "__%s__" % key
        if key.endswith(hidden):
            raise MXNetError("setting variable attributes with %s is deprecated. Please instead use\n"
                             "w = Variable(%s=...)\nsym = YourSymbolName(%s=w)" % (key, hidden, key[:-len(hidden) - 1]))
    return key


def _with_plain_hidden_keys(attrs):
    """``attrs`` plus each stored hidden attribute (``__lr_mult__``) under its plain name too."""
    listed = dict(attrs)
    for hidden in _HIDDEN_KEYS:
        stored = "__%s__" % hidden
        if stored in attrs:
            listed[hidden] = attrs[stored]
    return listed


# MXNet's FSetInputVarAttrOnCompose: operators that give the variables at some input positions
# an initializer (``__init__``) unless they have one, so that Module.init_params starts running
# statistics at 0 and 1, PReLU slopes at 0.25 and UpSampling kernels bilinear.
_BATCH_NORM_STAT_INITS = {3: '["zero", {}]', 4: '["one", {}]'}
_INPUT_VARIABLE_INITS = {
    "BatchNorm": _BATCH_NORM_STAT_INITS,
    "CuDNNBatchNorm": _BATCH_NORM_STAT_INITS,
    "_contrib_SyncBatchNorm": _BATCH_NORM_STAT_INITS,
    "LeakyReLU": {1: '["Constant", {"value": 0.25}]'},
    "UpSampling": {1: '["bilinear", {}]'},
}


def _set_input_variable_inits(op_name, symbol):
    inits = _INPUT_VARIABLE_INITS.get(op_name)
    if not inits:
        return
    inputs = symbol.get_children()
    for index, init in inits.items():
        if inputs is None or index >= len(inputs):
            continue
        variable = inputs[index]
        if variable.get_children() is None and variable.attr("__init__") is None:
            variable.handle.set_attr("__init__", init)


# Set by ``contrib.amp.init``: every operator applied to symbols (generated functions,
# arithmetic, fluent methods) is then made by ``_operator_hook(op_name, args, kwargs)``, which
# casts its inputs around ``_create_node``.
_operator_hook = None


def _create(op_name, *args, name=None, attr=None, **kwargs):
    """Apply a registered operator to symbols (the body of every generated ``mx.sym.<op>``)."""
    if _operator_hook is not None:
        return _operator_hook(op_name, args, dict(kwargs, name=name, attr=attr))
    return _create_node(op_name, *args, name=name, attr=attr, **kwargs)


def _create_node(op_name, *args, name=None, attr=None, **kwargs):
    hint = op_name.lower()
    node_name = NameManager.current.get(name, hint)
    hidden = {"__%s__" % key: _attr_string(kwargs.pop(key)) for key in _HIDDEN_KEYS if key in kwargs}
    annotations = {_stored_attr_key(k): _attr_string(v) for k, v in (AttrScope.current.get(attr) or {}).items()}
    annotations.update(hidden)
    # `__key__` attributes go in with the parameters: the variables the operator makes for the
    # inputs not given inherit them (MXNet copies the node's attributes to them).
    inherited = {k: v for k, v in annotations.items() if k.startswith("__") and k.endswith("__")}
    kwargs = {k: (v.handle if isinstance(v, Symbol) else v) for k, v in kwargs.items()}
    kwargs.update(inherited)
    handle = _core.SymbolHandle.create(op_name, node_name, tuple(_as_symbol_args(args)), kwargs)
    node = handle.output(0)
    for key, value in annotations.items():
        if key not in inherited:
            node.set_attr(key, value)
    result = Symbol(handle)
    _set_input_variable_inits(op_name, result)
    return result


def _without_amp_casts(graph):
    """MXNet's RemoveAmpCast on a JSON graph (a dict): each operator input that reads an
    ``amp_cast`` or ``amp_multicast`` output reads that cast's own input instead (through chains
    of casts); the heads stay as they are, and the nodes no longer reached are dropped."""
    nodes = graph["nodes"]
    casts = ("amp_cast", "amp_multicast")

    def uncast(entry):
        while nodes[entry[0]]["op"] in casts:
            cast = nodes[entry[0]]
            entry = cast["inputs"][0 if cast["op"] == "amp_cast" else entry[1]]
        return entry

    for node in nodes:
        if node["op"] not in casts:
            node["inputs"] = [uncast(e) for e in node["inputs"]]
    reached = set()
    pending = [h[0] for h in graph["heads"]]
    while pending:
        nid = pending.pop()
        if nid not in reached:
            reached.add(nid)
            pending.extend(e[0] for e in nodes[nid]["inputs"])
    kept = sorted(reached)
    new_id = {old: new for new, old in enumerate(kept)}
    row_ptr = graph.get("node_row_ptr")
    outputs = [row_ptr[i + 1] - row_ptr[i] for i in range(len(nodes))] if row_ptr else [1] * len(nodes)
    renumber = lambda e: [new_id[e[0]]] + list(e[1:])  # noqa: E731
    graph["nodes"] = [dict(nodes[i], inputs=[renumber(e) for e in nodes[i]["inputs"]]) for i in kept]
    graph["heads"] = [renumber(h) for h in graph["heads"]]
    graph["arg_nodes"] = [new_id[i] for i in kept if nodes[i]["op"] == "null"]
    graph["node_row_ptr"] = list(np.cumsum([0] + [outputs[i] for i in kept]).tolist())
    return graph


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

