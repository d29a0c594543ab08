"""Distributed key-value stores on MPI: 'dist_sync', 'dist_device_sync', 'dist' and 'horovod'.

Every rank keeps a full copy of the store. ``push`` sums the values over the rank's devices, then
over the ranks (an allreduce pushed on the engine, see ``mpi``), and, with an optimizer set,
updates every rank's copy of the weight with the same summed gradient, so the copies stay
identical without a parameter server. ``init`` and ``broadcast`` start every rank from rank 0's
value. Launch the program with ``mpirun -n N`` or ``python -m oxnet.launch -n N``."""

from .. import _core
from ..base import MXNetError
from ..ndarray import NDArray
from .base import KVStoreBase
from .kvstore import KVStore, _grouped, _key_value_pairs
from . import mpi

__all__ = ["DistKVStore", "Horovod"]


class DistKVStore(KVStore):
    """The synchronous distributed store: every push is summed over all ranks' pushes of the
    same key (each rank pushes every key, in the same order)."""

    _distributed = True

    def __init__(self, name="dist_sync"):
        if "async" in name:
            raise MXNetError("kvstore '%s': asynchronous updates need a parameter server, which oxnet does not "
                             "run; its MPI stores are synchronous: use 'dist_sync' or 'dist_device_sync'" % name)
        super().__init__(name)
        self._comm = mpi.communicator(name)

    def _share_initial_value(self, key, stored):
        self._comm.broadcast(key, stored, root=0)

    def _reduce_across_workers(self, key, merged):
        self._comm.allreduce(key, merged, self._compression)

    def pushpull(self, key, value, out=None, priority=0):
        """``push`` then ``pull``. Without an updater, a key pushed as one array and pulled
        into it is summed over the ranks in place, and the store keeps a copy taken after the
        sum: no copy stands between the gradient and its communication."""
        if self._updater is not None or (out is not None and out is not value):
            return super().pushpull(key, value, out, priority)
        pairs = _key_value_pairs(key, value, "pushpull")
        self._check_key_types(pairs, "pushpull")
        groups = _grouped(pairs)
        if any(len(values) != 1 for values in groups.values()):
            return super().pushpull(key, value, out, priority)
        for k, (array,) in groups.items():
            stored = self._stored(k, "pushpull")
            if array.shape != stored.shape:
                raise MXNetError("kvstore.pushpull: key %r holds shape %s, pushed %s" % (k, stored.shape, array.shape))
            self._comm.allreduce(k, array, self._compression)
            self._store[k] = array.copy()
        return None

    @property
    def rank(self):
        return self._comm.rank

    @property
    def num_workers(self):
        return self._comm.size

    def _barrier(self):
        """Return once every worker has reached it."""
        self._comm.barrier()

    def barrier(self):
        """Return once every worker has reached it."""
        self._comm.barrier()

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Rank 0 writes the states (the same on every rank); every rank returns once it is written."""
        assert self._updater is not None, "Cannot save states for distributed training"
        if self.rank == 0:
            _core.write_file(fname, self._updater.get_states(dump_optimizer))
        self._comm.barrier()


@KVStoreBase.register
class Horovod(DistKVStore):
    """MXNet's 'horovod' store on MPI: ``pushpull`` sums in place over the ranks and
    ``broadcast`` copies rank 0's value; it runs no optimizer (each rank updates its own
    weights with the summed gradients)."""

    def __init__(self):
        super().__init__("horovod")

    def pushpull(self, key, value, out=None, priority=0):
        """Sum ``value`` over the ranks (and over this rank's devices) into ``out`` (``value``
        when None), with no copy for one array reduced in place."""
        pairs = _key_value_pairs(key, value, "pushpull")
        targets = pairs if out is None else _key_value_pairs(key, out, "pushpull")
        groups = {}
        for k, v in pairs:
            groups.setdefault(k, []).append(v)
        for k, values in groups.items():
            outs = [t for tk, t in targets if tk == k]
            if len(values) == 1 and len(outs) == 1 and outs[0] is values[0]:
                self._comm.allreduce(k, values[0], self._compression)
                continue
            merged = self._merge_devices(k, values, values[0].context)
            self._comm.allreduce(k, merged, self._compression)
            for target in outs:
                merged.copyto(target)

    def broadcast(self, key, value, out, priority=0):
        """Copy rank 0's ``value`` (one array per key) into ``out`` on every rank."""
        if not isinstance(key, (list, tuple)):
            key, value, out = [key], [value], [out]
        for k, v, o in zip(key, value, out):
            shared = (v[0] if isinstance(v, (list, tuple)) else v).copy()
            self._comm.broadcast(k, shared, root=0)
            for target in ([o] if isinstance(o, NDArray) else list(o)):
                shared.copyto(target)

    @staticmethod
    def is_capable(capability):
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return False
        raise ValueError("Unknown capability: {}".format(capability))

    def set_optimizer(self, optimizer):
        raise NotImplementedError("the horovod store runs no optimizer: use update_on_kvstore=False")

    @property
    def type(self):
        return "horovod"
