"""Operators written in Python (MXNet's ``mxnet.operator``): ``CustomOp``, ``CustomOpProp``, ``register``.

A registered operator type is called as ``mx.nd.Custom(*inputs, op_type=name, **params)`` or
``mx.sym.Custom(...)``. The core runs it like any other operator: under autograd, inside symbols
and executors, and in hybridized blocks; its gradient calls ``backward`` on the same ``CustomOp``
instance that ran ``forward``. An exception raised in ``forward`` or ``backward`` is stored on the
arrays the call should have written, so it is raised (as ``MXNetError``, with the traceback of
the user's code) at the next sync point, as a failing kernel's error is.
"""


from . import _core
from . import autograd
from .base import dtype_name, np_dtype
from .context import Context
from .ndarray import NDArray


class CustomOp:
    """Base class of a Python operator's computation: override ``forward`` and ``backward``."""

    def __init__(self):
        pass

    def forward(self, is_train, req, in_data, out_data, aux):
        """Compute ``out_data`` from ``in_data``, writing each output as ``req[i]`` says (use :meth:`assign`)."""
        raise NotImplementedError("CustomOp.forward must be overridden")

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        """Compute ``in_grad`` from ``out_grad`` (and the forward's inputs and outputs)."""
        raise NotImplementedError("CustomOp.backward must be overridden")

    def assign(self, dst, req, src):
        """Write ``src`` into ``dst`` according to ``req``: 'null' skips, 'write'/'inplace' copy, 'add' accumulates."""
        if req == "null":
            return
        if req in ("write", "inplace"):
            dst[:] = src
        elif req == "add":
            dst[:] += src
        else:
            raise ValueError("unknown write request %r; expected 'null', 'write', 'inplace' or 'add'" % (req,))


class CustomOpProp:
    """Base class of a Python operator's type: names, shapes, dtypes and the instance it creates.

    ``need_top_grad=False`` declares a loss-like operator whose backward ignores ``out_grad``.
    """

    def __init__(self, need_top_grad=True):
        self.need_top_grad_ = need_top_grad

    def infer_shape(self, in_shape):
        """(argument shapes, output shapes[, auxiliary shapes]); by default every output has the first input's shape."""
        return in_shape, (in_shape[0],) * len(self.list_outputs()), ()

    def infer_type(self, in_type):
        """(argument dtypes, output dtypes, auxiliary dtypes); by default everything takes the first input's dtype."""
        return (in_type, [in_type[0]] * len(self.list_outputs()),
                [in_type[0]] * len(self.list_auxiliary_states()))

    def infer_storage_type(self, in_stype):
        """Storage types: oxnet stores every array densely ('default')."""
        return in_stype, ["default"] * len(self.list_outputs()), ["default"] * len(self.list_auxiliary_states())

    def infer_storage_type_backward(self, ograd_stype, in_stype, out_stype, igrad_stype, aux_stype):
        return ograd_stype, in_stype, out_stype, ["default"] * len(igrad_stype), aux_stype

    def list_outputs(self):
        return ["output"]

    def list_arguments(self):
        return ["data"]

    def list_auxiliary_states(self):
        return []

    def declare_backward_dependency(self, out_grad, in_data, out_data):
        """What backward reads; oxnet keeps all of it alive for backward (MXNet may free the rest)."""
        deps = list(out_grad) if self.need_top_grad_ else []
        return deps + list(in_data) + list(out_data)

    def create_operator(self, ctx, in_shapes, in_dtypes):
        """The :class:`CustomOp` that computes this operator on ``ctx`` (made once per node)."""
        return CustomOp()


def _shape_list(shapes, what, op_type):
    try:
        return [tuple(int(d) for d in s) for s in shapes]
    except TypeError:
        raise TypeError("custom operator '%s': infer_shape must return lists of shapes for %s, got %r"
                        % (op_type, what, shapes)) from None


class _TypeAdapter:
    """What the core asks of an operator type, in plain values (the binding's side of the contract)."""

    def __init__(self, op_type, prop):
        self.op_type = op_type
        self.prop = prop

    def arguments(self):
        return [str(n) for n in self.prop.list_arguments()]

    def outputs(self):
        return [str(n) for n in self.prop.list_outputs()]

    def auxiliary_states(self):
        return [str(n) for n in self.prop.list_auxiliary_states()]

    def infer_shape(self, given):
        result = self.prop.infer_shape([list(s) if s is not None else [] for s in given])
        if len(result) not in (2, 3):
            raise ValueError("custom operator '%s': infer_shape must return 2 or 3 lists, got %d"
                             % (self.op_type, len(result)))
        aux = result[2] if len(result) == 3 else []
        return (_shape_list(result[0], "arguments", self.op_type), _shape_list(result[1], "outputs", self.op_type),
                _shape_list(aux, "auxiliary states", self.op_type))

    def infer_type(self, given):
        # Unknown dtypes take the first known one (float32 when none is), MXNet's default rule.
        fill = next((t for t in given if t is not None), "float32")
        in_type = [np_dtype(t if t is not None else fill) for t in given]
        result = self.prop.infer_type(in_type)
        aux = result[2] if len(result) == 3 else [in_type[0]] * len(self.prop.list_auxiliary_states())
        return ([dtype_name(t) for t in result[0]], [dtype_name(t) for t in result[1]],
                [dtype_name(t) for t in aux])

    def create_operator(self, ctx, in_shapes, in_dtypes):
        op = self.prop.create_operator(Context._from_tuple(tuple(ctx)), [list(s) for s in in_shapes],
                                       [np_dtype(t) for t in in_dtypes])
        if not isinstance(op, CustomOp):
            raise TypeError("custom operator '%s': create_operator must return a CustomOp, got %s"
                            % (self.op_type, type(op).__name__))
        return _KernelAdapter(op)


class _KernelAdapter:
    """Calls a :class:`CustomOp` with NDArrays, recording paused (as MXNet runs it outside the graph)."""

    def __init__(self, op):
        self.op = op

    def forward(self, is_train, req, in_data, out_data, aux):
        with autograd.pause(train_mode=is_train):
            self.op.forward(is_train=is_train, req=list(req), in_data=_arrays(in_data),
                            out_data=_arrays(out_data), aux=_arrays(aux))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        with autograd.pause():
            self.op.backward(req=list(req), out_grad=_arrays(out_grad), in_data=_arrays(in_data),
                             out_data=_arrays(out_data), in_grad=_arrays(in_grad), aux=_arrays(aux))


def _arrays(handles):
    return [NDArray(h) for h in handles]


def register(reg_name):
    """Class decorator registering a :class:`CustomOpProp` subclass as operator type ``reg_name``.

    The call's parameters reach the class's ``__init__`` as keyword strings, as in MXNet.
    """
    def do_register(prop_cls):
        if not (isinstance(prop_cls, type) and issubclass(prop_cls, CustomOpProp)):
            raise TypeError("mx.operator.register('%s') decorates a CustomOpProp subclass, got %r"
                            % (reg_name, prop_cls))

        def make(params):
            return _TypeAdapter(reg_name, prop_cls(**params))

        _core.register_custom_op(reg_name, make)
        _registry[reg_name] = prop_cls
        return prop_cls

    return do_register


_registry = {}


def get_all_registered_operators():
    """Names of the Python operator types registered in this process."""
    return list(_registry)
