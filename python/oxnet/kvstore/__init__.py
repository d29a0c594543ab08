"""Key-value stores (MXNet's ``mxnet.kvstore``, also ``mx.kv``): a single-process store that
sums values pushed from several devices and can run the optimizer, and distributed stores that
also sum over the processes of an MPI job."""

from .base import KVStoreBase, TestStore, create
from .kvstore import KVStore
from .dist import DistKVStore, Horovod

__all__ = ["KVStoreBase", "KVStore", "DistKVStore", "Horovod", "create"]
