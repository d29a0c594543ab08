"""The ``Estimator``: a training loop over a Gluon ``DataLoader`` driven by event handlers."""

import copy
import logging
import sys
import warnings

from ....context import Context, cpu, gpu, num_gpus
from ....metric import Loss as metric_loss
from ...data import DataLoader
from ...loss import Loss as gluon_loss
from ...trainer import Trainer
from .batch_processor import BatchProcessor
from .event_handler import (BatchBegin, BatchEnd, EpochBegin, EpochEnd, GradientUpdateHandler, LoggingHandler,
                            MetricHandler, StoppingHandler, TrainBegin, TrainEnd, ValidationHandler,
                            _check_event_handlers)
from .utils import _check_handler_metric_ref, _check_metrics, _suggest_metric_for_loss

__all__ = ["Estimator"]


class Estimator:
    """Trains and evaluates a Gluon network with a loss, metrics and a trainer.

    Parameters
    ----------
    net : gluon.Block
        The model to train.
    loss : gluon.loss.Loss
        The training objective.
    train_metrics : EvalMetric or list of EvalMetric
        Metrics computed on the training data; their names get a "training " prefix. When none
        is given, a metric suited to the loss (accuracy for softmax cross-entropy) and the loss
        value itself are used.
    val_metrics : EvalMetric or list of EvalMetric
        Metrics computed on validation data (by default copies of the training metrics); their
        names get a "validation " prefix.
    initializer : Initializer
        Initializes the parameters of ``net`` that are not yet initialized.
    trainer : gluon.Trainer
        Applies the optimizer; by default SGD with learning rate 0.001.
    context : Context or list of Context
        Where to run (the batch is split across a list); by default gpu(0) if present, else cpu.
    val_net : gluon.Block
        The model used for validation, usually sharing ``net``'s parameters (give it
        ``params=net.collect_params()`` and build its layers inside its ``name_scope`` so that
        the names match).
    val_loss : gluon.loss.Loss
        The validation loss; ``loss`` by default.
    batch_processor : BatchProcessor
        Supplies ``fit_batch`` and ``evaluate_batch``.

    ``logger`` is a ``logging.Logger`` of this estimator writing INFO and above to stdout; add
    handlers to it (e.g. a ``logging.FileHandler``) to also log elsewhere.
    """

    logger = None

    def __init__(self, net, loss, train_metrics=None, val_metrics=None, initializer=None, trainer=None, context=None,
                 val_net=None, val_loss=None, batch_processor=None):
        self.net = net
        self.loss = self._check_loss(loss)
        self._train_metrics = _check_metrics(train_metrics)
        self._val_metrics = _check_metrics(val_metrics)
        self._add_default_training_metrics()
        self._add_validation_metrics()
        self.val_loss = self.loss if val_loss is None else self._check_loss(val_loss)
        self.val_net = self.net if val_net is None else val_net

        self.logger = logging.Logger(name="Estimator", level=logging.INFO)
        self.logger.addHandler(logging.StreamHandler(sys.stdout))

        self.context = self._check_context(context)
        self._initialize(initializer)
        self.trainer = self._check_trainer(trainer)
        self.batch_processor = self._check_batch_processor(batch_processor)
        self.max_epoch = None
        self.max_batch = None
        self.batch_axis = 0

    # ---- argument checks ----------------------------------------------------------------------
    @staticmethod
    def _check_loss(loss):
        if not isinstance(loss, gluon_loss):
            raise ValueError("loss must be a Loss, refer to gluon.loss.Loss:{}".format(loss))
        return loss

    @staticmethod
    def _check_context(context):
        available_gpus = [gpu(i) for i in range(num_gpus())]
        if not context:
            if len(available_gpus) > 1:
                warnings.warn("You have multiple GPUs, gpu(0) will be used by default. To utilize all your GPUs, "
                              "specify context as a list of gpus, e.g. context=[mx.gpu(0), mx.gpu(1)] ")
            return [available_gpus[0]] if available_gpus else [cpu()]
        if isinstance(context, Context):
            context = [context]
        elif not (isinstance(context, list) and all(isinstance(c, Context) for c in context)):
            raise ValueError("context must be a Context or a list of Context, for example mx.cpu() or "
                             "[mx.gpu(0), mx.gpu(1)], refer to mxnet.Context:{}".format(context))
        for ctx in context:
            assert ctx in available_gpus or ctx.device_type == "cpu", \
                "%s is not available, please make sure your context is in one of: mx.cpu(), %s" % (
                    ctx, ", ".join(str(c) for c in available_gpus))
        return context

    @staticmethod
    def _check_batch_processor(batch_processor):
        if batch_processor is None:
            return BatchProcessor()
        if not (callable(getattr(batch_processor, "fit_batch", None))
                and callable(getattr(batch_processor, "evaluate_batch", None))):
            raise ValueError("Customized Batch Processor must contain fit_batch() and evaluate_batch() methods")
        return batch_processor

    def _check_trainer(self, trainer):
        if not trainer:
            warnings.warn("No trainer specified, default SGD optimizer with learning rate 0.001 is used.")
            return Trainer(self.net.collect_params(), "sgd", {"learning_rate": 0.001})
        if not isinstance(trainer, Trainer):
            raise ValueError("Trainer must be a Gluon Trainer instance, refer to gluon.Trainer:{}".format(trainer))
        return trainer

    def _is_initialized(self):
        params = self.net.collect_params()
        for name in params:
            try:
                params[name].list_ctx()
            except RuntimeError:
                return False
        return True

    def _initialize(self, initializer):
        if not self._is_initialized():
            # Partly initialized nets (fine-tuning a pretrained body) keep their initialized
            # parameters: Block.initialize skips them.
            if initializer:
                self.net.initialize(init=initializer, ctx=self.context)
            else:
                self.net.initialize(ctx=self.context)
        elif initializer:
            warnings.warn("Network already fully initialized, skipping initialization. You don't need to pass "
                          "initializer if you already initialized your net. You can use "
                          "net.initialize(init=your_initializer, force_reinit=True) to force re-initialize.")

    # ---- metrics ------------------------------------------------------------------------------
    def _add_default_training_metrics(self):
        if not self._train_metrics:
            suggested_metric = _suggest_metric_for_loss(self.loss)
            if suggested_metric:
                self._train_metrics = [suggested_metric]
            self._train_metrics.append(metric_loss(self.loss.name.rstrip("0123456789")))
        # The prefixes let handlers tell training metrics from validation ones.
        for metric in self._train_metrics:
            metric.name = "training " + metric.name

    def _add_validation_metrics(self):
        if not self._val_metrics:
            self._val_metrics = [copy.deepcopy(metric) for metric in self._train_metrics]
        for metric in self._val_metrics:
            if "training" in metric.name:
                metric.name = metric.name.replace("training", "validation")
            else:
                metric.name = "validation " + metric.name

    @property
    def train_metrics(self):
        return self._train_metrics

    @property
    def val_metrics(self):
        return self._val_metrics

    # ---- one batch ------------------------------------------------------------------------------
    def _get_data_and_label(self, batch, ctx, batch_axis=0):
        return self.batch_processor._get_data_and_label(batch, ctx, batch_axis)

    def fit_batch(self, train_batch, batch_axis=0):
        """Forward and backward on one training batch; returns ``(data, label, pred, loss)``.
        Delegates to ``batch_processor.fit_batch``; override in a subclass to customise."""
        return self.batch_processor.fit_batch(self, train_batch, batch_axis)

    def evaluate_batch(self, val_batch, batch_axis=0):
        """Forward on one validation batch; returns ``(data, label, pred, loss)``. Delegates to
        ``batch_processor.evaluate_batch``; override in a subclass to customise."""
        return self.batch_processor.evaluate_batch(self, val_batch, batch_axis)

    # ---- loops --------------------------------------------------------------------------------
    @staticmethod
    def _check_data_loader(data, what):
        if not isinstance(data, DataLoader):
            raise ValueError("Estimator only support input as Gluon DataLoader. Alternatively, you can transform "
                             "your DataIter or any NDArray into Gluon DataLoader. Refer to gluon.data.DataLoader "
                             "(got %s of type %s)" % (what, type(data).__name__))

    def evaluate(self, val_data, batch_axis=0, event_handlers=None):
        """Evaluates ``val_net`` on ``val_data`` (a DataLoader), updating ``val_metrics``.

        Parameters
        ----------
        val_data : DataLoader
        batch_axis : int, default 0
            The axis along which a batch is split across contexts.
        event_handlers : EventHandler or list of EventHandler
            Besides these, a MetricHandler and a LoggingHandler for ``val_metrics`` are added
            unless given.
        """
        self._check_data_loader(val_data, "val_data")
        for metric in self.val_metrics:
            metric.reset()
        handlers = self._prepare_default_validation_handlers(event_handlers)
        _, epoch_begin, batch_begin, batch_end, epoch_end, _ = self._categorize_handlers(handlers)

        for handler in epoch_begin:
            handler.epoch_begin(self)
        for batch in val_data:
            for handler in batch_begin:
                handler.batch_begin(self, batch=batch)
            _, label, pred, loss = self.evaluate_batch(batch, batch_axis)
            for handler in batch_end:
                handler.batch_end(self, batch=batch, pred=pred, label=label, loss=loss)
        for handler in epoch_end:
            handler.epoch_end(self)

    def fit(self, train_data, val_data=None, epochs=None, event_handlers=None, batches=None, batch_axis=0):
        """Trains on ``train_data`` (a DataLoader) for ``epochs`` epochs or ``batches`` batches
        (exactly one of them).

        Parameters
        ----------
        train_data : DataLoader
        val_data : DataLoader, default None
            When given, a ValidationHandler evaluates on it at each epoch end (unless one is
            given in ``event_handlers``).
        epochs : int, default None
        event_handlers : EventHandler or list of EventHandler
            Besides these, a StoppingHandler, a GradientUpdateHandler, a MetricHandler and a
            LoggingHandler are added unless one of the same type is given.
        batches : int, default None
        batch_axis : int, default 0
            The axis along which a batch is split across contexts.
        """
        self._check_data_loader(train_data, "train_data")
        if (not epochs) == (not batches):
            raise ValueError("Fit only support exactly one type of iteration, train by number of epochs or number of "
                             "batches. Please specify one and only one of: epochs or batches.")
        self.max_epoch = epochs
        self.max_batch = batches
        self.batch_axis = batch_axis

        handlers = self._prepare_default_handlers(val_data, event_handlers)
        train_begin, epoch_begin, batch_begin, batch_end, epoch_end, train_end = self._categorize_handlers(handlers)

        for handler in train_begin:
            handler.train_begin(self)
        while True:
            for handler in epoch_begin:
                handler.epoch_begin(self)
            for batch in train_data:
                for handler in batch_begin:
                    handler.batch_begin(self, batch=batch)
                _, label, pred, loss = self.fit_batch(batch, batch_axis)
                # Every handler sees the batch end, even when an earlier one asks to stop.
                stop_requests = [handler.batch_end(self, batch=batch, pred=pred, label=label, loss=loss)
                                 for handler in batch_end]
                if any(stop_requests):
                    break
            stop_requests = [handler.epoch_end(self) for handler in epoch_end]
            if any(stop_requests):
                break
        for handler in train_end:
            handler.train_end(self)

    # ---- handlers -----------------------------------------------------------------------------
    def _prepare_default_handlers(self, val_data, event_handlers):
        handlers = _check_event_handlers(event_handlers)
        defaults = [StoppingHandler(self.max_epoch, self.max_batch)]

        def given(handler_type):
            return any(isinstance(handler, handler_type) for handler in handlers)

        if not given(GradientUpdateHandler):
            defaults.append(GradientUpdateHandler())
        if not given(MetricHandler):
            defaults.append(MetricHandler(metrics=self.train_metrics))
        if not given(ValidationHandler) and val_data:
            defaults.append(ValidationHandler(val_data=val_data, eval_fn=self.evaluate))
        if not given(LoggingHandler):
            defaults.append(LoggingHandler(metrics=self.train_metrics))

        # Default handlers only update the estimator's own metric objects, so user handlers
        # mixed with them must watch those same objects.
        mixing_handlers = bool(handlers)
        handlers.extend(defaults)
        if mixing_handlers:
            known_metrics = set(self.train_metrics + self.val_metrics)
            for handler in handlers:
                _check_handler_metric_ref(handler, known_metrics)
        handlers.sort(key=lambda handler: getattr(handler, "priority", 0))
        return handlers

    def _prepare_default_validation_handlers(self, event_handlers):
        handlers = _check_event_handlers(event_handlers)
        defaults = []
        if not any(isinstance(handler, MetricHandler) for handler in handlers):
            defaults.append(MetricHandler(metrics=self.val_metrics))
        if not any(isinstance(handler, LoggingHandler) for handler in handlers):
            defaults.append(LoggingHandler(metrics=self.val_metrics))

        mixing_handlers = bool(handlers) and bool(defaults)
        handlers.extend(defaults)
        if mixing_handlers:
            known_metrics = set(self.val_metrics)
            for handler in handlers:
                _check_handler_metric_ref(handler, known_metrics)
        handlers.sort(key=lambda handler: getattr(handler, "priority", 0))
        return handlers

    @staticmethod
    def _categorize_handlers(event_handlers):
        """Splits handlers by the events they subscribe to: (train_begin, epoch_begin,
        batch_begin, batch_end, epoch_end, train_end) lists."""
        events = (TrainBegin, EpochBegin, BatchBegin, BatchEnd, EpochEnd, TrainEnd)
        return tuple([handler for handler in event_handlers if isinstance(handler, event)] for event in events)
