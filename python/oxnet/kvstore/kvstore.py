"""The single-process key-value store (MXNet's 'local' and 'device' stores)."""

from ..base import MXNetError, integer_types, string_types
from .. import ndarray as nd
from ..ndarray import NDArray
from .. import _core
from .. import optimizer as opt
from .base import KVStoreBase
from .compression import create_compression

__all__ = ["KVStore"]


def _key_value_pairs(keys, values, what):
    """Flatten (key, value) arguments into a list of (key, array) pairs: one key with an
    array or a list of arrays (one per device), or a list of keys with one such value each."""
    if isinstance(keys, (tuple, list)):
        if len(keys) != len(values):
            raise MXNetError("kvstore.%s: %d keys but %d values" % (what, len(keys), len(values)))
        pairs = []
        for key, value in zip(keys, values):
            pairs.extend(_key_value_pairs(key, value, what))
        return pairs
    if not isinstance(keys, integer_types + string_types):
        raise MXNetError("kvstore.%s: a key must be an int or a str, got %s" % (what, type(keys).__name__))
    if isinstance(values, NDArray):
        return [(keys, values)]
    values = list(values)
    for value in values:
        if not isinstance(value, NDArray):
            raise MXNetError("kvstore.%s: values of key %r must be NDArrays, got %s"
                             % (what, keys, type(value).__name__))
    return [(keys, value) for value in values]


def _grouped(pairs):
    """Arrays of each key, keys in first-seen order."""
    groups = {}
    for key, value in pairs:
        groups.setdefault(key, []).append(value)
    return groups


class KVStore(KVStoreBase):
    """Stores one array per key. ``push`` sums the arrays pushed for a key (one per device)
    and either stores the sum or, once an updater is set (``set_optimizer``,
    ``_set_updater``), calls ``updater(key, summed, stored)`` to update the stored array in
    place; ``pull`` copies the stored array to every output. One process: rank 0 of 1 worker.

    A store takes either int keys or str keys, not both. Distributed stores ('dist_*') are the
    subclass ``DistKVStore``, made by ``mx.kv.create``."""

    # Whether pushes are also summed over other processes (then gradient compression applies
    # between workers, not between devices).
    _distributed = False

    def __init__(self, name="local"):
        if "nccl" in name:
            raise MXNetError("kvstore '%s': the NCCL store needs CUDA GPUs, which oxnet does not run on yet; "
                             "use 'local' or 'device'" % name)
        self._type = name
        self._store = {}
        self._key_type = None
        self._updater = None
        self._compression = None

    def _check_key_types(self, pairs, what):
        for key, _ in pairs:
            key_type = str if isinstance(key, string_types) else int
            if self._key_type is None:
                self._key_type = key_type
            elif key_type is not self._key_type:
                raise MXNetError("kvstore.%s: mixed key types are not allowed: this store uses %s keys, got %r"
                                 % (what, self._key_type.__name__, key))

    def _stored(self, key, what):
        if key not in self._store:
            raise MXNetError("kvstore.%s: key %r has not been initialized" % (what, key))
        return self._store[key]

    def init(self, key, value):
        """Store a copy of ``value`` under ``key`` (each key once)."""
        pairs = _key_value_pairs(key, value, "init")
        self._check_key_types(pairs, "init")
        for k, v in pairs:
            if k in self._store:
                raise MXNetError("kvstore.init: duplicate init of key %r" % (k,))
            self._store[k] = v.copy()
            self._share_initial_value(k, self._store[k])

    def push(self, key, value, priority=0):
        """Sum the arrays pushed for each key and store the sum, or update the stored array
        with it through the updater."""
        pairs = _key_value_pairs(key, value, "push")
        self._check_key_types(pairs, "push")
        for k, values in _grouped(pairs).items():
            stored = self._stored(k, "push")
            for v in values:
                if v.shape != stored.shape:
                    raise MXNetError("kvstore.push: key %r holds shape %s, pushed %s" % (k, stored.shape, v.shape))
            merged = self._merge_devices(k, values, stored.context)
            self._reduce_across_workers(k, merged)
            if self._updater is not None:
                self._updater(k, merged, stored)
            else:
                # The sum is a fresh array: it becomes the stored value without a copy.
                self._store[k] = merged

    def _merge_devices(self, key, values, ctx):
        """The sum, on ``ctx``, of the arrays pushed for ``key`` (one per device), each sent
        through the gradient compression when one is set."""
        if self._compression is not None and not self._distributed:
            sent = [self._compression.quantized(key, i, v) for i, v in enumerate(values)]
            merged = sent[0].as_in_context(ctx)
        else:
            sent = values
            merged = values[0].as_in_context(ctx).copy()
        for v in sent[1:]:
            merged += v.as_in_context(ctx)
        return merged

    def _share_initial_value(self, key, stored):
        """Make every worker start from the same value of ``key`` (one process: nothing to do)."""

    def _reduce_across_workers(self, key, merged):
        """Sum ``merged`` over the workers in place (one process: nothing to do)."""

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Copy the stored array of each key into its outputs."""
        assert out is not None
        pairs = _key_value_pairs(key, out, "pull")
        self._check_key_types(pairs, "pull")
        for k, target in pairs:
            stored = self._stored(k, "pull")
            if target.shape != stored.shape:
                raise MXNetError("kvstore.pull: key %r holds shape %s, output has %s" % (k, stored.shape, target.shape))
            stored.copyto(target)

    def pushpull(self, key, value, out=None, priority=0):
        """``push(key, value)`` then ``pull(key, out)`` (into ``value`` when ``out`` is None)."""
        self.push(key, value, priority)
        self.pull(key, value if out is None else out, priority)

    def broadcast(self, key, value, out, priority=0):
        """``init(key, value)`` then ``pull(key, out)``."""
        self.init(key, value)
        self.pull(key, out, priority)

    def row_sparse_pull(self, key, out=None, priority=0, row_ids=None):
        """Copy the rows ``row_ids`` of each stored array into its output and zeros into its
        other rows (the dense form of MXNet's row-sparse pull; oxnet arrays are dense).
        ``row_ids`` is one array of row indices per output."""
        assert out is not None
        assert row_ids is not None
        pairs = _key_value_pairs(key, out, "row_sparse_pull")
        self._check_key_types(pairs, "row_sparse_pull")
        row_ids = [row_ids] if isinstance(row_ids, NDArray) else list(row_ids)
        if len(row_ids) != len(pairs):
            raise MXNetError("kvstore.row_sparse_pull: %d output(s) but %d row_ids array(s)" % (len(pairs), len(row_ids)))
        for (k, target), rows in zip(pairs, row_ids):
            stored = self._stored(k, "row_sparse_pull")
            if target.shape != stored.shape:
                raise MXNetError("kvstore.row_sparse_pull: key %r holds shape %s, output has %s"
                                 % (k, stored.shape, target.shape))
            num_rows = stored.shape[0]
            kept = nd.one_hot(rows.reshape((-1,)).as_in_context(stored.context), depth=num_rows).max(axis=0)
            selected = nd.broadcast_mul(stored, kept.reshape((num_rows,) + (1,) * (stored.ndim - 1)))
            selected.copyto(target)

    def set_gradient_compression(self, compression_params):
        """Send gradients quantized to 2 bits with error feedback (``{'type': '2bit',
        'threshold': t}``): between devices on 'device' stores, between workers on 'dist'
        stores. Set it before the first push."""
        if "device" not in self._type and not self._distributed:
            raise Exception("Gradient compression is not supported for this type of kvstore")  # pylint: disable=broad-exception-raised
        self._compression = create_compression(compression_params)

    def is_capable(self, capability):
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return True
        raise ValueError("Unknown capability: {}".format(capability))

    def set_optimizer(self, optimizer):
        """Run ``optimizer`` on every push: the stored arrays become the weights."""
        self._set_updater(opt.get_updater(optimizer))

    def _set_updater(self, updater):
        """Call ``updater(key, pushed_sum, stored)`` on every push instead of storing the sum."""
        self._updater = updater

    def _barrier(self):
        """Synchronize the workers: nothing to wait for in one process."""

    @property
    def type(self):
        return self._type

    @property
    def rank(self):
        return 0

    @property
    def num_workers(self):
        return 1

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Write the updater's states (and the optimizer with ``dump_optimizer``) to ``fname``."""
        assert self._updater is not None, "Cannot save states for distributed training"
        _core.write_file(fname, self._updater.get_states(dump_optimizer))

    def load_optimizer_states(self, fname):
        assert self._updater is not None, "Cannot load states for distributed training"
        with open(fname, "rb") as fin:
            self._updater.set_states(fin.read())
