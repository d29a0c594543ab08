"""Key-value stores (MXNet's ``mxnet.kvstore``, also ``mx.kv``): a single-process store that
sums values pushed from several devices and can run the optimizer."""

from .base import KVStoreBase, TestStore, create
from .kvstore import KVStore

__all__ = ["KVStoreBase", "KVStore", "create"]
