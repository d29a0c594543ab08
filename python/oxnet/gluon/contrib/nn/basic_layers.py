"""Contributed layers: containers that run every child on the same input and join the results,
the identity layer, an embedding with a dedicated sparse-style API, synchronized batch
normalization and pixel-shuffle upsampling."""

import warnings

from .... import context, ndarray
from ...block import Block, HybridBlock
from ...nn import BatchNorm, HybridSequential, Sequential

__all__ = ["Concurrent", "HybridConcurrent", "Identity", "SparseEmbedding", "SyncBatchNorm", "PixelShuffle1D",
           "PixelShuffle2D", "PixelShuffle3D"]


class Concurrent(Sequential):
    """Every child sees the same input; their outputs are concatenated along ``axis``."""

    def __init__(self, axis=-1, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        self.axis = axis

    def forward(self, x):
        return ndarray.concat(*[child(x) for child in self._children.values()], dim=self.axis)


class HybridConcurrent(HybridSequential):
    """Hybridizable ``Concurrent``: children's outputs on one input, concatenated along ``axis``."""

    def __init__(self, axis=-1, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        self.axis = axis

    def hybrid_forward(self, F, x):
        return F.concat(*[child(x) for child in self._children.values()], dim=self.axis)


class Identity(HybridBlock):
    """Returns its input; the pass-through branch of a ``HybridConcurrent``."""

    def hybrid_forward(self, F, x):
        return x


class SparseEmbedding(Block):
    """Turns non-negative integer indices into rows of an ``(input_dim, output_dim)`` weight.

    MXNet stores this layer's weight and gradient as ``row_sparse`` arrays for very large
    vocabularies. oxnet has no sparse storage: the weight is a dense array and its gradient is
    dense too (zero in the rows no index looked up), so any optimizer can update it; the
    results are those of the sparse layer with standard (non-lazy) updates.

    Parameters
    ----------
    input_dim : int
        Size of the vocabulary, i.e. the largest index + 1.
    output_dim : int
        Dimension of the embedding vectors.
    dtype : str or np.dtype, default 'float32'
    weight_initializer : Initializer

    Inputs: ``data`` of shape ``(x1, ..., xk)``. Output: shape ``(x1, ..., xk, output_dim)``.
    """

    def __init__(self, input_dim, output_dim, dtype="float32", weight_initializer=None, **kwargs):
        super().__init__(**kwargs)
        self._kwargs = {"input_dim": input_dim, "output_dim": output_dim, "dtype": dtype}
        self.weight = self.params.get("weight", shape=(input_dim, output_dim), init=weight_initializer, dtype=dtype)

    def forward(self, x):
        return ndarray.Embedding(x, self.weight.data(x.context), name="fwd", **self._kwargs)

    def __repr__(self):
        return "{block_name}({input_dim} -> {output_dim}, {dtype})".format(block_name=self.__class__.__name__,
                                                                           **self._kwargs)


class SyncBatchNorm(BatchNorm):
    """Batch normalization whose statistics MXNet synchronizes over ``num_devices`` GPUs.

    oxnet runs a network on one device, where synchronized and plain batch normalization are
    the same computation: this layer is ``BatchNorm`` over the channel axis 1 with MXNet's
    ``SyncBatchNorm`` arguments. Splitting one batch across several contexts is refused,
    because the statistics would then be per device, not over the whole batch.

    Parameters
    ----------
    in_channels : int, default 0
        Number of channels; inferred from the first input when 0.
    num_devices : int, default number of visible GPUs (at least 1)
    momentum, epsilon, center, scale, use_global_stats, beta_initializer, gamma_initializer,
    running_mean_initializer, running_variance_initializer :
        As for ``gluon.nn.BatchNorm``.
    """

    def __init__(self, in_channels=0, num_devices=None, momentum=0.9, epsilon=1e-5, center=True, scale=True,
                 use_global_stats=False, beta_initializer="zeros", gamma_initializer="ones",
                 running_mean_initializer="zeros", running_variance_initializer="ones", **kwargs):
        super().__init__(axis=1, momentum=momentum, epsilon=epsilon, center=center, scale=scale,
                         use_global_stats=use_global_stats, beta_initializer=beta_initializer,
                         gamma_initializer=gamma_initializer, running_mean_initializer=running_mean_initializer,
                         running_variance_initializer=running_variance_initializer, in_channels=in_channels,
                         **kwargs)
        self.num_devices = self._default_num_devices() if num_devices is None else num_devices

    @staticmethod
    def _default_num_devices():
        warnings.warn("Caution using SyncBatchNorm: if not using all the GPUs, please mannually set num_devices",
                      UserWarning)
        return max(context.num_gpus(), 1)

    def hybrid_forward(self, F, x, gamma, beta, running_mean, running_var):
        if len(self.gamma.list_ctx()) > 1:
            raise NotImplementedError("SyncBatchNorm: synchronizing batch statistics across %d contexts is not "
                                      "supported by oxnet; train on one context"
                                      % len(self.gamma.list_ctx()))
        return super().hybrid_forward(F, x, gamma, beta, running_mean, running_var)


def _upsampling_factors(factor, ndim, layer_name):
    try:
        factors = (int(factor),) * ndim
    except TypeError:
        factors = tuple(int(f) for f in factor)
        if len(factors) != ndim:
            raise ValueError("%s: factor must be an int or a %d-tuple of int, got %s" % (layer_name, ndim, factor))
    return factors


def _pixel_shuffle(F, x, factors):
    """(N, C*f1*...*fk, S1, ..., Sk) -> (N, C, S1*f1, ..., Sk*fk): the channel groups become
    f1 x ... x fk blocks of pixels, the group index running over the block row-major."""
    k = len(factors)
    spatial_keep = (0,) * k
    # (N, C, f1*...*fk, S...) then peel one factor at a time off the flattened block axis:
    # (N, C, f1, ..., fk, S...).
    x = F.reshape(x, (0, -4, -1, _product(factors)) + spatial_keep)
    for i, f in enumerate(factors[:-1]):
        x = F.reshape(x, (0, 0) + (0,) * i + (-4, f, -1) + spatial_keep)
    # Interleave: (N, C, S1, f1, S2, f2, ..., Sk, fk).
    axes = [0, 1]
    for i in range(k):
        axes += [2 + k + i, 2 + i]
    x = F.transpose(x, axes=tuple(axes))
    return F.reshape(x, (0, 0) + (-3,) * k)


def _product(values):
    result = 1
    for v in values:
        result *= v
    return result


class PixelShuffle1D(HybridBlock):
    """Upsampling by regrouping channels into pixels along W: ``(N, f*C, W)`` ->
    ``(N, C, W*f)``, where output pixel ``w*f + i`` of channel ``c`` is input channel
    ``c*f + i`` at ``w``.

    Parameters
    ----------
    factor : int or 1-tuple of int
    """

    def __init__(self, factor):
        super().__init__()
        self._factors = _upsampling_factors(factor, 1, "PixelShuffle1D")

    def hybrid_forward(self, F, x):
        return _pixel_shuffle(F, x, self._factors)

    def __repr__(self):
        return "{}({})".format(self.__class__.__name__, self._factors[0])


class PixelShuffle2D(HybridBlock):
    """Sub-pixel upsampling (Shi et al. 2016): ``(N, f1*f2*C, H, W)`` -> ``(N, C, H*f1, W*f2)``;
    each group of ``f1*f2`` channels becomes an ``f1 x f2`` block of pixels, row-major.

    Parameters
    ----------
    factor : int or 2-tuple of int
        Factors for H and W.
    """

    def __init__(self, factor):
        super().__init__()
        self._factors = _upsampling_factors(factor, 2, "PixelShuffle2D")

    def hybrid_forward(self, F, x):
        return _pixel_shuffle(F, x, self._factors)

    def __repr__(self):
        return "{}({})".format(self.__class__.__name__, self._factors)


class PixelShuffle3D(HybridBlock):
    """Voxel-shuffle upsampling: ``(N, f1*f2*f3*C, D, H, W)`` -> ``(N, C, D*f1, H*f2, W*f3)``;
    each group of ``f1*f2*f3`` channels becomes an ``f1 x f2 x f3`` block, row-major.

    Parameters
    ----------
    factor : int or 3-tuple of int
        Factors for D, H and W.
    """

    def __init__(self, factor):
        super().__init__()
        self._factors = _upsampling_factors(factor, 3, "PixelShuffle3D")

    def hybrid_forward(self, F, x):
        return _pixel_shuffle(F, x, self._factors)

    def __repr__(self):
        return "{}({})".format(self.__class__.__name__, self._factors)
