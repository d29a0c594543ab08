"""Evaluation metrics (MXNet's ``mxnet.metric``), computed on the host with NumPy."""

import numpy as np

from .base import numeric_types, string_types

_REGISTRY = {}


def register(klass, *aliases):
    for name in (klass.__name__.lower(),) + aliases:
        _REGISTRY[name] = klass
    return klass


def _numpy(x):
    return x.asnumpy() if hasattr(x, "asnumpy") else np.asarray(x)


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def check_label_shapes(labels, preds, wrap=False, shape=False):
    if not shape:
        label_shape, pred_shape = len(labels), len(preds)
    else:
        label_shape, pred_shape = labels.shape, preds.shape
    if label_shape != pred_shape:
        raise ValueError("Shape of labels {} does not match shape of predictions {}".format(label_shape, pred_shape))
    if wrap:
        return _as_list(labels), _as_list(preds)
    return labels, preds


class EvalMetric:
    """Accumulates ``sum_metric`` over ``num_inst`` instances; ``get`` reports the mean."""

    def __init__(self, name, output_names=None, label_names=None, **kwargs):
        self.name = str(name)
        self.output_names = output_names
        self.label_names = label_names
        self._kwargs = kwargs
        self.reset()

    def __str__(self):
        return "EvalMetric: {}".format(dict(self.get_name_value()))

    def update(self, labels, preds):
        raise NotImplementedError()

    def update_dict(self, label, pred):
        preds = [pred[n] for n in self.output_names] if self.output_names is not None else list(pred.values())
        labels = [label[n] for n in self.label_names] if self.label_names is not None else list(label.values())
        self.update(labels, preds)

    def reset(self):
        self.num_inst = 0
        self.sum_metric = 0.0
        self.global_num_inst = 0
        self.global_sum_metric = 0.0

    def reset_local(self):
        self.num_inst = 0
        self.sum_metric = 0.0

    def _add(self, value, count):
        self.sum_metric += value
        self.global_sum_metric += value
        self.num_inst += count
        self.global_num_inst += count

    def get(self):
        if self.num_inst == 0:
            return (self.name, float("nan"))
        return (self.name, self.sum_metric / self.num_inst)

    def get_global(self):
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

    def get_config(self):
        config = dict(self._kwargs)
        config.update({"metric": self.__class__.__name__, "name": self.name, "output_names": self.output_names,
                       "label_names": self.label_names})
        return config


class CompositeEvalMetric(EvalMetric):
    """Several metrics updated together."""

    def __init__(self, metrics=None, name="composite", output_names=None, label_names=None):
        self.metrics = [create(m) for m in (metrics or [])]
        super().__init__(name, output_names=output_names, label_names=label_names)

    def add(self, metric):
        self.metrics.append(create(metric))

    def get_metric(self, index):
        return self.metrics[index]

    def update(self, labels, preds):
        for metric in self.metrics:
            metric.update(labels, preds)

    def reset(self):
        for metric in getattr(self, "metrics", []):
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


class Accuracy(EvalMetric):
    """Fraction of predictions (argmax over ``axis``, or given labels) equal to the labels."""

    def __init__(self, axis=1, name="accuracy", output_names=None, label_names=None):
        super().__init__(name, axis=axis, output_names=output_names, label_names=label_names)
        self.axis = axis

    def update(self, labels, preds):
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            pred, label = _numpy(pred), _numpy(label)
            if pred.shape != label.shape:
                pred = np.argmax(pred, axis=self.axis)
            pred = pred.astype("int64").ravel()
            label = label.astype("int64").ravel()
            check_label_shapes(label, pred)
            self._add(float((pred == label).sum()), len(pred))


class TopKAccuracy(EvalMetric):
    """Fraction of labels among the top ``top_k`` predictions."""

    def __init__(self, top_k=1, name="top_k_accuracy", output_names=None, label_names=None):
        super().__init__(name, top_k=top_k, output_names=output_names, label_names=label_names)
        if top_k <= 1:
            raise ValueError("Please use Accuracy if top_k is no more than 1")
        self.top_k = top_k
        self.name += "_%d" % top_k

    def update(self, labels, preds):
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            pred, label = _numpy(pred).astype("float32"), _numpy(label).astype("int64").ravel()
            top = np.argsort(pred, axis=1)[:, -self.top_k:]
            self._add(float((top == label[:, None]).any(axis=1).sum()), len(label))


class F1(EvalMetric):
    """F1 score of binary classification; ``average='macro'`` averages per-batch scores."""

    def __init__(self, name="f1", output_names=None, label_names=None, average="macro"):
        self.average = average
        super().__init__(name, output_names=output_names, label_names=label_names)

    def reset(self):
        super().reset()
        self._tp = self._fp = self._fn = 0

    def update(self, labels, preds):
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            pred, label = _numpy(pred), _numpy(label).astype("int64").ravel()
            if pred.ndim > 1:
                pred = np.argmax(pred, axis=1)
            pred = pred.astype("int64").ravel()
            if len(np.unique(label)) > 2:
                raise ValueError("F1 currently only supports binary classification.")
            tp = float(((pred == 1) & (label == 1)).sum())
            fp = float(((pred == 1) & (label == 0)).sum())
            fn = float(((pred == 0) & (label == 1)).sum())
            if self.average == "macro":
                self._add(self._f1(tp, fp, fn), 1)
            else:
                self._tp += tp
                self._fp += fp
                self._fn += fn
                self.sum_metric = self._f1(self._tp, self._fp, self._fn)
                self.global_sum_metric = self.sum_metric
                self.num_inst = self.global_num_inst = 1

    @staticmethod
    def _f1(tp, fp, fn):
        precision = tp / (tp + fp) if tp + fp > 0 else 0.0
        recall = tp / (tp + fn) if tp + fn > 0 else 0.0
        return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


class _Regression(EvalMetric):
    def update(self, labels, preds):
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            label, pred = _numpy(label), _numpy(pred)
            if label.ndim == 1:
                label = label.reshape(label.shape[0], 1)
            if pred.ndim == 1:
                pred = pred.reshape(pred.shape[0], 1)
            self._add(self._score(label, pred), 1)


class MAE(_Regression):
    def __init__(self, name="mae", output_names=None, label_names=None):
        super().__init__(name, output_names=output_names, label_names=label_names)

    @staticmethod
    def _score(label, pred):
        return float(np.abs(label - pred).mean())


class MSE(_Regression):
    def __init__(self, name="mse", output_names=None, label_names=None):
        super().__init__(name, output_names=output_names, label_names=label_names)

    @staticmethod
    def _score(label, pred):
        return float(((label - pred) ** 2.0).mean())


class RMSE(_Regression):
    def __init__(self, name="rmse", output_names=None, label_names=None):
        super().__init__(name, output_names=output_names, label_names=label_names)

    @staticmethod
    def _score(label, pred):
        return float(np.sqrt(((label - pred) ** 2.0).mean()))


class CrossEntropy(EvalMetric):
    """Mean negative log-probability of the labelled class."""

    def __init__(self, eps=1e-12, name="cross-entropy", output_names=None, label_names=None):
        super().__init__(name, eps=eps, output_names=output_names, label_names=label_names)
        self.eps = eps

    def _log_probs(self, labels, preds):
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            label, pred = _numpy(label).ravel().astype("int64"), _numpy(pred)
            assert label.shape[0] == pred.shape[0]
            yield np.log(pred[np.arange(label.shape[0]), label] + self.eps), label

    def update(self, labels, preds):
        for log_prob, label in self._log_probs(labels, preds):
            self._add(float(-log_prob.sum()), label.shape[0])


class Perplexity(CrossEntropy):
    """exp of the mean cross-entropy; labels equal to ``ignore_label`` are skipped."""

    def __init__(self, ignore_label, axis=-1, name="perplexity", output_names=None, label_names=None):
        super().__init__(name=name, output_names=output_names, label_names=label_names)
        self.ignore_label = ignore_label
        self.axis = axis

    def update(self, labels, preds):
        for log_prob, label in self._log_probs(labels, preds):
            if self.ignore_label is not None:
                keep = label != self.ignore_label
                log_prob, label = log_prob[keep], label[keep]
            self._add(float(-log_prob.sum()), label.shape[0])

    def get(self):
        if self.num_inst == 0:
            return (self.name, float("nan"))
        return (self.name, float(np.exp(self.sum_metric / self.num_inst)))


class Loss(EvalMetric):
    """Mean of the outputs, for symbols whose outputs are losses (``make_loss``); labels are
    ignored."""

    def __init__(self, name="loss", output_names=None, label_names=None):
        super().__init__(name, output_names=output_names, label_names=label_names)

    def update(self, _, preds):
        for pred in _as_list(preds):
            values = _numpy(pred)
            self._add(float(values.sum()), values.size)


for _klass, _aliases in ((Accuracy, ("acc",)), (TopKAccuracy, ("top_k_accuracy", "top_k_acc")), (F1, ()),
                         (MAE, ()), (MSE, ()), (RMSE, ()), (CrossEntropy, ("ce", "cross-entropy")),
                         (Perplexity, ()), (Loss, ()), (CompositeEvalMetric, ("composite",))):
    register(_klass, *_aliases)


def create(metric, *args, **kwargs):
    """A metric from an instance, a name, a list (composite) or a function ``f(label, pred)``."""
    if isinstance(metric, EvalMetric):
        return metric
    if callable(metric):
        return CustomMetric(metric, *args, **kwargs)
    if isinstance(metric, list):
        return CompositeEvalMetric([create(m, *args, **kwargs) for m in metric])
    if isinstance(metric, string_types):
        if metric.lower() not in _REGISTRY:
            raise ValueError("Metric must be either callable or in %s" % sorted(_REGISTRY))
        return _REGISTRY[metric.lower()](*args, **kwargs)
    raise TypeError("metric should be an EvalMetric, a name, a list or a function")


class CustomMetric(EvalMetric):
    """A metric from a function ``feval(label, pred)`` returning a value or (sum, count)."""

    def __init__(self, feval, name=None, allow_extra_outputs=False, output_names=None, label_names=None):
        super().__init__(name or getattr(feval, "__name__", "custom"), output_names=output_names,
                         label_names=label_names)
        self._feval = feval
        self._allow_extra_outputs = allow_extra_outputs

    def update(self, labels, preds):
        if not self._allow_extra_outputs:
            labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            result = self._feval(_numpy(label), _numpy(pred))
            if isinstance(result, tuple):
                self._add(*result)
            else:
                assert isinstance(result, numeric_types)
                self._add(float(result), 1)


def np_metric(numpy_feval, name=None, allow_extra_outputs=False):
    """A metric from a NumPy function of (label, pred)."""
    return CustomMetric(numpy_feval, name, allow_extra_outputs)
