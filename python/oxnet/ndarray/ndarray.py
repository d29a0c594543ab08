"""The NDArray class: a Python view onto a core array handle."""

import ctypes
import math

import numpy as np

from .. import _core
from ..base import MXNetError, dtype_name, np_dtype, numeric_types, integer_types, mx_real_t
from ..context import Context, current_context

_invoke = _core.invoke
_Handle = _core.NDArrayHandle
# The operators a program asks for (generated ``mx.nd`` functions, arithmetic, fluent methods), as
# opposed to the plumbing of copies, indexing and casts: ``_route_operators`` may redirect them.
_invoke_operator = _core.invoke

py_slice = slice  # MXNet's name for the builtin (its module shadows ``slice`` with the operator)

# MXNet's storage type ids; oxnet stores every array densely ('default').
_STORAGE_TYPE_UNDEFINED, _STORAGE_TYPE_DEFAULT, _STORAGE_TYPE_ROW_SPARSE, _STORAGE_TYPE_CSR = -1, 0, 1, 2
_STORAGE_TYPE_STR_TO_ID = {"undefined": -1, "default": 0, "row_sparse": 1, "csr": 2}
_STORAGE_TYPE_ID_TO_STR = {v: k for k, v in _STORAGE_TYPE_STR_TO_ID.items()}


def _invoke_into(invoke, name, args, kwargs, out):
    """``invoke`` writing into ``out`` (an NDArray or a list); returns ``out``. A sparse array
    there receives the result in its own storage type: the operator writes a dense array, which
    is then converted (MXNet's storage fallback for outputs)."""
    outs = out if isinstance(out, (list, tuple)) else (out,)
    if all(not isinstance(o, NDArray) or o.stype == "default" for o in outs):
        invoke(name, args, kwargs, out)
        return out
    dense = [zeros(o.shape, ctx=o.context, dtype=o.dtype) if o.stype != "default" else o for o in outs]
    invoke(name, args, kwargs, dense if isinstance(out, (list, tuple)) else dense[0])
    for target, written in zip(outs, dense):
        if target is not written:
            target[:] = written
    return out


def _op(name, *args, out=None, **kwargs):
    if out is not None:
        return _invoke_into(_invoke, name, args, kwargs or None, out)
    return _invoke(name, args, kwargs or None, None)


def _apply(name, *args, out=None, **kwargs):
    """``_op`` for an operator the program asked for (see ``_invoke_operator``)."""
    if out is not None:
        return _invoke_into(_invoke_operator, name, args, kwargs or None, out)
    return _invoke_operator(name, args, kwargs or None, None)


def _route_operators(invoke):
    """Send the operators programs ask for (generated ``mx.nd`` functions, arithmetic, fluent
    methods) through ``invoke``, which has ``_core.invoke``'s signature: ``contrib.amp.init``
    casts their inputs there. ``_route_operators(_core.invoke)`` calls them directly again."""
    global _invoke_operator
    _invoke_operator = invoke
    _core.route_arith(invoke is not _core.invoke)
    from . import register
    register._invoke_operator = invoke


def _binary(lhs, rhs, array_op, scalar_op, rscalar_op=None, out=None):
    """Dispatch ``lhs op rhs`` to the array, scalar or reversed-scalar operator."""
    if isinstance(rhs, NDArray):
        return _apply(array_op, lhs, rhs, out=out)
    if isinstance(rhs, numeric_types):
        return _apply(scalar_op, lhs, scalar=float(rhs), out=out)
    if isinstance(rhs, np.ndarray):
        return _apply(array_op, lhs, array(rhs, ctx=lhs.context, dtype=lhs.dtype), out=out)
    return NotImplemented


def _arith(array_op, scalar_op):
    """An operator method with a fast path for the common NDArray-NDArray case."""
    def method(self, other):
        if type(other) is NDArray:
            return _invoke_operator(array_op, (self, other))
        return _binary(self, other, array_op, scalar_op)
    return method


def _rbinary(rhs, lhs_scalar, rscalar_op):
    if isinstance(lhs_scalar, numeric_types):
        return _apply(rscalar_op, rhs, scalar=float(lhs_scalar))
    return NotImplemented


class _ReshapeSizeError(MXNetError, ValueError):
    """A reshape to a shape of another size: MXNet reports it as an MXNetError that is also a
    ValueError."""


class NDArray:
    """An n-dimensional array on a device, computed asynchronously by the engine."""

    __slots__ = ("handle", "writable", "__weakref__")
    __array_priority__ = 1000.0

    def __init__(self, handle, writable=True):
        if type(handle) is not _Handle and isinstance(handle, ctypes.c_void_p):
            # a C API handle (mx.base.NDArrayHandle), taken over
            handle = _core.ndarray_from_c_handle(handle.value or 0)
        self.handle = handle
        self.writable = writable

    # ---- properties -----------------------------------------------------------------------
    @property
    def shape(self):
        return self.handle.shape

    @property
    def dtype(self):
        return np_dtype(self.handle.dtype)

    @property
    def context(self):
        return Context._from_tuple(self.handle.context)

    ctx = context

    @property
    def size(self):
        return self.handle.size

    @property
    def ndim(self):
        return self.handle.ndim

    @property
    def stype(self):
        return "default"

    @property
    def T(self):
        if self.ndim < 2:
            return self
        return _op("transpose", self)

    # ---- synchronization and conversion ---------------------------------------------------
    def wait_to_read(self):
        self.handle.wait_to_read()

    def wait_to_write(self):
        self.handle.wait_to_write()

    def asnumpy(self):
        """A NumPy copy of the contents (waits for pending writes)."""
        # Waiting first surfaces a failed computation (an allocation the machine cannot hold)
        # as its MXNetError before NumPy tries to allocate the copy.
        self.wait_to_read()
        try:
            out = np.empty(self.shape, dtype=self.dtype)
        except (MemoryError, ValueError) as e:
            # NumPy refuses shapes whose byte count it cannot represent, even empty ones.
            raise MXNetError("cannot copy an array of shape %s and dtype %s to NumPy: %s"
                             % (self.shape, self.dtype, e)) from None
        self.handle.read_into(out.reshape(-1).view(np.uint8))
        return out

    def __array__(self, dtype=None, copy=None):
        a = self.asnumpy()
        return a if dtype is None else a.astype(dtype)

    # ---- DLPack ---------------------------------------------------------------------------
    def to_dlpack_for_read(self):
        """A DLPack capsule addressing this array's memory (no copy) once its pending writes are
        done; it keeps the array alive until the consumer releases it."""
        return _core.to_dlpack(self.handle, False)

    def to_dlpack_for_write(self):
        """Like ``to_dlpack_for_read``, after pending reads as well, for a consumer that writes.
        Writes through the capsule are not ordered by the engine: do not use the array meanwhile."""
        return _core.to_dlpack(self.handle, True)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """The Python array API's DLPack export (``numpy.from_dlpack(nd)``): an unversioned
        ``dltensor`` capsule sharing memory, or of a copy with ``copy=True``."""
        if stream is not None:
            raise BufferError("oxnet exports host arrays only; a stream (%r) does not apply" % (stream,))
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError("cannot export an array on %s to DLPack device %r" % (self.context, dl_device))
        source = self.copy() if copy else self
        return source.to_dlpack_for_read()

    def __dlpack_device__(self):
        """(DLPack device type, device id): (1, 0), host memory, for every cpu context."""
        if self.context.device_type == "gpu":
            raise BufferError("DLPack export supports cpu arrays only, this one is on %s" % (self.context,))
        return (1, 0)

    def asscalar(self):
        if self.size != 1:
            raise ValueError("The current array is not a scalar (shape %s)" % (self.shape,))
        return self.asnumpy().reshape(-1)[0]

    def item(self):
        return self.asscalar()

    def astype(self, dtype, copy=True):
        name = dtype_name(dtype)
        if not copy and name == self.handle.dtype:
            return self
        return _op("Cast", self, dtype=name)

    def copy(self):
        return self.copyto(self.context)

    def copyto(self, other):
        """Copy into ``other`` (an NDArray of the same shape) or onto a new array on a Context."""
        if isinstance(other, NDArray):
            if other.stype != "default":
                other[:] = self  # a sparse array takes these values in its own storage type
                return other
            if other.handle is self.handle:
                return other
            _core.copyto(self.handle, other.handle)
            return other
        if isinstance(other, Context):
            dst = NDArray(_core.empty(list(self.shape), self.handle.dtype, other._as_tuple()))
            _core.copyto(self.handle, dst.handle)
            return dst
        raise TypeError("copyto does not support type %s" % type(other))

    def as_in_context(self, context):
        if self.context == context:
            return self
        return self.copyto(context)

    as_in_ctx = as_in_context

    def reshape(self, *shape, **kwargs):
        """A view with a new shape; MXNet's codes 0, -1, -2, -3, -4 and ``reverse`` apply."""
        reverse = kwargs.pop("reverse", False)
        if "shape" in kwargs:
            shape = kwargs.pop("shape")
        elif len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        if kwargs:
            raise TypeError("reshape got unexpected keyword arguments %s" % ", ".join(kwargs))
        shape = [int(s) for s in shape]
        # math.prod on Python ints: NumPy's int64 product wraps (2**32 * 2**32 == 0).
        if all(s > 0 for s in shape) and math.prod(shape) != self.size:
            # A plain shape of another size is a ValueError in MXNet (special codes fail in the core).
            raise _ReshapeSizeError("Cannot reshape array of size %d into shape %s" % (self.size, tuple(shape)))
        new_shape = _core.infer_reshape(list(self.shape), shape, reverse)
        return NDArray(self.handle.reshape_view(new_shape), self.writable)

    # ---- autograd -------------------------------------------------------------------------
    def attach_grad(self, grad_req="write", stype=None):
        """Allocate a zero gradient buffer and mark this array as a variable to differentiate."""
        grad = zeros(self.shape, ctx=self.context, dtype=self.dtype)
        self.handle = _core.mark_variables([self.handle], [grad.handle], [grad_req])[0]

    @property
    def grad(self):
        """The gradient buffer attached by ``attach_grad`` (None if there is none)."""
        handle = _core.grad_of(self.handle)
        return None if handle is None else NDArray(handle)

    @property
    def _fresh_grad(self):
        """Whether ``autograd.backward`` wrote this variable's gradient since the flag was last
        cleared (``gluon.Trainer`` clears it after each update and checks it for staleness)."""
        return _core.fresh_grad(self.handle)

    @_fresh_grad.setter
    def _fresh_grad(self, state):
        _core.set_fresh_grad(self.handle, bool(state))

    def detach(self):
        """The same data outside the recorded graph: no gradient flows back through it."""
        return NDArray(_core.detach(self.handle), self.writable)

    def backward(self, out_grad=None, retain_graph=False, train_mode=True):
        """Compute the gradients of this array with respect to the marked variables."""
        _core.backward([self.handle], [None if out_grad is None else out_grad.handle], None,
                       bool(retain_graph), False, bool(train_mode))

    # ---- shape methods with a view (``inplace=True``) or a copy --------------------------
    def flatten(self, inplace=False):
        """``(d1, d2, ..., dk)`` to ``(d1, d2*...*dk)``: a view sharing data when ``inplace``."""
        return self.reshape((0, -1)) if inplace else _op("Flatten", self)

    def expand_dims(self, axis, inplace=False):
        """Insert an axis of size 1 at ``axis`` (in ``[-ndim-1, ndim]``); a view when ``inplace``."""
        if not inplace:
            return _op("expand_dims", self, axis=axis)
        if not -self.ndim - 1 <= axis <= self.ndim:
            raise ValueError("axis %d is out of range for a %d-d array" % (axis, self.ndim))
        new_shape = list(self.shape)
        new_shape.insert(axis + self.ndim + 1 if axis < 0 else axis, 1)
        return self.reshape(new_shape)

    def squeeze(self, axis=None, inplace=False):
        """Drop axes of size 1 (all of them, or those in ``axis``); a view when ``inplace``.
        Squeezing every axis leaves shape ``(1,)``, as in MXNet."""
        if not inplace:
            return _op("squeeze", self, axis=axis)
        axes = (axis,) if isinstance(axis, integer_types) else axis
        if axes:
            if len(set(axes)) != len(axes):
                raise ValueError("axis %s contains duplicates" % (axes,))
            for ax in axes:
                if not -self.ndim <= ax < self.ndim:
                    raise ValueError("axis %d is out of range for a %d-d array" % (ax, self.ndim))
                if self.shape[ax] != 1:
                    raise ValueError("cannot squeeze axis %d of size %d" % (ax, self.shape[ax]))
            dropped = {ax % self.ndim for ax in axes}
        else:
            dropped = {i for i, n in enumerate(self.shape) if n == 1}
        new_shape = [n for i, n in enumerate(self.shape) if i not in dropped] or [1]
        return self.reshape(new_shape)

    def broadcast_to(self, shape):
        """A new array broadcasting this one to ``shape`` (missing leading axes count as 1)."""
        shape = tuple(int(s) for s in shape)
        if len(shape) < self.ndim:
            raise ValueError("cannot broadcast an array of shape %s to shape %s" % (self.shape, shape))
        padded = (1,) * (len(shape) - self.ndim) + self.shape
        if any(have not in (1, want) for have, want in zip(padded, shape)):
            raise ValueError("cannot broadcast an array of shape %s to shape %s" % (self.shape, shape))
        source = self.reshape(padded) if padded != self.shape else self
        return _op("broadcast_to", source, shape=shape)

    def broadcast_like(self, other):
        return self.broadcast_to(other.shape)

    def split_v2(self, indices_or_sections, axis=0, squeeze_axis=False):
        return split_v2(self, indices_or_sections, axis=axis, squeeze_axis=squeeze_axis)

    def tostype(self, stype):
        """A copy in storage type ``stype``: 'default', 'csr' (2-D) or 'row_sparse'."""
        from .sparse import cast_storage
        return cast_storage(self, stype)

    def as_nd_ndarray(self):
        return self

    def slice_assign(self, rhs, begin, end, step):
        """Write ``rhs`` into the region ``begin:end:step`` of this array; returns this array."""
        return _op("_slice_assign", self, rhs, begin=begin, end=end, step=step, out=self)

    def slice_assign_scalar(self, value, begin, end, step):
        """Fill the region ``begin:end:step`` of this array with ``value``; returns this array."""
        return _op("_slice_assign_scalar", self, scalar=float(value), begin=begin, end=end, step=step, out=self)

    @staticmethod
    def _basic_indexing_slice_is_contiguous(slice_key, shape):
        from .indexing import slices_are_contiguous
        return slices_are_contiguous(slice_key, shape)

    # ---- printing -------------------------------------------------------------------------
    def __repr__(self):
        shape_info = "x".join("%d" % x for x in self.shape)
        return "\n%s\n<%s %s @%s>" % (str(self.asnumpy()), self.__class__.__name__, shape_info, self.context)

    __str__ = __repr__

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d NDArray")
        return self.shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __bool__(self):
        if self.size == 0:
            return False
        if self.size == 1:
            return bool(self.asscalar())
        raise ValueError("The truth value of an NDArray with multiple elements is ambiguous.")

    def __float__(self):
        return float(self.asscalar())

    def __int__(self):
        return int(self.asscalar())

    def __hash__(self):
        return id(self) // 16

    def __getstate__(self):
        return {"data": self.asnumpy(), "ctx": str(self.context)}

    def __setstate__(self, state):
        self.handle = array(state["data"], dtype=state["data"].dtype).handle
        self.writable = True

    # ---- arithmetic -----------------------------------------------------------------------
    __add__ = _arith("broadcast_add", "_plus_scalar")

    __radd__ = __add__

    __sub__ = _arith("broadcast_sub", "_minus_scalar")

    def __rsub__(self, other):
        return _rbinary(self, other, "_rminus_scalar")

    __mul__ = _arith("broadcast_mul", "_mul_scalar")

    __rmul__ = __mul__

    __truediv__ = _arith("broadcast_div", "_div_scalar")

    def __rtruediv__(self, other):
        return _rbinary(self, other, "_rdiv_scalar")

    __div__ = __truediv__
    __rdiv__ = __rtruediv__

    __mod__ = _arith("broadcast_mod", "_mod_scalar")

    def __rmod__(self, other):
        return _rbinary(self, other, "_rmod_scalar")

    __pow__ = _arith("broadcast_power", "_power_scalar")

    def __rpow__(self, other):
        return _rbinary(self, other, "_rpower_scalar")

    def __neg__(self):
        return _apply("negative", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _apply("abs", self)

    __eq__ = _arith("broadcast_equal", "_equal_scalar")

    __ne__ = _arith("broadcast_not_equal", "_not_equal_scalar")

    __gt__ = _arith("broadcast_greater", "_greater_scalar")

    __ge__ = _arith("broadcast_greater_equal", "_greater_equal_scalar")

    __lt__ = _arith("broadcast_lesser", "_lesser_scalar")

    __le__ = _arith("broadcast_lesser_equal", "_lesser_equal_scalar")

    def _inplace(self, other, array_op, scalar_op):
        if not self.writable:
            raise ValueError("trying to modify a read-only NDArray")
        result = _binary(self, other, array_op, scalar_op, out=self)
        if result is NotImplemented:
            raise TypeError("type %s not supported" % type(other))
        return self

    def __iadd__(self, other):
        return self._inplace(other, "broadcast_add", "_plus_scalar")

    def __isub__(self, other):
        return self._inplace(other, "broadcast_sub", "_minus_scalar")

    def __imul__(self, other):
        return self._inplace(other, "broadcast_mul", "_mul_scalar")

    def __itruediv__(self, other):
        return self._inplace(other, "broadcast_div", "_div_scalar")

    __idiv__ = __itruediv__

    def __imod__(self, other):
        return self._inplace(other, "broadcast_mod", "_mod_scalar")

    def __ipow__(self, other):
        return self._inplace(other, "broadcast_power", "_power_scalar")

    # ---- indexing -------------------------------------------------------------------------
    def __getitem__(self, key):
        from .indexing import get_item
        return get_item(self, key)

    def __setitem__(self, key, value):
        from .indexing import set_item
        if not self.writable:
            raise ValueError("trying to assign to a read-only NDArray")
        set_item(self, key, value)

    # ---- operator methods (MXNet's fluent API) --------------------------------------------
    def __getattr__(self, name):
        fluent = _FLUENT.get(name)
        if fluent is None:
            raise AttributeError("'NDArray' object has no attribute '%s'" % name)
        return lambda *args, **kwargs: _apply(fluent, self, *args, **kwargs)


# NDArray-with-NDArray arithmetic as C methods (no Python frame on the commonest small op); any
# other operand goes to the Python method each one replaces.
for _method, _array_op in (("__add__", "broadcast_add"), ("__sub__", "broadcast_sub"),
                           ("__mul__", "broadcast_mul"), ("__truediv__", "broadcast_div")):
    setattr(NDArray, _method, _core.arith_method(NDArray, _array_op, getattr(NDArray, _method)))
del _method, _array_op

# Methods that call the operator of the same name with this array as the first input (MXNet's
# fluent API; the shape methods with an ``inplace`` view variant are defined on the class).
_FLUENT = {name: name for name in (
    "sum", "mean", "max", "min", "prod", "nansum", "nanprod", "norm", "transpose", "abs", "sign",
    "round", "rint", "ceil", "floor", "trunc", "fix", "square", "sqrt", "rsqrt", "cbrt", "rcbrt",
    "exp", "expm1", "log", "log10", "log2", "log1p", "sin", "cos", "tan", "arcsin", "arccos",
    "arctan", "sinh", "cosh", "tanh", "arcsinh", "arccosh", "arctanh", "degrees", "radians",
    "sigmoid", "relu", "softsign", "reciprocal", "softmax", "log_softmax", "softmin", "zeros_like",
    "ones_like", "take", "slice", "slice_axis", "slice_like", "split", "reshape_like", "tile",
    "repeat", "pad", "swapaxes", "flip", "depth_to_space", "space_to_depth", "diag", "one_hot",
    "pick", "sort", "topk", "argsort", "argmax", "argmax_channel", "argmin", "clip", "shape_array",
    "size_array", "broadcast_axes",
)}


def _as_context(ctx):
    return current_context() if ctx is None else Context(ctx)


def array(source_array, ctx=None, dtype=None):
    """An NDArray holding a copy of ``source_array`` (NDArray, NumPy array or nested lists).

    The dtype defaults to the source's for an NDArray and to float32 otherwise, as in MXNet.
    """
    ctx = _as_context(ctx)
    if getattr(source_array, "stype", "default") != "default" or _is_scipy_sparse(source_array):
        from . import sparse
        return sparse.array(source_array, ctx=ctx, dtype=dtype)
    if isinstance(source_array, NDArray):
        name = dtype_name(dtype if dtype is not None else source_array.dtype)
        out = NDArray(_core.empty(list(source_array.shape), name, ctx._as_tuple()))
        _core.copyto(source_array.handle, out.handle)
        return out
    name = dtype_name(mx_real_t if dtype is None else dtype)
    if name == "bfloat16":
        # NumPy has no bfloat16 arithmetic type: convert through float32 in the core.
        return array(source_array, ctx=ctx, dtype="float32").astype("bfloat16")
    src = np.asarray(source_array, dtype=np_dtype(name))
    if not src.flags.c_contiguous:
        # (Never a 0-d source, which np.ascontiguousarray would make 1-d: those are contiguous.)
        src = np.ascontiguousarray(src)
    return NDArray(_core.from_buffer(src.reshape(-1).view(np.uint8), list(src.shape), name, ctx._as_tuple()))


def _is_scipy_sparse(value):
    """Whether ``value`` is a SciPy sparse matrix (without importing SciPy for other values)."""
    return type(value).__module__.startswith("scipy.sparse")


def from_numpy(ndarray, zero_copy=True):
    """An NDArray on ``cpu(0)`` from a C-contiguous NumPy array.

    With ``zero_copy`` (the default) the NDArray uses the NumPy array's memory: the NumPy array
    is made read-only (writes go through the NDArray, which the engine orders) and stays alive
    as long as the NDArray does. ``zero_copy=False`` copies instead. A non-contiguous array
    raises ValueError, as in MXNet.
    """
    if not isinstance(ndarray, np.ndarray):
        raise TypeError("from_numpy expects a numpy.ndarray, got %s" % type(ndarray).__name__)
    if not ndarray.flags["C_CONTIGUOUS"]:
        raise ValueError("Only c-contiguous arrays are supported for zero-copy")
    if not zero_copy:
        return array(ndarray, dtype=ndarray.dtype)
    ndarray.flags["WRITEABLE"] = False
    flat_bytes = ndarray.reshape(-1).view(np.uint8)
    return NDArray(_core.share_buffer(flat_bytes, list(ndarray.shape), dtype_name(ndarray.dtype)))


def empty(shape, ctx=None, dtype=None, stype=None):
    """An uninitialized array (a sparse one holds no values: all zeros)."""
    if stype not in (None, "default"):
        from .sparse import empty as sparse_empty
        return sparse_empty(stype, shape, ctx=ctx, dtype=dtype)
    if isinstance(shape, integer_types):
        shape = (shape,)
    name = dtype_name(mx_real_t if dtype is None else dtype)
    return NDArray(_core.empty([int(s) for s in shape], name, _as_context(ctx)._as_tuple()))


def _creation(op_name, shape, ctx, dtype, name=None, stype=None, **kwargs):
    # MXNet code passes the weight's stype along (``zeros(..., stype=weight.stype)``).
    if stype not in (None, "default"):
        if op_name != "_zeros":
            raise MXNetError("%s: sparse storage (stype=%r) exists only as zeros; use mx.nd.zeros(..., stype=%r) "
                             "or mx.nd.sparse" % (op_name.lstrip("_"), stype, stype))
        from .sparse import zeros as sparse_zeros
        return sparse_zeros(stype, shape, ctx=ctx, dtype=dtype)
    if isinstance(shape, integer_types):
        shape = (shape,)
    return _op(op_name, shape=tuple(int(s) for s in shape), ctx=str(_as_context(ctx)),
               dtype=dtype_name(mx_real_t if dtype is None else dtype), **kwargs)


def zeros(shape, ctx=None, dtype=None, **kwargs):
    return _creation("_zeros", shape, ctx, dtype, **kwargs)


def ones(shape, ctx=None, dtype=None, **kwargs):
    return _creation("_ones", shape, ctx, dtype, **kwargs)


def full(shape, val, ctx=None, dtype=mx_real_t, out=None):
    result = _creation("_full", shape, ctx, dtype, value=float(val))
    if out is not None:
        result.copyto(out)
        return out
    return result


def arange(start, stop=None, step=1.0, repeat=1, infer_range=None, ctx=None, dtype=mx_real_t):
    kwargs = dict(start=float(start), step=float(step), repeat=int(repeat),
                  ctx=str(_as_context(ctx)), dtype=dtype_name(dtype))
    if stop is not None:
        kwargs["stop"] = float(stop)
    return _op("_arange", **kwargs)


def eye(N, M=0, k=0, ctx=None, dtype=mx_real_t, **kwargs):
    """A 2-D array with ones on the k-th diagonal."""
    return _op("_eye", N=int(N), M=int(M), k=int(k), ctx=str(_as_context(ctx)), dtype=dtype_name(dtype), **kwargs)


def linspace(start, stop, num, endpoint=True, ctx=None, dtype=mx_real_t):
    """num evenly spaced values over [start, stop]."""
    return _op("_linspace", start=float(start), stop=float(stop), num=int(num), endpoint=endpoint,
               ctx=str(_as_context(ctx)), dtype=dtype_name(dtype))


def _normalize_axes(axes, ndim, what):
    """``axes`` (an int or a sequence) as a tuple of unique non-negative axes of an ndim-d array."""
    axes = (axes,) if isinstance(axes, integer_types) else tuple(axes)
    normalized = []
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise ValueError("%s axis %d is out of bounds for an array of dimension %d" % (what, ax, ndim))
        normalized.append(int(ax) % ndim)
    if len(set(normalized)) != len(normalized):
        raise ValueError("repeated axis in `%s` argument" % what)
    return tuple(normalized)


def moveaxis(tensor, source, destination):
    """Move the axes ``source`` to the positions ``destination`` (others keep their order)."""
    source = _normalize_axes(source, tensor.ndim, "source")
    destination = _normalize_axes(destination, tensor.ndim, "destination")
    if len(source) != len(destination):
        raise ValueError("`source` and `destination` arguments must have the same number of elements")
    order = [ax for ax in range(tensor.ndim) if ax not in source]
    for dest, src in sorted(zip(destination, source)):
        order.insert(dest, src)
    return _op("transpose", tensor, axes=tuple(order))


def split_v2(ary, indices_or_sections, axis=0, squeeze_axis=False):
    """Split ``ary`` along ``axis`` into N equal parts (an int) or at the given indices (a tuple);
    an index beyond the axis gives an empty part, as in NumPy's ``split``."""
    axis_size = ary.shape[axis]
    if isinstance(indices_or_sections, integer_types):
        if axis_size % indices_or_sections:
            raise ValueError("array split does not result in an equal division")
        result = _op("SliceChannel", ary, num_outputs=int(indices_or_sections), axis=axis,
                     squeeze_axis=squeeze_axis)
        return result if isinstance(result, list) else [result]
    if not isinstance(indices_or_sections, (tuple, list)):
        raise ValueError("indices_or_sections must either int or tuple of ints")
    bounds = [0] + [min(int(i), axis_size) for i in indices_or_sections] + [axis_size]
    parts = []
    for begin, end in zip(bounds[:-1], bounds[1:]):
        part = _op("slice_axis", ary, axis=axis, begin=begin, end=max(begin, end))
        if squeeze_axis:
            if part.shape[axis] != 1:
                raise ValueError("squeeze_axis needs parts of size 1 along axis %d, got %d"
                                 % (axis, part.shape[axis]))
            part = part.squeeze(axis=axis)
        parts.append(part)
    return parts


def onehot_encode(indices, out):
    """Write the one-hot rows of ``indices`` into ``out`` (deprecated in MXNet: use ``one_hot``)."""
    return _op("one_hot", indices, depth=out.shape[1], dtype=dtype_name(out.dtype), out=out)


def fill_element_0index(lhs, mhs, rhs, out=None):
    """A copy of the matrix ``lhs`` with ``result[i, rhs[i]] = mhs[i]`` for every row i (MXNet's
    legacy function; ``pick`` is its reading counterpart)."""
    rows, cols = lhs.shape
    chosen = _op("one_hot", rhs, depth=cols, dtype="bool")
    values = _op("broadcast_to", mhs.astype(lhs.dtype).reshape((rows, 1)), shape=(rows, cols))
    return _op("where", chosen, values, lhs, out=out)


def waitall():
    """Wait for every pushed operation; raise the first error any of them hit."""
    _core.waitall()


def _elementwise(lhs, rhs, array_op, scalar_op, rscalar_op):
    """MXNet's two-operand helpers: arrays broadcast, a scalar on either side is folded in."""
    if isinstance(lhs, numeric_types) and isinstance(rhs, numeric_types):
        # Two scalars give a Python scalar, as in MXNet (``nd.power(0.9, t)``).
        return _SCALAR_FUNCTIONS[array_op](lhs, rhs)
    if isinstance(lhs, numeric_types):
        return _apply(rscalar_op, rhs, scalar=float(lhs))
    if isinstance(rhs, numeric_types):
        return _apply(scalar_op, lhs, scalar=float(rhs))
    return _apply(array_op, lhs, rhs)


_HELPERS = {
    # name: (broadcast op, op with a scalar on the right, op with a scalar on the left)
    "add": ("broadcast_add", "_plus_scalar", "_plus_scalar"),
    "subtract": ("broadcast_sub", "_minus_scalar", "_rminus_scalar"),
    "multiply": ("broadcast_mul", "_mul_scalar", "_mul_scalar"),
    "divide": ("broadcast_div", "_div_scalar", "_rdiv_scalar"),
    "modulo": ("broadcast_mod", "_mod_scalar", "_rmod_scalar"),
    "power": ("broadcast_power", "_power_scalar", "_rpower_scalar"),
    "maximum": ("broadcast_maximum", "_maximum_scalar", "_maximum_scalar"),
    "minimum": ("broadcast_minimum", "_minimum_scalar", "_minimum_scalar"),
    "equal": ("broadcast_equal", "_equal_scalar", "_equal_scalar"),
    "not_equal": ("broadcast_not_equal", "_not_equal_scalar", "_not_equal_scalar"),
    "greater": ("broadcast_greater", "_greater_scalar", "_lesser_scalar"),
    "greater_equal": ("broadcast_greater_equal", "_greater_equal_scalar", "_lesser_equal_scalar"),
    "lesser": ("broadcast_lesser", "_lesser_scalar", "_greater_scalar"),
    "lesser_equal": ("broadcast_lesser_equal", "_lesser_equal_scalar", "_greater_equal_scalar"),
    "logical_and": ("broadcast_logical_and", "_logical_and_scalar", "_logical_and_scalar"),
    "logical_or": ("broadcast_logical_or", "_logical_or_scalar", "_logical_or_scalar"),
    "logical_xor": ("broadcast_logical_xor", "_logical_xor_scalar", "_logical_xor_scalar"),
}


_SCALAR_FUNCTIONS = {
    "broadcast_add": lambda x, y: x + y,
    "broadcast_sub": lambda x, y: x - y,
    "broadcast_mul": lambda x, y: x * y,
    "broadcast_div": lambda x, y: x / y,
    "broadcast_mod": lambda x, y: x % y,
    "broadcast_power": lambda x, y: x ** y,
    "broadcast_maximum": lambda x, y: x if x > y else y,
    "broadcast_minimum": lambda x, y: x if x < y else y,
    # Comparisons give 1 or 0, as MXNet's do.
    "broadcast_equal": lambda x, y: int(x == y),
    "broadcast_not_equal": lambda x, y: int(x != y),
    "broadcast_greater": lambda x, y: int(x > y),
    "broadcast_greater_equal": lambda x, y: int(x >= y),
    "broadcast_lesser": lambda x, y: int(x < y),
    "broadcast_lesser_equal": lambda x, y: int(x <= y),
    "broadcast_logical_and": lambda x, y: int(bool(x) and bool(y)),
    "broadcast_logical_or": lambda x, y: int(bool(x) or bool(y)),
    "broadcast_logical_xor": lambda x, y: int(bool(x) != bool(y)),
}


def _make_helper(name, ops):
    def helper(lhs, rhs):
        return _elementwise(lhs, rhs, *ops)
    helper.__name__ = name
    helper.__doc__ = "Element-wise %s of two arrays (broadcasting) or of an array and a scalar." % name
    return helper


for _name, _ops in _HELPERS.items():
    globals()[_name] = _make_helper(_name, _ops)
