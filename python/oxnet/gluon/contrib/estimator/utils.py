"""Argument checks shared by the estimator and its event handlers."""

from ....metric import Accuracy, CompositeEvalMetric, EvalMetric
from ...loss import SoftmaxCrossEntropyLoss


def _check_metrics(metrics):
    """Normalise ``metrics`` (None, one metric, a composite or a list) to a flat list of
    ``EvalMetric``; composites are unpacked so that handlers see each metric by itself."""
    if isinstance(metrics, CompositeEvalMetric):
        return [leaf for child in metrics.metrics for leaf in _check_metrics(child)]
    if isinstance(metrics, EvalMetric):
        return [metrics]
    metrics = list(metrics or [])
    if not all(isinstance(metric, EvalMetric) for metric in metrics):
        raise ValueError("metrics must be a Metric or a list of Metric, refer to mxnet.metric.EvalMetric: {}"
                         .format(metrics))
    return metrics


def _metrics_referenced_by(handler):
    """The ``EvalMetric`` objects a handler holds in attributes named like ``*metric*`` or
    ``*monitor*`` (e.g. ``metrics``, ``monitor``)."""
    referenced = []
    for attribute in dir(handler):
        if "metric" not in attribute and "monitor" not in attribute:
            continue
        value = getattr(handler, attribute, None)
        values = value if isinstance(value, (list, tuple)) else [value]
        referenced.extend(v for v in values if isinstance(v, EvalMetric))
    return referenced


def _check_handler_metric_ref(handler, known_metrics):
    """Handlers mixed with the estimator's default handlers must watch the estimator's own
    metric objects: another object would never be updated by the default ``MetricHandler``."""
    for metric in _metrics_referenced_by(handler):
        if metric not in known_metrics:
            raise ValueError("Event handler {} refers to a metric instance {} outside of the known training and "
                             "validation metrics. Please use the metrics from estimator.train_metrics and "
                             "estimator.val_metrics instead.".format(type(handler).__name__, metric))


def _suggest_metric_for_loss(loss):
    """A metric that fits ``loss`` when the user gave none (accuracy for classification)."""
    if isinstance(loss, SoftmaxCrossEntropyLoss):
        return Accuracy()
    return None

