"""How the estimator trains and evaluates on one mini-batch; override to customise."""

from .... import autograd
from ...utils import split_and_load

__all__ = ["BatchProcessor"]


class BatchProcessor:
    """Supplies ``fit_batch`` and ``evaluate_batch`` to an ``Estimator``. Subclass it and pass
    an instance as ``Estimator(batch_processor=...)`` to change what one step does."""

    def _get_data_and_label(self, batch, ctx, batch_axis=0):
        data = split_and_load(batch[0], ctx_list=ctx, batch_axis=batch_axis)
        label = split_and_load(batch[1], ctx_list=ctx, batch_axis=batch_axis)
        return data, label

    def evaluate_batch(self, estimator, val_batch, batch_axis=0):
        """Runs ``estimator.val_net`` and ``estimator.val_loss`` on one validation batch split
        across ``estimator.context``; returns ``(data, label, pred, loss)``, lists with one
        entry per context."""
        data, label = self._get_data_and_label(val_batch, estimator.context, batch_axis)
        pred = [estimator.val_net(x) for x in data]
        loss = [estimator.val_loss(y_hat, y) for y_hat, y in zip(pred, label)]
        return data, label, pred, loss

    def fit_batch(self, estimator, train_batch, batch_axis=0):
        """Forward and backward of ``estimator.net`` and ``estimator.loss`` on one training
        batch split across ``estimator.context``; returns ``(data, label, pred, loss)``, lists
        with one entry per context. The parameter update itself is left to
        ``GradientUpdateHandler``."""
        data, label = self._get_data_and_label(train_batch, estimator.context, batch_axis)
        with autograd.record():
            pred = [estimator.net(x) for x in data]
            loss = [estimator.loss(y_hat, y) for y_hat, y in zip(pred, label)]
        for shard_loss in loss:
            shard_loss.backward()
        return data, label, pred, loss
