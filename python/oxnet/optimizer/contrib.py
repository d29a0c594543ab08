"""Contrib optimizers (MXNet's ``mxnet.optimizer.contrib``)."""

from .. import ndarray as nd
from .optimizer import Optimizer, register

__all__ = ["GroupAdaGrad"]


@register
class GroupAdaGrad(Optimizer):
    """AdaGrad with one learning rate per row of a 2-D weight:
    history += mean(square(g), axis=1); w -= lr * g / sqrt(history + eps), with
    g = clip(grad * rescale_grad). Weight decay is not supported (MXNet's rule)."""

    def __init__(self, eps=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.float_stable_eps = eps

    def create_state(self, index, weight):
        if len(weight.shape) != 2:
            raise ValueError("GroupAdaGrad needs 2-D weights, got shape %s" % (weight.shape,))
        return nd.zeros((weight.shape[0], 1), ctx=weight.context)

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        if wd != 0:
            raise ValueError("Weight decay is not supported for GroupAdaGrad (got wd=%g)" % wd)
        grad = self._clipped(grad)
        state[:] = state + nd.mean(nd.square(grad), axis=1, keepdims=True)
        weight[:] = weight - lr * grad / nd.sqrt(state + self.float_stable_eps)
