"""Devices (MXNet's ``mxnet.context``)."""

import warnings

from . import _core
from . import cuda_libraries


class _ContextClass(type):
    """Gives ``Context`` MXNet 1.x's deprecated class attribute ``Context.default_ctx``: the
    calling thread's current context, read and set."""

    @property
    def default_ctx(cls):
        warnings.warn("Context.default_ctx has been deprecated. Please use Context.current_context() instead.",
                      DeprecationWarning, stacklevel=2)
        return current_context()

    @default_ctx.setter
    def default_ctx(cls, ctx):
        warnings.warn("Context.default_ctx has been deprecated. Please use Context.current_context() instead.",
                      DeprecationWarning, stacklevel=2)
        _core.set_current_context(Context(ctx)._as_tuple())


class Context(metaclass=_ContextClass):
    """A device: ``cpu(i)``, ``gpu(i)`` or ``cpu_pinned(i)``. Usable as ``with Context(...)``."""

    devtype2str = {1: "cpu", 2: "gpu", 3: "cpu_pinned", 5: "cpu_shared"}
    devstr2type = {v: k for k, v in devtype2str.items()}

    def __init__(self, device_type, device_id=0):
        if isinstance(device_type, Context):
            self.device_typeid, self.device_id = device_type.device_typeid, device_type.device_id
        else:
            if device_type not in self.devstr2type:
                raise ValueError("unknown device type %r; expected one of %s"
                                 % (device_type, ", ".join(self.devstr2type)))
            self.device_typeid = self.devstr2type[device_type]
            self.device_id = int(device_id)
            if device_type == "gpu":
                cuda_libraries.preload()
        self._previous = []

    @property
    def device_type(self):
        return self.devtype2str[self.device_typeid]

    def _as_tuple(self):
        return (self.device_typeid, self.device_id)

    @classmethod
    def _from_tuple(cls, t):
        # A (type id, device id) pair the core reports names a device that exists: no checks
        # (a training step asks for arrays' contexts about ten times).
        ctx = object.__new__(cls)
        ctx.device_typeid, ctx.device_id = t
        ctx._previous = []
        return ctx

    def __hash__(self):
        return hash((self.device_typeid, self.device_id))

    def __eq__(self, other):
        return isinstance(other, Context) and self._as_tuple() == other._as_tuple()

    def __str__(self):
        return "%s(%d)" % (self.device_type, self.device_id)

    __repr__ = __str__

    def __enter__(self):
        self._previous.append(_core.set_current_context(self._as_tuple()))
        return self

    def __exit__(self, *exc):
        _core.set_current_context(self._previous.pop())

    def empty_cache(self):
        """Return the memory pooled for this device's freed arrays to the system now (arrays still
        alive, or still used by pending operations, keep theirs: call ``mx.nd.waitall()`` first).
        Host memory also goes back by itself after an idle time; see the README's Memory notes."""
        if self.device_type == "gpu":
            _core.gpu_pool_release_all(self.device_id)
        else:
            _core.cpu_pool_release_all()


def cpu(device_id=0):
    return Context("cpu", device_id)


def gpu(device_id=0):
    return Context("gpu", device_id)


def cpu_pinned(device_id=0):
    return Context("cpu_pinned", device_id)


def current_context():
    """The context of ``with`` blocks on this thread (``cpu(0)`` outside any)."""
    return Context._from_tuple(_core.get_current_context())


def gpu_memory_info(device_id=0):
    """(free, total) bytes of GPU ``device_id``'s memory, as the CUDA driver reports them."""
    cuda_libraries.preload()
    return _core.gpu_memory_info(device_id)


def num_gpus():
    """Number of GPUs the CUDA driver reports (0 without CUDA)."""
    cuda_libraries.preload()
    return _core.num_gpus()
