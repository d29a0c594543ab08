"""MXNet's Python forms of the multi-weight AdamW updates (``mx.nd.contrib.multi_adamw_update``
and ``multi_mp_adamw_update``): lists of arrays in, one ``_multi_*`` operator call."""

from .ndarray import NDArray, full


def _rescale_array(rescale_grad, ctx):
    if isinstance(rescale_grad, NDArray):
        return rescale_grad
    return full((1,), rescale_grad, ctx=ctx)


def _call(op, groups, rescale_grad, lrs, wds, etas, out, size, kwargs):
    arrays = [array for group in zip(*groups) for array in group]
    arrays.append(_rescale_array(rescale_grad, groups[0][0].context))
    return op(*arrays, out=out, num_weights=size or len(groups[0]), lrs=lrs, wds=wds, etas=etas, **kwargs)


def multi_adamw_update(weights, grads, mean, var, rescale_grad, lrs, wds, etas, out=None, name=None, size=0,
                       **kwargs):
    """AdamW of every (weight, grad, mean, var) with its own lr, wd and eta; skipped when
    ``rescale_grad`` (a number or a one-value array) is 0, NaN or Inf."""
    from . import _internal
    return _call(_internal._multi_adamw_update, (weights, grads, mean, var), rescale_grad, lrs, wds, etas, out,
                 size, kwargs)


def multi_mp_adamw_update(weights, grads, mean, var, weights32, rescale_grad, lrs, wds, etas, out=None, name=None,
                          size=0, **kwargs):
    """``multi_adamw_update`` on the float32 master copies ``weights32`` of lower-precision weights."""
    from . import _internal
    return _call(_internal._multi_mp_adamw_update, (weights, grads, mean, var, weights32), rescale_grad, lrs, wds,
                 etas, out, size, kwargs)
