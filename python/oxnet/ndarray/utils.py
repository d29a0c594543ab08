"""Saving and loading NDArrays in MXNet's binary format."""

import os

from .. import _core
from .ndarray import NDArray


def _pack(data):
    if isinstance(data, NDArray):
        return [data.handle], []
    if isinstance(data, dict):
        names, handles = [], []
        for k, v in data.items():
            if not isinstance(k, str) or not isinstance(v, NDArray):
                raise TypeError("save only accepts a dict of str to NDArray")
            names.append(k)
            handles.append(v.handle)
        return handles, names
    if isinstance(data, (list, tuple)):
        if not all(isinstance(v, NDArray) for v in data):
            raise TypeError("save only accepts a list of NDArrays")
        return [v.handle for v in data], []
    raise TypeError("save expects an NDArray, a list of NDArrays or a dict of str to NDArray, not %s"
                    % type(data).__name__)


def _unpack(handles, names):
    arrays = [NDArray(h) for h in handles]
    return dict(zip(names, arrays)) if names else arrays


def save(fname, data):
    """Save an NDArray, a list or a dict of NDArrays; files are readable by MXNet 1.x."""
    handles, names = _pack(data)
    _core.save(os.fspath(fname), handles, names)


def load(fname):
    """Load what ``save`` (or MXNet) wrote: a list, or a dict when the file holds names."""
    return _unpack(*_core.load(os.fspath(fname)))


def load_frombuffer(buf):
    return _unpack(*_core.load_frombuffer(bytes(buf)))


def save_tobuffer(data):
    handles, names = _pack(data)
    return _core.save_tobuffer(handles, names)
