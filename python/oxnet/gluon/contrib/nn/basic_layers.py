"""Containers that run every child on the same input and join the results, and the identity layer."""

from .... import ndarray
from ...block import HybridBlock
from ...nn import HybridSequential, Sequential


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
