"""DLPack exchange with other frameworks (MXNet's ``mx.nd.to_dlpack_for_read``,
``to_dlpack_for_write`` and ``from_dlpack``).

Exporting shares memory: the capsule addresses the array's own buffer and keeps the array alive
until the consumer releases it. Importing copies: the foreign tensor (host memory) is copied into
a new cpu array when ``from_dlpack`` is called, and the producer's memory is released at once.
"""

from .. import _core
from .ndarray import NDArray


def to_dlpack_for_read(data):
    """A DLPack capsule sharing ``data``'s memory, once its pending writes are done."""
    return data.to_dlpack_for_read()


def to_dlpack_for_write(data):
    """A DLPack capsule sharing ``data``'s memory, once its pending reads and writes are done."""
    return data.to_dlpack_for_write()


def from_dlpack(dlpack):
    """A new cpu NDArray holding a copy of a DLPack tensor: a ``dltensor`` capsule (consumed, as
    DLPack requires) or an object with ``__dlpack__`` (a NumPy array, a torch tensor, ...)."""
    if hasattr(dlpack, "__dlpack__"):
        dlpack = dlpack.__dlpack__()
    return NDArray(_core.from_dlpack(dlpack))
