"""Event handlers the ``Estimator`` calls during training and evaluation.

A handler subclasses one or more of the event mixins (``TrainBegin``, ``EpochBegin``,
``BatchBegin``, ``BatchEnd``, ``EpochEnd``, ``TrainEnd``); the estimator calls the matching
method of every handler at that point of the loop. ``batch_end`` and ``epoch_end`` return True
to ask the estimator to stop. Handlers run in ascending ``priority`` (default 0)."""

import os
import re
import time
import warnings

import numpy as np

from ....metric import CompositeEvalMetric, EvalMetric
from ....metric import Loss as metric_loss
from .utils import _check_metrics

__all__ = ["TrainBegin", "TrainEnd", "EpochBegin", "EpochEnd", "BatchBegin", "BatchEnd",
           "StoppingHandler", "MetricHandler", "ValidationHandler", "LoggingHandler", "CheckpointHandler",
           "EarlyStoppingHandler", "GradientUpdateHandler"]


class EventHandler:
    """Base of every event handler."""


def _check_event_handlers(handlers):
    """Normalise ``handlers`` (None, one handler or a list) to a new list of handlers."""
    if isinstance(handlers, EventHandler):
        return [handlers]
    handlers = list(handlers or [])
    if not all(isinstance(handler, EventHandler) for handler in handlers):
        raise ValueError("handlers must be an EventHandler or a list of EventHandler, got: {}".format(handlers))
    return handlers


class TrainBegin(EventHandler):
    def train_begin(self, estimator, *args, **kwargs):
        pass


class TrainEnd(EventHandler):
    def train_end(self, estimator, *args, **kwargs):
        pass


class EpochBegin(EventHandler):
    def epoch_begin(self, estimator, *args, **kwargs):
        pass


class EpochEnd(EventHandler):
    def epoch_end(self, estimator, *args, **kwargs):
        return False


class BatchBegin(EventHandler):
    def batch_begin(self, estimator, *args, **kwargs):
        pass


class BatchEnd(EventHandler):
    def batch_end(self, estimator, *args, **kwargs):
        return False


def _improvement_test(mode, monitor, handler_name):
    """The comparison ``op(new, best)`` that says the monitored value improved. ``mode`` is
    'min', 'max' or 'auto'; 'auto' treats accuracy and F1 as greater-is-better and any other
    metric as smaller-is-better, and warns which one it picked."""
    if mode not in ("auto", "min", "max"):
        warnings.warn("%s mode %s is unknown, fallback to auto mode: max for accuracy and F1 metrics, min for "
                      "the others" % (handler_name, mode), RuntimeWarning)
        mode = "auto"
    if mode == "min":
        return np.less
    if mode == "max":
        return np.greater
    name = str(monitor.get()[0])
    if "acc" in name.lower() or "f1" in name.lower():
        warnings.warn("`greater` operator will be used to determine if {} has improved. Please specify "
                      "`mode='min'` to use the `less` operator. Specify `mode='max'` to disable this warning."
                      .format(name))
        return np.greater
    warnings.warn("`less` operator will be used to determine if {} has improved. Please specify `mode='max'` "
                  "to use the `greater` operator. Specify `mode='min'` to disable this warning.".format(name))
    return np.less


class StoppingHandler(TrainBegin, BatchEnd, EpochEnd):
    """Stops training once ``max_epoch`` epochs or ``max_batch`` batches have run (the limits
    are taken from the estimator at train begin)."""

    def __init__(self, max_epoch=None, max_batch=None):
        self.max_epoch = max_epoch
        self.max_batch = max_batch
        self.current_batch = 0
        self.current_epoch = 0
        self.stop_training = False

    def train_begin(self, estimator, *args, **kwargs):
        self.max_epoch = estimator.max_epoch
        self.max_batch = estimator.max_batch
        self.current_batch = 0
        self.current_epoch = 0

    def batch_end(self, estimator, *args, **kwargs):
        self.current_batch += 1
        if self.current_batch == self.max_batch:
            self.stop_training = True
        return self.stop_training

    def epoch_end(self, estimator, *args, **kwargs):
        self.current_epoch += 1
        if self.current_epoch == self.max_epoch:
            self.stop_training = True
        return self.stop_training


class MetricHandler(EpochBegin, BatchEnd):
    """Resets ``metrics`` at each epoch begin and updates them at each batch end with the
    batch's labels and predictions (``metric.Loss`` instances are fed the loss values).

    Parameters
    ----------
    metrics : EvalMetric or list of EvalMetric
    priority : scalar, default -1000
        Runs before the default handlers so that they see up-to-date metric values.
    """

    def __init__(self, metrics, priority=-1000):
        self.metrics = _check_metrics(metrics)
        self.priority = priority

    def epoch_begin(self, estimator, *args, **kwargs):
        for metric in self.metrics:
            metric.reset()

    def batch_end(self, estimator, *args, **kwargs):
        pred, label, loss = kwargs["pred"], kwargs["label"], kwargs["loss"]
        for metric in self.metrics:
            if isinstance(metric, metric_loss):
                metric.update(0, loss)
            else:
                metric.update(label, pred)


class ValidationHandler(TrainBegin, BatchEnd, EpochEnd):
    """Runs ``eval_fn(val_data=..., batch_axis=..., event_handlers=...)`` (usually
    ``estimator.evaluate``) every ``epoch_period`` epochs and/or every ``batch_period``
    batches.

    Parameters
    ----------
    val_data : DataLoader
    eval_fn : callable
    epoch_period : int or None, default 1
    batch_period : int or None, default None
    priority : scalar, default -1000
    event_handlers : EventHandler or list of EventHandler
        Passed on to ``eval_fn`` for the validation loop.
    """

    def __init__(self, val_data, eval_fn, epoch_period=1, batch_period=None, priority=-1000, event_handlers=None):
        self.val_data = val_data
        self.eval_fn = eval_fn
        self.epoch_period = epoch_period
        self.batch_period = batch_period
        self.current_batch = 0
        self.current_epoch = 0
        self.priority = priority
        self.event_handlers = event_handlers

    def _validate(self, estimator):
        self.eval_fn(val_data=self.val_data, batch_axis=estimator.batch_axis, event_handlers=self.event_handlers)

    def train_begin(self, estimator, *args, **kwargs):
        self.current_batch = 0
        self.current_epoch = 0

    def batch_end(self, estimator, *args, **kwargs):
        self.current_batch += 1
        if self.batch_period and self.current_batch % self.batch_period == 0:
            self._validate(estimator)

    def epoch_end(self, estimator, *args, **kwargs):
        self.current_epoch += 1
        if self.epoch_period and self.current_epoch % self.epoch_period == 0:
            self._validate(estimator)


class LoggingHandler(TrainBegin, TrainEnd, EpochBegin, EpochEnd, BatchBegin, BatchEnd):
    """Logs the optimizer, progress and ``metrics`` through ``estimator.logger``.

    Parameters
    ----------
    log_interval : int or 'epoch', default 'epoch'
        'epoch' logs at each epoch's end; an integer k also logs every k batches.
    metrics : list of EvalMetric
        The metrics whose values are logged.
    priority : scalar, default np.inf
        Runs last, after every other handler has updated its state.
    """

    def __init__(self, log_interval="epoch", metrics=None, priority=np.inf):
        if not isinstance(log_interval, int) and log_interval != "epoch":
            raise ValueError("log_interval must be either an integer or string 'epoch'")
        self.metrics = _check_metrics(metrics)
        self.log_interval = log_interval
        self.priority = priority
        self.batch_index = 0
        self.current_epoch = 0
        self.processed_samples = 0
        self.log_interval_time = 0
        self.train_start = self.epoch_start = self.batch_start = time.time()

    def _metric_summary(self):
        return ", ".join("%s: %.4f" % metric.get() for metric in self.metrics)

    def train_begin(self, estimator, *args, **kwargs):
        self.train_start = time.time()
        trainer = estimator.trainer
        estimator.logger.info("Training begin: using optimizer %s with current learning rate %.4f ",
                              trainer.optimizer.__class__.__name__, trainer.learning_rate)
        if estimator.max_epoch:
            estimator.logger.info("Train for %d epochs.", estimator.max_epoch)
        else:
            estimator.logger.info("Train for %d batches.", estimator.max_batch)
        self.current_epoch = 0
        self.batch_index = 0
        self.processed_samples = 0
        self.log_interval_time = 0

    def train_end(self, estimator, *args, **kwargs):
        message = "Train finished using total %ds with %d epochs. " % (time.time() - self.train_start,
                                                                       self.current_epoch)
        estimator.logger.info((message + self._metric_summary()).rstrip(", "))

    def batch_begin(self, estimator, *args, **kwargs):
        if isinstance(self.log_interval, int):
            self.batch_start = time.time()

    def batch_end(self, estimator, *args, **kwargs):
        if isinstance(self.log_interval, int):
            self.log_interval_time += time.time() - self.batch_start
            self.processed_samples += kwargs["batch"][0].shape[0]
            if self.batch_index % self.log_interval == 0:
                message = "[Epoch %d][Batch %d][Samples %s] time/interval: %.3fs " % (
                    self.current_epoch, self.batch_index, self.processed_samples, self.log_interval_time)
                self.log_interval_time = 0
                estimator.logger.info((message + self._metric_summary()).rstrip(", "))
        self.batch_index += 1

    def epoch_begin(self, estimator, *args, **kwargs):
        self.epoch_start = time.time()
        # The estimator names its training metrics "training ..." and its validation metrics
        # "validation ...", which tells whether this handler belongs to a fit or an evaluate.
        if any("training" in metric.name for metric in self.metrics):
            estimator.logger.info("[Epoch %d] Begin, current learning rate: %.4f", self.current_epoch,
                                  estimator.trainer.learning_rate)
        else:
            estimator.logger.info("Validation Begin")

    def epoch_end(self, estimator, *args, **kwargs):
        message = "[Epoch %d] Finished in %.3fs, " % (self.current_epoch, time.time() - self.epoch_start)
        estimator.logger.info((message + self._metric_summary()).rstrip(", "))
        self.current_epoch += 1
        self.batch_index = 0


class CheckpointHandler(TrainBegin, BatchEnd, EpochEnd):
    """Saves the network's parameters (``.params``) and the trainer's states (``.states``) as
    ``{model_prefix}-epoch{E}batch{B}`` in ``model_dir`` every ``epoch_period`` epochs and/or
    ``batch_period`` batches, keeping the newest ``max_checkpoints``; the architecture
    (``{model_prefix}-symbol.json``) is saved after the first batch when the net is a hybridized
    ``HybridBlock``.

    Parameters
    ----------
    model_dir : str
    model_prefix : str, default 'model'
    monitor : EvalMetric, default None
        The metric that decides which checkpoint is the best (with ``save_best``).
    verbose : int, default 0
        1 logs every save.
    save_best : bool, default False
        Also keep ``{model_prefix}-best.params/.states`` for the best ``monitor`` value.
    mode : {'auto', 'min', 'max'}, default 'auto'
        How ``monitor`` improves; 'auto' uses max for accuracy and F1, min otherwise.
    epoch_period : int or None, default 1
    batch_period : int or None, default None
    max_checkpoints : int, default 5
        Older epoch/batch checkpoints are deleted; the best one is not counted.
    resume_from_checkpoint : bool, default False
        Load the newest checkpoint in ``model_dir`` at train begin and train only the remaining
        epochs (or batches).
    """

    def __init__(self, model_dir, model_prefix="model", monitor=None, verbose=0, save_best=False, mode="auto",
                 epoch_period=1, batch_period=None, max_checkpoints=5, resume_from_checkpoint=False):
        self.monitor = monitor
        self.verbose = verbose
        os.makedirs(model_dir, exist_ok=True)
        self.model_dir = model_dir
        self.model_prefix = model_prefix
        self.save_best = save_best
        if save_best and not isinstance(monitor, EvalMetric):
            raise ValueError("To save best model only, please provide one of the metric objects from "
                             "estimator.train_metrics and estimator.val_metrics as monitor.")
        self.epoch_period = epoch_period
        self.batch_period = batch_period
        self.current_batch = 0
        self.current_epoch = 0
        self.max_checkpoints = max_checkpoints
        self.resume_from_checkpoint = resume_from_checkpoint
        self.saved_checkpoints = []
        self.trained_epoch = -1
        self.trained_batch = -1
        if save_best:
            self.monitor_op = _improvement_test(mode, monitor, "CheckpointHandler")
            self.best = np.inf if self.monitor_op is np.less else -np.inf

    def train_begin(self, estimator, *args, **kwargs):
        self.current_epoch = 0
        self.current_batch = 0
        if self.save_best:
            self.best = np.inf if self.monitor_op is np.less else -np.inf
        if self.resume_from_checkpoint:
            # The remaining work is computed in the unit the checkpoints were taken in.
            error_msg = ("To use resume from checkpoint, you must only specify the same type of period you used for "
                         "training. For example, if you are training based on number of epochs, you must save only "
                         "based on epochs, and set batch_period to None.")
            if estimator.max_batch:
                assert self.batch_period, error_msg
                assert not self.epoch_period, error_msg
            if estimator.max_epoch:
                assert self.epoch_period, error_msg
                assert not self.batch_period, error_msg
            self._resume_from_checkpoint(estimator)

    def batch_end(self, estimator, *args, **kwargs):
        if self.current_batch == 0:
            self._save_symbol(estimator)
        if self.batch_period and (self.current_batch + 1) % self.batch_period == 0:
            self._save_checkpoint(estimator)
        self.current_batch += 1

    def epoch_end(self, estimator, *args, **kwargs):
        if self.epoch_period and (self.current_epoch + 1) % self.epoch_period == 0:
            self._save_checkpoint(estimator)
        self.current_epoch += 1

    def _save_checkpoint(self, estimator):
        epoch, batch = self.current_epoch, self.current_batch
        if self.resume_from_checkpoint and self.trained_epoch >= 0:
            # Continue the numbering of the checkpoint training resumed from. At an epoch end
            # current_batch already counts the finished batch; at a batch end it does not yet.
            epoch += self.trained_epoch + 1
            batch += self.trained_batch + (0 if estimator.max_epoch else 1)
        prefix = "%s-epoch%dbatch%d" % (self.model_prefix, epoch, batch)
        self._save_params_and_trainer(estimator, prefix)
        self.saved_checkpoints.append(prefix)
        while len(self.saved_checkpoints) > self.max_checkpoints:
            self._remove_checkpoint(self.saved_checkpoints.pop(0))
        if self.verbose > 0:
            estimator.logger.info("[Epoch %d] CheckpointHandler: trained total %d batches, saving model at %s with "
                                  "prefix: %s", self.current_epoch, self.current_batch + 1, self.model_dir, prefix)
        if self.save_best:
            self._save_if_best(estimator)

    def _save_if_best(self, estimator):
        monitor_name, monitor_value = self.monitor.get()
        if np.isnan(monitor_value):
            warnings.warn(RuntimeWarning("Skipping save best because %s is not updated, make sure you pass one of "
                                         "the metric objects estimator.train_metrics and estimator.val_metrics as "
                                         "monitor" % monitor_name))
            return
        if self.monitor_op(monitor_value, self.best):
            previous_best = self.best
            self.best = monitor_value
            self._save_params_and_trainer(estimator, self.model_prefix + "-best")
            if self.verbose > 0:
                estimator.logger.info("[Epoch %d] CheckpointHandler: %s improved from %0.5f to %0.5f, updating best "
                                      "model at %s with prefix: %s", self.current_epoch, monitor_name, previous_best,
                                      monitor_value, self.model_dir, self.model_prefix + "-best")
        elif self.verbose > 0:
            estimator.logger.info("[Epoch %d] CheckpointHandler: %s did not improve from %0.5f, skipping updating "
                                  "best model", self.current_epoch, monitor_name, self.best)

    def _save_symbol(self, estimator):
        symbol_file = os.path.join(self.model_dir, self.model_prefix + "-symbol.json")
        cached_graph = getattr(estimator.net, "_cached_graph", None)
        if cached_graph:
            cached_graph[1].save(symbol_file)
        else:
            estimator.logger.info("Model architecture(symbol file) is not saved, please use HybridBlock to construct "
                                  "your model, and call net.hybridize() before passing to Estimator in order to save "
                                  "model architecture as %s.", symbol_file)

    def _save_params_and_trainer(self, estimator, file_prefix):
        estimator.net.save_parameters(os.path.join(self.model_dir, file_prefix + ".params"))
        estimator.trainer.save_states(os.path.join(self.model_dir, file_prefix + ".states"))

    def _remove_checkpoint(self, file_prefix):
        for extension in (".params", ".states"):
            path = os.path.join(self.model_dir, file_prefix + extension)
            if os.path.exists(path):
                os.remove(path)

    def _existing_checkpoints(self):
        """(epoch, batch, prefix) of this prefix's checkpoints in model_dir, oldest first."""
        pattern = re.compile(r"^%s-epoch(\d+)batch(\d+)\.params$" % re.escape(self.model_prefix))
        checkpoints = []
        for fname in os.listdir(self.model_dir):
            if not (fname.startswith(self.model_prefix + "-epoch") and fname.endswith(".params")):
                continue
            match = pattern.match(fname)
            if match is None:
                raise ValueError("Error parsing checkpoint file %s, please check your checkpoints have the format: "
                                 "{model_name}-epoch{epoch_number}batch{batch_number}.params, there should also be "
                                 "a .states file for each .params file" % fname)
            checkpoints.append((int(match.group(1)), int(match.group(2)), fname[:-len(".params")]))
        return sorted(checkpoints)

    def _resume_from_checkpoint(self, estimator):
        checkpoints = self._existing_checkpoints()
        if not checkpoints:
            self.trained_epoch = self.trained_batch = -1
            remaining = ("%d batches" % estimator.max_batch if estimator.max_batch
                         else "%d epochs" % estimator.max_epoch)
            estimator.logger.info("CheckpointHandler: No checkpoint found, training from scratch for " + remaining)
            return
        # Checkpoints already on disk count towards max_checkpoints.
        self.saved_checkpoints = [prefix for _, _, prefix in checkpoints]
        self.trained_epoch, self.trained_batch, prefix = checkpoints[-1]
        message = "CheckpointHandler: Checkpoint resumed from epoch %d batch %d, continue to train for " % (
            self.trained_epoch, self.trained_batch)
        if estimator.max_epoch:
            if self.trained_epoch >= estimator.max_epoch - 1:
                raise ValueError("Found checkpoint with maximum number of epoch %d reached, please specify "
                                 "resume_from_checkpoint=False (default value) if you want to train from scratch."
                                 % estimator.max_epoch)
            estimator.max_epoch -= self.trained_epoch + 1
            message += "%d epochs " % estimator.max_epoch
        if estimator.max_batch:
            if self.trained_batch >= estimator.max_batch - 1:
                raise ValueError("Found checkpoint with maximum number of batch %d reached, please specify "
                                 "resume_from_checkpoint=False (default value) if you want to train from scratch."
                                 % self.trained_batch)
            estimator.max_batch -= self.trained_batch + 1
            message += "%d batches " % estimator.max_batch
        param_file = os.path.join(self.model_dir, prefix + ".params")
        trainer_file = os.path.join(self.model_dir, prefix + ".states")
        assert os.path.exists(trainer_file), "Failed to load checkpoint, %s does not exist" % trainer_file
        estimator.net.load_parameters(param_file, ctx=estimator.context)
        estimator.trainer.load_states(trainer_file)
        estimator.logger.warning(message)


class EarlyStoppingHandler(TrainBegin, EpochEnd, TrainEnd):
    """Stops training when ``monitor`` has not improved for ``patience`` epochs.

    Parameters
    ----------
    monitor : EvalMetric
        One of the estimator's training or validation metrics (not a composite).
    min_delta : float, default 0
        The smallest change that counts as an improvement.
    patience : int, default 0
        Epochs without improvement tolerated before stopping.
    mode : {'auto', 'min', 'max'}, default 'auto'
        How ``monitor`` improves; 'auto' uses max for accuracy and F1, min otherwise.
    baseline : float, default None
        The value to beat at the first epoch.
    """

    def __init__(self, monitor, min_delta=0, patience=0, mode="auto", baseline=None):
        if not isinstance(monitor, EvalMetric):
            raise ValueError("Please provide one of the metric objects from estimator.train_metrics and "
                             "estimator.val_metrics as monitor.")
        if isinstance(monitor, CompositeEvalMetric):
            raise ValueError("CompositeEvalMetric is not supported for EarlyStoppingHandler, please specify a "
                             "simple metric instead.")
        self.monitor = monitor
        self.baseline = baseline
        self.patience = patience
        self.monitor_op = _improvement_test(mode, monitor, "EarlyStopping")
        # Signed so that `monitor_op(value - min_delta, best)` demands a min_delta improvement.
        self.min_delta = min_delta if self.monitor_op is np.greater else -min_delta
        self.wait = 0
        self.stopped_epoch = 0
        self.current_epoch = 0
        self.stop_training = False
        self.best = None

    def train_begin(self, estimator, *args, **kwargs):
        self.wait = 0
        self.stopped_epoch = 0
        self.current_epoch = 0
        self.stop_training = False
        if self.baseline is not None:
            self.best = self.baseline
        else:
            self.best = np.inf if self.monitor_op is np.less else -np.inf

    def epoch_end(self, estimator, *args, **kwargs):
        monitor_name, monitor_value = self.monitor.get()
        if np.isnan(monitor_value):
            warnings.warn(RuntimeWarning("%s is not updated, make sure you pass one of the metric objects from "
                                         "estimator.train_metrics and estimator.val_metrics as monitor."
                                         % monitor_name))
        elif self.monitor_op(monitor_value - self.min_delta, self.best):
            self.best = monitor_value
            self.wait = 0
        else:
            self.wait += 1
            if self.wait >= self.patience:
                self.stopped_epoch = self.current_epoch
                self.stop_training = True
        self.current_epoch += 1
        return self.stop_training

    def train_end(self, estimator, *args, **kwargs):
        if self.stopped_epoch > 0:
            estimator.logger.info("[Epoch %d] EarlyStoppingHandler: early stopping due to %s not improving",
                                  self.stopped_epoch, self.monitor.get()[0])


class GradientUpdateHandler(BatchEnd):
    """Applies the gradients with ``estimator.trainer.step(batch_size)`` at each batch end,
    the batch size being the total number of loss rows over all contexts.

    Parameters
    ----------
    priority : scalar, default -2000
        Runs first, so that the other handlers see the updated weights.
    """

    def __init__(self, priority=-2000):
        self.priority = priority

    def batch_end(self, estimator, *args, **kwargs):
        loss = kwargs["loss"]
        losses = loss if isinstance(loss, list) else [loss]
        estimator.trainer.step(sum(shard.shape[0] for shard in losses))
