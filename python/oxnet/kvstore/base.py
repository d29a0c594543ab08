"""The key-value store interface, its registry of Python stores and ``create``."""

import warnings

from ..base import string_types
from ..ndarray import NDArray

__all__ = ["create", "KVStoreBase"]


class KVStoreBase:
    """Interface of a key-value store used by ``gluon.Trainer`` and ``Module`` to sum gradients
    over devices (and workers) and, when it is capable, to run the optimizer. Subclasses
    registered with ``KVStoreBase.register`` are created by ``mx.kv.create(<lower-case name>)``."""

    OPTIMIZER = "optimizer"

    kv_registry = {}

    def broadcast(self, key, value, out, priority=0):
        """Initialize ``key`` with ``value`` and copy it into ``out``."""
        raise NotImplementedError()

    def pushpull(self, key, value, out=None, priority=0):
        """Sum ``value`` (a list holds one array per device) and write the result (or, on a
        store that runs the optimizer, the updated weight) into ``out`` (``value`` if None)."""
        raise NotImplementedError()

    def set_optimizer(self, optimizer):
        """Run ``optimizer`` on pushed gradients (stores capable of OPTIMIZER only)."""
        raise NotImplementedError()

    def is_capable(self, capability):
        """Whether the store supports ``capability`` (e.g. ``KVStoreBase.OPTIMIZER``)."""
        raise NotImplementedError()

    def save_optimizer_states(self, fname, dump_optimizer=False):
        raise NotImplementedError()

    def load_optimizer_states(self, fname):
        raise NotImplementedError()

    @property
    def type(self):
        raise NotImplementedError()

    @property
    def rank(self):
        raise NotImplementedError()

    @property
    def num_workers(self):
        raise NotImplementedError()

    @staticmethod
    def register(klass):
        """Class decorator: make ``klass`` creatable as ``mx.kv.create(klass.__name__.lower())``."""
        assert isinstance(klass, type)
        name = klass.__name__.lower()
        if name in KVStoreBase.kv_registry:
            previous = KVStoreBase.kv_registry[name]
            warnings.warn("WARNING: New kvstore %s.%s is overriding existing kvstore %s.%s"
                          % (klass.__module__, klass.__name__, previous.__module__, previous.__name__))
        KVStoreBase.kv_registry[name] = klass
        return klass


def _as_out_list(out):
    return out if isinstance(out, list) else [out]


@KVStoreBase.register
class TestStore(KVStoreBase):
    """A minimal store for tests: sums over devices, cannot run an optimizer."""

    def broadcast(self, key, value, out, priority=0):
        for target in _as_out_list(out):
            target[:] = value

    def pushpull(self, key, value, out=None, priority=0):
        if isinstance(value, NDArray):
            if out is not None:
                for target in _as_out_list(out):
                    target[:] = value
            return
        ctx = value[0].context
        reduced = value[0].as_in_context(ctx).copy()
        for other in value[1:]:
            reduced += other.as_in_context(ctx)
        for target in (value if out is None else _as_out_list(out)):
            target[:] = reduced.as_in_context(target.context)

    @staticmethod
    def is_capable(capability):
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return False
        raise ValueError("Unknown capability: {}".format(capability))

    @property
    def type(self):
        return "teststore"

    @property
    def rank(self):
        return 0

    @property
    def num_workers(self):
        return 1

    def set_optimizer(self, optimizer):
        raise NotImplementedError("TestStore cannot run an optimizer")

    def save_optimizer_states(self, fname, dump_optimizer=False):
        raise NotImplementedError("TestStore has no optimizer states")

    def load_optimizer_states(self, fname):
        raise NotImplementedError("TestStore has no optimizer states")


def create(name="local"):
    """A new store: a registered Python store by name ('horovod', 'teststore', ...), a
    distributed store on MPI for names with 'dist' ('dist_sync', 'dist_device_sync', 'dist'),
    otherwise the single-process store ('local', 'device', 'local_allreduce_cpu', ...)."""
    if not isinstance(name, string_types):
        raise TypeError("name must be a string")
    name = name.lower()
    if name in KVStoreBase.kv_registry:
        return KVStoreBase.kv_registry[name]()
    if "dist" in name:
        from .dist import DistKVStore
        return DistKVStore(name)
    from .kvstore import KVStore
    return KVStore(name)
