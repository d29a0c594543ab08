"""Gluon helpers (MXNet's ``mxnet.gluon.utils``)."""

import hashlib
import math

import numpy as np

from .. import ndarray


def split_data(data, num_slice, batch_axis=0, even_split=True):
    """Split ``data`` into ``num_slice`` parts along ``batch_axis``."""
    size = data.shape[batch_axis]
    if even_split and size % num_slice != 0:
        raise ValueError("data with shape %s cannot be evenly split into %d slices along axis %d. Use a batch size "
                         "that's multiple of %d or set even_split=False to allow uneven partitioning of data."
                         % (str(data.shape), num_slice, batch_axis, num_slice))
    if size < num_slice:
        raise ValueError("Too many slices for data with shape %s. Arguments are num_slice=%d and batch_axis=%d."
                         % (str(data.shape), num_slice, batch_axis))
    # numpy.array_split's sections: the first `extras` slices take one more element.
    each, extras = divmod(size, num_slice)
    ends = np.cumsum([each + 1] * extras + [each] * (num_slice - extras)).tolist()
    bounds = list(zip([0] + ends[:-1], ends))
    if batch_axis == 0:
        return [data[a:b] for a, b in bounds]
    return [ndarray.slice_axis(data, batch_axis, a, b) for a, b in bounds]


def split_and_load(data, ctx_list, batch_axis=0, even_split=True):
    """Split ``data`` along ``batch_axis`` and load one part onto each context."""
    if not isinstance(data, ndarray.NDArray):
        data = ndarray.array(data, ctx=ctx_list[0])
    if len(ctx_list) == 1:
        return [data.as_in_context(ctx_list[0])]
    slices = split_data(data, len(ctx_list), batch_axis, even_split)
    return [s.as_in_context(ctx) for s, ctx in zip(slices, ctx_list)]


def clip_global_norm(arrays, max_norm, check_isfinite=True):
    """Scale ``arrays`` in place so that their joint 2-norm is at most ``max_norm``; returns the
    norm before scaling."""
    if not arrays:
        raise AssertionError("arrays must not be empty")
    total = sum(float((a.astype(np.float32) ** 2).sum().asscalar()) for a in arrays)
    norm = math.sqrt(total)
    if check_isfinite and not np.isfinite(norm):
        import warnings
        warnings.warn(UserWarning("nan or inf is detected. Clipping results will be undefined."), stacklevel=2)
    scale = max_norm / (norm + 1e-8)
    if scale < 1.0:
        for a in arrays:
            a *= scale
    return norm


def check_sha1(filename, sha1_hash):
    sha1 = hashlib.sha1()
    with open(filename, "rb") as f:
        for chunk in iter(lambda: f.read(1048576), b""):
            sha1.update(chunk)
    return sha1.hexdigest() == sha1_hash


def download(url, path=None, overwrite=False, sha1_hash=None, retries=5, verify_ssl=True):
    raise RuntimeError("oxnet does not download files (%s); fetch it yourself and pass the local path" % url)
