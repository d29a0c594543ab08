"""Evaluation metrics (MXNet's ``mxnet.metric``), computed on the host with NumPy.

Every built-in metric keeps two sets of statistics: local ones, cleared by ``reset_local`` (for
example by ``Speedometer(auto_reset=True)`` after each log line), and global ones, cleared only
by ``reset``. ``get`` reports the local value and ``get_global`` the value over everything seen
since the last ``reset``.
"""

import json
import math
from collections import OrderedDict

import numpy

from .base import string_types

# Lower-case class names and aliases -> metric class, filled by ``register`` and ``alias``.
_METRICS = {}


def register(klass):
    """Class decorator: make ``klass`` creatable by ``create`` under its lower-case name."""
    _METRICS[klass.__name__.lower()] = klass
    return klass


def alias(*aliases):
    """Class decorator: make the class creatable by ``create`` under each of ``aliases`` too."""
    def decorate(klass):
        for name in aliases:
            _METRICS[name.lower()] = klass
        return klass
    return decorate


def _to_numpy(array):
    return array.asnumpy() if hasattr(array, "asnumpy") else numpy.asarray(array)


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_label_shapes(labels, preds, wrap=False, shape=False):
    """Raise ValueError unless labels and preds have the same length (or, with ``shape``, the
    same shape); with ``wrap`` a single array becomes a one-element list."""
    if shape:
        label_shape, pred_shape = labels.shape, preds.shape
    else:
        label_shape, pred_shape = len(labels), len(preds)
    if label_shape != pred_shape:
        raise ValueError("Shape of labels {} does not match shape of predictions {}".format(label_shape, pred_shape))
    if wrap:
        return _as_list(labels), _as_list(preds)
    return labels, preds


class EvalMetric:
    """Base class: accumulates ``sum_metric`` over ``num_inst`` instances; ``get`` reports the
    mean. Pass ``has_global_stats=True`` when the subclass also maintains ``global_sum_metric``
    and ``global_num_inst``; otherwise ``get_global`` reports the local value."""

    def __init__(self, name, output_names=None, label_names=None, **kwargs):
        self.name = str(name)
        self.output_names = output_names
        self.label_names = label_names
        self._has_global_stats = kwargs.pop("has_global_stats", False)
        self._kwargs = kwargs
        self.reset()

    def __str__(self):
        return "EvalMetric: {}".format(dict(self.get_name_value()))

    def get_config(self):
        """The constructor arguments, as a dict that ``create(config)`` (or ``create`` of its JSON
        text) turns back into an equal metric."""
        config = dict(self._kwargs)
        config.update({"metric": self.__class__.__name__, "name": self.name, "output_names": self.output_names,
                       "label_names": self.label_names})
        return config

    def update_dict(self, label, pred):
        """Update from name -> array mappings, taking ``label_names`` / ``output_names`` (all
        entries when those are None)."""
        preds = [pred[n] for n in self.output_names] if self.output_names is not None else list(pred.values())
        labels = [label[n] for n in self.label_names] if self.label_names is not None else list(label.values())
        self.update(labels, preds)

    def update(self, labels, preds):
        raise NotImplementedError()

    def reset(self):
        self.num_inst = 0
        self.sum_metric = 0.0
        self.global_num_inst = 0
        self.global_sum_metric = 0.0

    def reset_local(self):
        self.num_inst = 0
        self.sum_metric = 0.0

    def _accumulate(self, value, count):
        """Add ``value`` over ``count`` instances to the local and the global statistics. Values
        are kept as Python floats (not NumPy scalars) so that reported results compare with
        NumPy float32 results at float32 precision instead of promoting them."""
        value = float(value)
        self.sum_metric += value
        self.global_sum_metric += value
        self.num_inst += count
        self.global_num_inst += count

    def get(self):
        if self.num_inst == 0:
            return (self.name, float("nan"))
        return (self.name, self.sum_metric / self.num_inst)

    def get_global(self):
        if not self._has_global_stats:
            return self.get()
        if self.global_num_inst == 0:
            return (self.name, float("nan"))
        return (self.name, self.global_sum_metric / self.global_num_inst)

    def get_name_value(self):
        name, value = self.get()
        return list(zip(_as_list(name), _as_list(value)))

    def get_global_name_value(self):
        """(name, value) pairs over everything seen since the last ``reset`` (``reset_local``
        does not clear them)."""
        name, value = self.get_global()
        return list(zip(_as_list(name), _as_list(value)))


def create(metric, *args, **kwargs):
    """A metric from a name (with constructor arguments), an instance, a config dict or its JSON
    text (``get_config``), a list (a ``CompositeEvalMetric``) or a function ``f(label, pred)``."""
    if callable(metric):
        return CustomMetric(metric, *args, **kwargs)
    if isinstance(metric, list):
        composite = CompositeEvalMetric()
        for child in metric:
            composite.add(create(child, *args, **kwargs))
        return composite
    if isinstance(metric, EvalMetric):
        if args or kwargs:
            raise ValueError("metric %s is already an instance; extra arguments are invalid" % metric.name)
        return metric
    if isinstance(metric, dict):
        return create(**metric)
    if not isinstance(metric, string_types):
        raise TypeError("metric must be a name, an EvalMetric, a config dict, a list or a function; got %r"
                        % type(metric).__name__)
    if metric.startswith("{"):
        return create(**json.loads(metric))
    if metric.startswith("["):
        name, config = json.loads(metric)
        return create(name, **config)
    if metric.lower() not in _METRICS:
        raise ValueError("unknown metric %r; expected a function or one of %s" % (metric, sorted(_METRICS)))
    return _METRICS[metric.lower()](*args, **kwargs)


@register
@alias("composite")
class CompositeEvalMetric(EvalMetric):
    """Several metrics updated together; ``get`` returns (list of names, list of values)."""

    def __init__(self, metrics=None, name="composite", output_names=None, label_names=None):
        self.metrics = [create(m) for m in (metrics or [])]
        super().__init__(name, output_names=output_names, label_names=label_names, has_global_stats=True)

    def add(self, metric):
        self.metrics.append(create(metric))

    def get_metric(self, index):
        if not -len(self.metrics) <= index < len(self.metrics):
            raise ValueError("Metric index {} is out of range 0 and {}".format(index, len(self.metrics)))
        return self.metrics[index]

    def update_dict(self, labels, preds):
        if self.label_names is not None:
            labels = OrderedDict((k, v) for k, v in labels.items() if k in self.label_names)
        if self.output_names is not None:
            preds = OrderedDict((k, v) for k, v in preds.items() if k in self.output_names)
        for metric in self.metrics:
            metric.update_dict(labels, preds)

    def update(self, labels, preds):
        for metric in self.metrics:
            metric.update(labels, preds)

    def reset(self):
        for metric in self.metrics:
            metric.reset()

    def reset_local(self):
        for metric in self.metrics:
            metric.reset_local()

    def _joined(self, getter):
        names, values = [], []
        for metric in self.metrics:
            name, value = getter(metric)
            names.extend(_as_list(name))
            values.extend(_as_list(value))
        return names, values

    def get(self):
        return self._joined(lambda metric: metric.get())

    def get_global(self):
        return self._joined(lambda metric: metric.get_global())

    def get_config(self):
        config = super().get_config()
        config["metrics"] = [metric.get_config() for metric in self.metrics]
        return config


########################
# Classification metrics
########################

@register
@alias("acc")
class Accuracy(EvalMetric):
    """Fraction of predictions equal to the labels; predictions whose shape differs from the
    label's are class scores, reduced by argmax over ``axis``."""

    def __init__(self, axis=1, name="accuracy", output_names=None, label_names=None):
        super().__init__(name, axis=axis, output_names=output_names, label_names=label_names,
                         has_global_stats=True)
        self.axis = axis

    def update(self, labels, preds):
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            pred, label = _to_numpy(pred), _to_numpy(label)
            if pred.shape != label.shape:
                pred = numpy.argmax(pred, axis=self.axis)
            pred = pred.astype("int32").ravel()
            label = label.astype("int32").ravel()
            check_label_shapes(label, pred)
            self._accumulate((pred == label).sum(), len(pred))


@register
@alias("top_k_accuracy", "top_k_acc")
class TopKAccuracy(EvalMetric):
    """Fraction of labels among the ``top_k`` highest-scored classes of (batch, classes)
    predictions; 1-D predictions are class indices."""

    def __init__(self, top_k=1, name="top_k_accuracy", output_names=None, label_names=None):
        super().__init__(name, top_k=top_k, output_names=output_names, label_names=label_names,
                         has_global_stats=True)
        if top_k <= 1:
            raise ValueError("Please use Accuracy if top_k is no more than 1")
        self.top_k = top_k
        self._constructor_name = name
        self.name += "_%d" % top_k

    def get_config(self):
        # The name as given, so that re-creating the metric does not append "_<top_k>" twice.
        config = super().get_config()
        config["name"] = self._constructor_name
        return config

    def update(self, labels, preds):
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            pred, label = _to_numpy(pred).astype("float32"), _to_numpy(label).astype("int32").ravel()
            if pred.ndim > 2:
                raise ValueError("TopKAccuracy: predictions should have at most 2 dimensions, got shape %s"
                                 % (pred.shape,))
            check_label_shapes(label, pred)
            if pred.ndim == 1:
                hits = (pred.astype("int32") == label).sum()
            else:
                top_k = min(pred.shape[1], self.top_k)
                best = numpy.argpartition(pred, -top_k, axis=1)[:, -top_k:]
                hits = (best == label[:, None]).any(axis=1).sum()
            self._accumulate(hits, pred.shape[0])


class _BinaryCounts:
    """True/false positive/negative counts of a binary classifier."""

    def __init__(self):
        self.true_pos = self.false_pos = self.false_neg = self.true_neg = 0

    def add(self, other):
        self.true_pos += other.true_pos
        self.false_pos += other.false_pos
        self.false_neg += other.false_neg
        self.true_neg += other.true_neg

    @classmethod
    def of_batch(cls, label, pred, metric_name):
        label = _to_numpy(label).astype("int32").ravel()
        pred = _to_numpy(pred)
        check_label_shapes(label, pred)
        pred_label = numpy.argmax(pred, axis=1) if pred.ndim > 1 else pred.astype("int32")
        if len(numpy.unique(label)) > 2:
            raise ValueError("%s currently only supports binary classification." % metric_name)
        counts = cls()
        pred_true, label_true = pred_label == 1, label == 1
        counts.true_pos = int((pred_true & label_true).sum())
        counts.false_pos = int((pred_true & ~label_true).sum())
        counts.false_neg = int((~pred_true & label_true).sum())
        counts.true_neg = int((~pred_true & ~label_true).sum())
        return counts

    @property
    def total(self):
        return self.true_pos + self.false_pos + self.false_neg + self.true_neg

    def fscore(self):
        precision = self.true_pos / (self.true_pos + self.false_pos) if self.true_pos + self.false_pos else 0.0
        recall = self.true_pos / (self.true_pos + self.false_neg) if self.true_pos + self.false_neg else 0.0
        return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0

    def matthews_cc(self):
        """MCC; marginal sums that are zero are left out of the denominator (as in MXNet), so a
        classifier that predicts one class scores 0 instead of dividing by zero."""
        if not self.total:
            return 0.0
        tp, fp, fn, tn = (float(c) for c in (self.true_pos, self.false_pos, self.false_neg, self.true_neg))
        denominator = 1.0
        for marginal in (tp + fp, tp + fn, tn + fp, tn + fn):
            if marginal != 0.0:
                denominator *= marginal
        return (tp * tn - fp * fn) / math.sqrt(denominator)


class _BinaryClassificationMetric(EvalMetric):
    """F1 and MCC: ``average='macro'`` averages the per-``update`` scores, ``'micro'`` scores the
    counts pooled over all updates (weighted by the number of examples)."""

    def __init__(self, name, output_names, label_names, average):
        if average not in ("macro", "micro"):
            raise ValueError("average must be 'macro' or 'micro', got %r" % (average,))
        self.average = average
        self._local_counts = _BinaryCounts()
        self._global_counts = _BinaryCounts()
        super().__init__(name, average=average, output_names=output_names, label_names=label_names,
                         has_global_stats=True)

    def _score(self, counts):
        raise NotImplementedError()

    def update(self, labels, preds):
        labels, preds = check_label_shapes(labels, preds, True)
        batch = _BinaryCounts()
        for label, pred in zip(labels, preds):
            batch.add(_BinaryCounts.of_batch(label, pred, self.__class__.__name__))
        if self.average == "macro":
            self._accumulate(self._score(batch), 1)
            return
        self._local_counts.add(batch)
        self._global_counts.add(batch)
        self.num_inst = self._local_counts.total
        self.sum_metric = self._score(self._local_counts) * self.num_inst
        self.global_num_inst = self._global_counts.total
        self.global_sum_metric = self._score(self._global_counts) * self.global_num_inst

    def reset(self):
        super().reset()
        self._local_counts = _BinaryCounts()
        self._global_counts = _BinaryCounts()

    def reset_local(self):
        super().reset_local()
        self._local_counts = _BinaryCounts()


@register
class F1(_BinaryClassificationMetric):
    """F1 score (harmonic mean of precision and recall) of binary classification; predictions
    are (batch, 2) class scores or 1-D class indices."""

    def __init__(self, name="f1", output_names=None, label_names=None, average="macro"):
        super().__init__(name, output_names, label_names, average)

    def _score(self, counts):
        return counts.fscore()


@register
class MCC(_BinaryClassificationMetric):
    """Matthews correlation coefficient of binary classification (see ``PCC`` for more classes)."""

    def __init__(self, name="mcc", output_names=None, label_names=None, average="macro"):
        super().__init__(name, output_names, label_names, average)

    def _score(self, counts):
        return counts.matthews_cc()


@register
class Perplexity(EvalMetric):
    """exp of the mean negative log-probability of the labelled class, read from ``pred``
    along ``axis``; labels equal to ``ignore_label`` are left out."""

    def __init__(self, ignore_label, axis=-1, name="perplexity", output_names=None, label_names=None):
        super().__init__(name, ignore_label=ignore_label, axis=axis, output_names=output_names,
                         label_names=label_names, has_global_stats=True)
        self.ignore_label = ignore_label
        self.axis = axis

    def update(self, labels, preds):
        labels, preds = check_label_shapes(labels, preds, True)
        loss, count = 0.0, 0
        for label, pred in zip(labels, preds):
            label, pred = _to_numpy(label), _to_numpy(pred)
            axis = self.axis % pred.ndim
            if label.size * pred.shape[axis] != pred.size:
                raise ValueError("Perplexity: shape mismatch: label %s vs. prediction %s (classes on axis %d)"
                                 % (label.shape, pred.shape, self.axis))
            index_shape = pred.shape[:axis] + (1,) + pred.shape[axis + 1:]
            # Out-of-range labels are clipped to a valid class, as MXNet's `pick` does.
            index = numpy.clip(label.astype("int64"), 0, pred.shape[axis] - 1).reshape(index_shape)
            prob = numpy.take_along_axis(pred, index, axis=axis).ravel()
            if self.ignore_label is not None:
                ignored = label.ravel() == self.ignore_label
                count -= int(ignored.sum())
                prob = numpy.where(ignored, numpy.ones_like(prob), prob)
            loss -= numpy.log(numpy.maximum(prob.dtype.type(1e-10), prob)).sum()
            count += prob.size
        self._accumulate(loss, count)

    def get(self):
        if self.num_inst == 0:
            return (self.name, float("nan"))
        return (self.name, math.exp(self.sum_metric / self.num_inst))

    def get_global(self):
        if self.global_num_inst == 0:
            return (self.name, float("nan"))
        return (self.name, math.exp(self.global_sum_metric / self.global_num_inst))


########################
# Regression metrics
########################

class _PerBatchRegression(EvalMetric):
    """Mean over updates of a per-(label, pred) score; 1-D arrays count as (n, 1) columns."""

    def __init__(self, name, output_names, label_names):
        super().__init__(name, output_names=output_names, label_names=label_names, has_global_stats=True)

    @staticmethod
    def _score(label, pred):
        raise NotImplementedError()

    def update(self, labels, preds):
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            label, pred = _to_numpy(label), _to_numpy(pred)
            if label.ndim == 1:
                label = label.reshape(label.shape[0], 1)
            if pred.ndim == 1:
                pred = pred.reshape(pred.shape[0], 1)
            self._accumulate(self._score(label, pred), 1)


@register
class MAE(_PerBatchRegression):
    """Mean absolute error."""

    def __init__(self, name="mae", output_names=None, label_names=None):
        super().__init__(name, output_names, label_names)

    @staticmethod
    def _score(label, pred):
        return numpy.abs(label - pred).mean()


@register
class MSE(_PerBatchRegression):
    """Mean squared error."""

    def __init__(self, name="mse", output_names=None, label_names=None):
        super().__init__(name, output_names, label_names)

    @staticmethod
    def _score(label, pred):
        return ((label - pred) ** 2.0).mean()


@register
class RMSE(_PerBatchRegression):
    """Root mean squared error (per update, then averaged over updates)."""

    def __init__(self, name="rmse", output_names=None, label_names=None):
        super().__init__(name, output_names, label_names)

    @staticmethod
    def _score(label, pred):
        return numpy.sqrt(((label - pred) ** 2.0).mean())


@register
@alias("ce", "cross-entropy")
class CrossEntropy(EvalMetric):
    """Mean of -log(pred[i, label[i]] + eps) over examples; ``pred`` holds probabilities."""

    def __init__(self, eps=1e-12, name="cross-entropy", output_names=None, label_names=None):
        super().__init__(name, eps=eps, output_names=output_names, label_names=label_names,
                         has_global_stats=True)
        self.eps = eps

    def update(self, labels, preds):
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            label, pred = _to_numpy(label).ravel(), _to_numpy(pred)
            num_examples = pred.shape[0]
            if label.shape[0] != num_examples:
                raise ValueError("%s: %d labels for %d predictions" % (self.__class__.__name__, label.shape[0],
                                                                      num_examples))
            prob = pred[numpy.arange(num_examples), label.astype("int64")]
            self._accumulate((-numpy.log(prob + self.eps)).sum(), num_examples)


@register
@alias("nll_loss")
class NegativeLogLikelihood(CrossEntropy):
    """Negative log-likelihood of the labelled class (the same value as ``CrossEntropy``)."""

    def __init__(self, eps=1e-12, name="nll-loss", output_names=None, label_names=None):
        super().__init__(eps=eps, name=name, output_names=output_names, label_names=label_names)


class _CorrelationMoments:
    """Count, means and centred second moments of a stream of (pred, label) values. Batches are
    merged with Chan et al.'s pairwise update, so the correlation equals the two-pass formula
    over all values seen."""

    def __init__(self):
        self.count = 0
        self.mean_pred = self.mean_label = 0.0
        self.m2_pred = self.m2_label = self.co_moment = 0.0

    def add(self, pred, label):
        batch_count = pred.size
        if batch_count == 0:
            return
        batch_mean_pred, batch_mean_label = pred.mean(), label.mean()
        centred_pred, centred_label = pred - batch_mean_pred, label - batch_mean_label
        total = self.count + batch_count
        delta_pred, delta_label = batch_mean_pred - self.mean_pred, batch_mean_label - self.mean_label
        cross_weight = self.count * batch_count / total
        self.m2_pred += centred_pred @ centred_pred + delta_pred * delta_pred * cross_weight
        self.m2_label += centred_label @ centred_label + delta_label * delta_label * cross_weight
        self.co_moment += centred_pred @ centred_label + delta_pred * delta_label * cross_weight
        self.mean_pred += delta_pred * batch_count / total
        self.mean_label += delta_label * batch_count / total
        self.count = total

    def correlation(self):
        denominator = math.sqrt(self.m2_pred * self.m2_label)
        return float(self.co_moment / denominator) if denominator > 0 else float("nan")


@register
@alias("pearsonr")
class PearsonCorrelation(EvalMetric):
    """Pearson correlation of predictions and labels. ``average='macro'`` averages the
    correlation of each (label, pred) pair; ``'micro'`` correlates all values seen, updated
    in a streaming fashion."""

    def __init__(self, name="pearsonr", output_names=None, label_names=None, average="macro"):
        if average not in ("macro", "micro"):
            raise ValueError("average must be 'macro' or 'micro', got %r" % (average,))
        self.average = average
        super().__init__(name, average=average, output_names=output_names, label_names=label_names,
                         has_global_stats=True)

    def reset(self):
        super().reset()
        self._local_moments = _CorrelationMoments()
        self._global_moments = _CorrelationMoments()

    def reset_local(self):
        super().reset_local()
        self._local_moments = _CorrelationMoments()

    def update(self, labels, preds):
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            check_label_shapes(label, pred, False, True)
            label = _to_numpy(label).ravel().astype(numpy.float64)
            pred = _to_numpy(pred).ravel().astype(numpy.float64)
            if self.average == "macro":
                self._accumulate(numpy.corrcoef(pred, label)[0, 1], 1)
            else:
                self._local_moments.add(pred, label)
                self._global_moments.add(pred, label)
                self._accumulate(0.0, 1)

    def get(self):
        if self.average == "macro" or self.num_inst == 0:
            return super().get()
        return (self.name, self._local_moments.correlation())

    def get_global(self):
        if self.average == "macro" or self.global_num_inst == 0:
            return super().get_global()
        return (self.name, self._global_moments.correlation())


@register
class PCC(EvalMetric):
    """Multi-class Matthews correlation (Pearson correlation of the one-hot confusion matrix);
    equals MCC for two classes. Predictions are class scores or class indices; the confusion
    matrix grows with the largest class seen. The value does not depend on how the examples
    are split into updates."""

    def __init__(self, name="pcc", output_names=None, label_names=None, has_global_stats=True):
        self._num_classes = 2
        super().__init__(name, output_names=output_names, label_names=label_names,
                         has_global_stats=has_global_stats)

    def reset(self):
        self.global_num_inst = 0
        self._global_confusion = numpy.zeros((self._num_classes, self._num_classes))
        self.reset_local()

    def reset_local(self):
        self.num_inst = 0
        self._local_confusion = numpy.zeros((self._num_classes, self._num_classes))

    def _grow(self, num_classes):
        extra = num_classes - self._num_classes
        self._local_confusion = numpy.pad(self._local_confusion, ((0, extra), (0, extra)))
        self._global_confusion = numpy.pad(self._global_confusion, ((0, extra), (0, extra)))
        self._num_classes = num_classes

    @staticmethod
    def _matthews_cc(confusion):
        total = confusion.sum()
        pred_counts = confusion.sum(axis=1)
        label_counts = confusion.sum(axis=0)
        cov_pred = numpy.sum(pred_counts * (total - pred_counts))
        cov_label = numpy.sum(label_counts * (total - label_counts))
        if cov_pred == 0 or cov_label == 0:
            return float("nan")
        cov_pred_label = numpy.sum(confusion.diagonal() * total - pred_counts * label_counts)
        return float(cov_pred_label / (cov_pred * cov_label) ** 0.5)

    @property
    def sum_metric(self):
        return self._matthews_cc(self._local_confusion) * self.num_inst

    @property
    def global_sum_metric(self):
        return self._matthews_cc(self._global_confusion) * self.global_num_inst

    def update(self, labels, preds):
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            label, pred = _to_numpy(label).astype("int32"), _to_numpy(pred)
            pred = pred.argmax(axis=1) if pred.shape != label.shape else pred.astype("int32")
            label, pred = label.ravel(), pred.ravel()
            check_label_shapes(label, pred)
            if label.size == 0:
                continue
            largest_class = int(max(pred.max(), label.max()))
            if largest_class >= self._num_classes:
                self._grow(largest_class + 1)
            batch_confusion = numpy.zeros((self._num_classes, self._num_classes))
            numpy.add.at(batch_confusion, (pred, label), 1)
            self._local_confusion += batch_confusion
            self._global_confusion += batch_confusion
        self.num_inst += 1
        self.global_num_inst += 1

    def get(self):
        if self.num_inst == 0:
            return (self.name, float("nan"))
        return (self.name, self._matthews_cc(self._local_confusion))

    def get_global(self):
        if not self._has_global_stats:
            return self.get()
        if self.global_num_inst == 0:
            return (self.name, float("nan"))
        return (self.name, self._matthews_cc(self._global_confusion))


@register
class Loss(EvalMetric):
    """Mean of the outputs, for networks whose outputs are losses (``make_loss``); labels are
    ignored."""

    def __init__(self, name="loss", output_names=None, label_names=None):
        super().__init__(name, output_names=output_names, label_names=label_names, has_global_stats=True)

    def update(self, _, preds):
        for pred in _as_list(preds):
            values = _to_numpy(pred)
            self._accumulate(values.sum(), values.size)


@register
class Torch(Loss):
    """``Loss`` under the name MXNet's Torch plugin used."""

    def __init__(self, name="torch", output_names=None, label_names=None):
        super().__init__(name, output_names=output_names, label_names=label_names)


@register
class Caffe(Loss):
    """``Loss`` under the name MXNet's Caffe plugin used."""

    def __init__(self, name="caffe", output_names=None, label_names=None):
        super().__init__(name, output_names=output_names, label_names=label_names)


@register
class CustomMetric(EvalMetric):
    """A metric from ``feval(label, pred)`` on NumPy arrays, returning a value (one instance)
    or a ``(sum, count)`` pair. With ``allow_extra_outputs`` there may be more predictions than
    labels (the extra ones are ignored)."""

    def __init__(self, feval, name=None, allow_extra_outputs=False, output_names=None, label_names=None):
        if name is None:
            name = feval.__name__
            if "<" in name:
                name = "custom(%s)" % name
        super().__init__(name, feval=feval, allow_extra_outputs=allow_extra_outputs, output_names=output_names,
                         label_names=label_names, has_global_stats=True)
        self._feval = feval
        self._allow_extra_outputs = allow_extra_outputs

    def update(self, labels, preds):
        if self._allow_extra_outputs:
            labels, preds = _as_list(labels), _as_list(preds)
        else:
            labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            result = self._feval(_to_numpy(label), _to_numpy(pred))
            if isinstance(result, tuple):
                self._accumulate(*result)
            else:
                self._accumulate(result, 1)

    def get_config(self):
        raise NotImplementedError("CustomMetric cannot be serialized")


def np(numpy_feval, name=None, allow_extra_outputs=False):  # pylint: disable=invalid-name
    """A ``CustomMetric`` from a function of NumPy (label, pred) arrays (MXNet's ``mx.metric.np``)."""
    return CustomMetric(numpy_feval, name, allow_extra_outputs)


__all__ = ["EvalMetric", "CompositeEvalMetric", "Accuracy", "TopKAccuracy", "F1", "MCC", "Perplexity", "MAE",
           "MSE", "RMSE", "CrossEntropy", "NegativeLogLikelihood", "PearsonCorrelation", "PCC", "Loss", "Torch",
           "Caffe", "CustomMetric", "np", "create", "register", "alias", "check_label_shapes"]
