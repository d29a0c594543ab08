"""Gradient compression (``KVStore.set_gradient_compression``): MXNet's 2-bit quantization with
error feedback.

Each value of a gradient is added to a residual kept by the sender; where the residual reaches
+threshold the sender sends +threshold and subtracts it from the residual, where it reaches
-threshold it sends -threshold and adds it back, elsewhere it sends 0. What is not sent stays in
the residual and is sent in a later step, so no gradient is lost, only delayed. Three states fit
in 2 bits: sixteen values per float32 word travel between workers."""

import numpy as np

from ..base import MXNetError
from .. import ndarray as nd

__all__ = ["create_compression"]


def create_compression(compression_params):
    """The compression that ``compression_params`` (e.g. ``{'type': '2bit', 'threshold': 0.5}``)
    describes."""
    if not isinstance(compression_params, dict):
        raise TypeError("compression_params must be a dict such as {'type': '2bit', 'threshold': 0.5}, got %s"
                        % type(compression_params).__name__)
    if "type" not in compression_params:
        raise MXNetError("set_gradient_compression: compression_params needs a 'type' (only '2bit' exists)")
    kind = str(compression_params["type"])
    unknown = set(compression_params) - {"type", "threshold"}
    if unknown:
        raise MXNetError("set_gradient_compression: unknown parameter(s) %s for type '%s'" % (sorted(unknown), kind))
    if kind != "2bit":
        raise MXNetError("Unknown type for gradient compression %s" % kind)
    return TwoBitCompression(float(compression_params.get("threshold", 0.5)))


class TwoBitCompression:
    """2-bit quantization with a residual per (key, sender)."""

    def __init__(self, threshold):
        if not threshold > 0:
            raise MXNetError("set_gradient_compression: threshold must be greater than 0, got %s" % threshold)
        self.threshold = threshold
        self._residuals = {}

    def quantized(self, key, sender, grad):
        """What ``grad`` of ``sender`` (a device index) sends for ``key``: -threshold, 0 or
        +threshold per value, the rest kept in the residual (engine ops, in the pushing order)."""
        if grad.dtype != np.float32:
            raise MXNetError("2bit gradient compression supports float32 gradients only, key %r is %s"
                             % (key, np.dtype(grad.dtype).name))
        residual = self._residuals.get((key, sender))
        if residual is None:
            residual = self._residuals[(key, sender)] = nd.zeros(grad.shape, ctx=grad.context, dtype=grad.dtype)
        residual += grad
        sent = ((residual >= self.threshold) - (residual <= -self.threshold)) * self.threshold
        residual -= sent
        return sent

    def exchange(self, key, values, comm):
        """Replace ``values`` (this rank's float32 gradient, a NumPy view) by the sum over the ranks
        of their quantized gradients: each rank sends 2 bits a value (``MPI_Allgather``)."""
        if values.dtype != np.float32:
            raise MXNetError("2bit gradient compression supports float32 gradients only, key %r is %s"
                             % (key, values.dtype.name))
        residual = self._residuals.get((key, "worker"))
        if residual is None:
            residual = self._residuals[(key, "worker")] = np.zeros(values.size, dtype=np.float32)
        residual += values
        signs = (residual >= self.threshold).astype(np.int8) - (residual <= -self.threshold).astype(np.int8)
        residual -= signs * np.float32(self.threshold)
        packed = _pack_signs(signs)
        gathered = np.empty((comm.Get_size(), packed.size), dtype=np.uint8)
        comm.Allgather(packed, gathered)
        total = np.zeros(values.size, dtype=np.int32)
        for row in gathered:
            total += _unpack_signs(row, values.size)
        values[:] = total * np.float32(self.threshold)


def _pack_signs(signs):
    """Four 2-bit codes a byte: 0 for 0, 1 for +1, 3 for -1."""
    codes = np.zeros(-(-signs.size // 4) * 4, dtype=np.uint8)
    codes[:signs.size] = signs.view(np.uint8) & 3
    quads = codes.reshape(-1, 4)
    return quads[:, 0] | (quads[:, 1] << 2) | (quads[:, 2] << 4) | (quads[:, 3] << 6)


def _unpack_signs(packed, size):
    codes = ((packed[:, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3).reshape(-1)[:size]
    return (codes == 1).astype(np.int32) - (codes == 3).astype(np.int32)
