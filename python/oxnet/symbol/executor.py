"""The Executor (MXNet's ``mxnet.executor.Executor``): a symbol bound to arrays."""

import numpy as np

from .. import _core
from ..base import MXNetError
from ..ndarray import NDArray


def _arrays(handles):
    return [None if h is None else NDArray(h) for h in handles]


class Executor:
    """Runs a bound symbol: ``forward`` fills ``outputs``, ``backward`` the gradient arrays."""

    def __init__(self, symbol, ctx, args, grads, grad_reqs, aux, shared_exec=None, group2ctx=None):
        self._symbol = symbol
        self._ctx = ctx
        self._grad_reqs = list(grad_reqs)
        # Nodes annotated with a ctx_group in group2ctx run on that group's context.
        self._group2ctx = dict(group2ctx or {})
        self.handle = _core.ExecutorHandle(
            symbol.handle, ctx._as_tuple(),
            [a.handle for a in args], [None if g is None else g.handle for g in grads],
            self._grad_reqs, [a.handle for a in aux],
            None if shared_exec is None else shared_exec.handle,
            [(group, c._as_tuple()) for group, c in self._group2ctx.items()])
        # The Python arrays the caller passed stay the bound arrays (shared storage).
        self.arg_arrays = list(args)
        self.grad_arrays = list(grads)
        self.aux_arrays = list(aux)
        self.outputs = _arrays(self.handle.outputs())
        self._monitor = None

    @property
    def arg_dict(self):
        return dict(zip(self._symbol.list_arguments(), self.arg_arrays))

    @property
    def grad_dict(self):
        return dict(zip(self._symbol.list_arguments(), self.grad_arrays))

    @property
    def aux_dict(self):
        return dict(zip(self._symbol.list_auxiliary_states(), self.aux_arrays))

    @property
    def output_dict(self):
        return dict(zip(self._symbol.list_outputs(), self.outputs))

    def forward(self, is_train=False, **kwargs):
        """Compute the outputs; keyword arrays are first copied into the named arguments."""
        arg_dict = self.arg_dict
        for name, value in kwargs.items():
            if name not in arg_dict:
                raise ValueError("Unknown argument %s; arguments are %s" % (name, ", ".join(arg_dict)))
            target = arg_dict[name]
            if isinstance(value, NDArray):
                if value.shape != target.shape:
                    raise ValueError("Shape of %s does not match: given %s, bound %s" % (name, value.shape, target.shape))
                value.copyto(target)
            else:
                target[:] = np.asarray(value)
        self.handle.forward(bool(is_train))
        if self._monitor is not None:
            self._run_monitor(is_train)
        return self.outputs

    def backward(self, out_grads=None, is_train=True):
        """Gradients of the outputs weighted by ``out_grads`` (ones by default) into
        ``grad_arrays``, after a ``forward(is_train=True)``."""
        if out_grads is None:
            grads = []
        elif isinstance(out_grads, NDArray):
            grads = [out_grads.handle]
        elif isinstance(out_grads, dict):
            grads = [out_grads[name].handle for name in self._symbol.list_outputs()]
        else:
            grads = [None if g is None else g.handle for g in out_grads]
        # MXNet reads one head gradient per output and ignores any beyond them.
        grads = grads[:len(self.outputs)]
        if self._monitor is None:
            self.handle.backward(grads)
            return
        # As MXNet's monitor: each node's input gradients (`<node>_backward_output<i>`).
        callback, _ = self._monitor
        for name, handle in self.handle.backward_monitored(grads):
            callback(name, NDArray(handle))

    def copy_params_from(self, arg_params, aux_params=None, allow_extra_params=False):
        """Copy parameter values into the bound arrays by name."""
        for name, array in arg_params.items():
            if name in self.arg_dict:
                array.astype(self.arg_dict[name].dtype).copyto(self.arg_dict[name])
            elif not allow_extra_params:
                raise ValueError("Find name \"%s\" that is not in the arguments" % name)
        for name, array in (aux_params or {}).items():
            if name in self.aux_dict:
                array.astype(self.aux_dict[name].dtype).copyto(self.aux_dict[name])
            elif not allow_extra_params:
                raise ValueError("Find name %s that is not in the auxiliary states" % name)

    def reshape(self, partial_shaping=False, allow_up_sizing=False, **kwargs):
        """An executor for new input shapes that shares this one's memory: arrays that keep
        their shape are shared, smaller ones are views of this executor's arrays, larger ones
        (with ``allow_up_sizing``) are new; intermediate values and outputs reuse this
        executor's storage, so the two executors must not run at the same time."""
        from .. import ndarray as nd
        arg_shapes, _, aux_shapes = self._symbol.infer_shape(**kwargs)
        if arg_shapes is None:
            raise MXNetError("reshape: cannot infer every shape from %s" % kwargs)

        def resized(name, array, shape):
            if array is None or array.shape == tuple(shape):
                return array
            if name not in kwargs and not partial_shaping:
                raise MXNetError("reshape: shape of unspecified array %s changed from %s to %s; pass "
                                 "partial_shaping=True to allow it" % (name, array.shape, tuple(shape)))
            size = int(np.prod(shape))
            if size <= array.size:
                return array.reshape(-1)[:size].reshape(shape)
            if not allow_up_sizing:
                raise MXNetError("reshape: new shape of %s %s is larger than the original %s; pass "
                                 "allow_up_sizing=True to allocate new memory" % (name, tuple(shape), array.shape))
            return nd.zeros(shape, ctx=array.context, dtype=array.dtype)

        names = self._symbol.list_arguments()
        args = [resized(n, a, s) for n, a, s in zip(names, self.arg_arrays, arg_shapes)]
        grads = [resized(n, g, s) for n, g, s in zip(names, self.grad_arrays, arg_shapes)]
        aux = [resized(n, a, s) for n, a, s in zip(self._symbol.list_auxiliary_states(), self.aux_arrays, aux_shapes)]
        return Executor(self._symbol, self._ctx, args, grads, self._grad_reqs, aux, shared_exec=self,
                        group2ctx=self._group2ctx)

    def get_optimized_symbol(self):
        """The graph this executor runs: the bound symbol after its graph passes (common
        subexpression elimination unless ``MXNET_ELIMINATE_COMMON_EXPR=0``)."""
        from .symbol import Symbol
        return Symbol(self.handle.optimized_symbol())

    def set_monitor_callback(self, callback, monitor_all=False):
        """Call ``callback(name, array)`` with every node's output after each forward pass
        (and with every operator input as well when ``monitor_all``), and with every input
        gradient of each differentiated node after backward (``<node>_backward_output<i>``)."""
        self._monitor = (callback, monitor_all)

    def _run_monitor(self, is_train):
        callback, monitor_all = self._monitor
        internals = self._symbol.get_internals()
        names = internals.list_outputs()
        watched = Executor(internals, self._ctx, self.arg_arrays, [None] * len(self.arg_arrays),
                           ["null"] * len(self.arg_arrays), self.aux_arrays, group2ctx=self._group2ctx)
        watched.handle.forward(bool(is_train))
        arguments = set(self._symbol.list_inputs())
        for name, array in zip(names, watched.outputs):
            if monitor_all or name not in arguments:
                callback(name, array)

    @property
    def planned_bytes(self):
        """Bytes of the static memory plan for intermediate values, gradients and outputs
        (parameters and gradient arrays not included): the exact figure behind ``debug_str``."""
        return self.handle.planned_bytes()

    def debug_str(self):
        """The symbol's debug text, then the planned memory in whole MB, as MXNet prints it."""
        return self._symbol.debug_str() + "Total %d MB allocated\n" % (self.planned_bytes >> 20)
