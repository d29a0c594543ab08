"""Losses (MXNet's ``mxnet.gluon.loss``): hybrid blocks returning one value per sample."""

import numpy as np

from .. import ndarray
from ..ndarray.ndarray import _ReshapeSizeError
from ..base import numeric_types
from .block import HybridBlock


def _apply_weighting(F, loss, weight=None, sample_weight=None):
    if sample_weight is not None:
        loss = F.broadcast_mul(loss, sample_weight)
    if weight is not None:
        if not isinstance(weight, numeric_types):
            raise AssertionError("weight must be a number")
        loss = loss * weight
    return loss


class Loss(HybridBlock):
    """Base loss: ``weight`` scales it, ``batch_axis`` is kept, every other axis averaged."""

    def __init__(self, weight, batch_axis, **kwargs):
        super().__init__(**kwargs)
        self._weight = weight
        self._batch_axis = batch_axis

    def __repr__(self):
        return "{name}(batch_axis={_batch_axis}, w={_weight})".format(name=self.__class__.__name__, **self.__dict__)

    def _reshape_like(self, F, x, y, x_name="label", y_name="pred"):
        """``x`` reshaped to ``y``'s shape. Imperatively a size mismatch is reported here, naming
        the loss and both shapes; a hybridized loss reports it from shape inference, naming the
        block's reshape_like node and both shapes."""
        if F is not ndarray:
            return F.reshape_like(x, y)
        if x.shape == y.shape:
            return x
        if x.size != y.size:
            raise _ReshapeSizeError("%s: %s of shape %s does not match %s of shape %s (%d elements, expected %d)"
                                    % (type(self).__name__, x_name, x.shape, y_name, y.shape, x.size, y.size))
        return x.reshape(y.shape)

    def _mean(self, F, loss):
        return F.mean(loss, axis=self._batch_axis, exclude=True)

    def hybrid_forward(self, F, x, *args, **kwargs):
        raise NotImplementedError


class L2Loss(Loss):
    """0.5 * weight * (label - pred)^2."""

    def __init__(self, weight=1.0, batch_axis=0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        label = self._reshape_like(F, label, pred)
        loss = F.square(label - pred)
        return self._mean(F, _apply_weighting(F, loss, self._weight / 2, sample_weight))


class L1Loss(Loss):
    """weight * |label - pred|."""

    def __init__(self, weight=None, batch_axis=0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        label = self._reshape_like(F, label, pred)
        loss = F.abs(label - pred)
        return self._mean(F, _apply_weighting(F, loss, self._weight, sample_weight))


class SigmoidBinaryCrossEntropyLoss(Loss):
    """Binary cross-entropy on logits (numerically stable form) or on probabilities."""

    def __init__(self, from_sigmoid=False, weight=None, batch_axis=0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._from_sigmoid = from_sigmoid

    def hybrid_forward(self, F, pred, label, sample_weight=None, pos_weight=None):
        label = self._reshape_like(F, label, pred)
        if not self._from_sigmoid:
            if pos_weight is None:
                loss = F.relu(pred) - pred * label + F.Activation(-F.abs(pred), act_type="softrelu")
            else:
                log_weight = 1 + F.broadcast_mul(pos_weight - 1, label)
                loss = pred - pred * label + log_weight * (F.Activation(-F.abs(pred), act_type="softrelu")
                                                           + F.relu(-pred))
        else:
            eps = 1e-12
            if pos_weight is None:
                loss = -(F.log(pred + eps) * label + F.log(1.0 - pred + eps) * (1.0 - label))
            else:
                loss = -(F.broadcast_mul(F.log(pred + eps) * label, pos_weight)
                         + F.log(1.0 - pred + eps) * (1.0 - label))
        return self._mean(F, _apply_weighting(F, loss, self._weight, sample_weight))


SigmoidBCELoss = SigmoidBinaryCrossEntropyLoss


class SoftmaxCrossEntropyLoss(Loss):
    """Cross-entropy of softmax(pred) (or log-probabilities with ``from_logits``) against class
    indices (``sparse_label``) or distributions."""

    def __init__(self, axis=-1, sparse_label=True, from_logits=False, weight=None, batch_axis=0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._axis = axis
        self._sparse_label = sparse_label
        self._from_logits = from_logits

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        if not self._from_logits:
            pred = F.log_softmax(pred, axis=self._axis)
        if self._sparse_label:
            loss = -F.pick(pred, label, axis=self._axis, keepdims=True)
        else:
            label = self._reshape_like(F, label, pred)
            loss = -F.sum(pred * label, axis=self._axis, keepdims=True)
        return self._mean(F, _apply_weighting(F, loss, self._weight, sample_weight))


SoftmaxCELoss = SoftmaxCrossEntropyLoss


class KLDivLoss(Loss):
    """label * (log(label) - pred), pred being log-probabilities (``from_logits``)."""

    def __init__(self, from_logits=True, axis=-1, weight=None, batch_axis=0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._from_logits = from_logits
        self._axis = axis

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        if not self._from_logits:
            pred = F.log_softmax(pred, axis=self._axis)
        loss = label * (F.log(label + 1e-12) - pred)
        return self._mean(F, _apply_weighting(F, loss, self._weight, sample_weight))


class HuberLoss(Loss):
    """Quadratic for |error| <= rho, linear beyond."""

    def __init__(self, rho=1, weight=None, batch_axis=0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._rho = rho

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        label = self._reshape_like(F, label, pred)
        loss = F.abs(label - pred)
        loss = F.where(loss > self._rho, loss - 0.5 * self._rho, (0.5 / self._rho) * F.square(loss))
        return self._mean(F, _apply_weighting(F, loss, self._weight, sample_weight))


class HingeLoss(Loss):
    """max(0, margin - pred * label) for labels in {-1, 1}."""

    def __init__(self, margin=1, weight=None, batch_axis=0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._margin = margin

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        label = self._reshape_like(F, label, pred)
        loss = F.relu(self._margin - pred * label)
        return self._mean(F, _apply_weighting(F, loss, self._weight, sample_weight))


class SquaredHingeLoss(HingeLoss):
    """max(0, margin - pred * label)^2."""

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        label = self._reshape_like(F, label, pred)
        loss = F.square(F.relu(self._margin - pred * label))
        return self._mean(F, _apply_weighting(F, loss, self._weight, sample_weight))


class LogisticLoss(Loss):
    """log(1 + exp(-pred * label)) with labels in {-1, 1} (``signed``) or {0, 1} (``binary``)."""

    def __init__(self, weight=None, batch_axis=0, label_format="signed", **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        if label_format not in ("signed", "binary"):
            raise ValueError("label_format can only be signed or binary, received %s." % label_format)
        self._label_format = label_format

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        label = self._reshape_like(F, label, pred)
        if self._label_format == "binary":
            label = 2 * label - 1
        loss = F.relu(-pred * label) + F.Activation(-F.abs(pred * label), act_type="softrelu")
        return self._mean(F, _apply_weighting(F, loss, self._weight, sample_weight))


class TripletLoss(Loss):
    """max(0, ||pred - positive||^2 - ||pred - negative||^2 + margin)."""

    def __init__(self, margin=1, weight=None, batch_axis=0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._margin = margin

    def hybrid_forward(self, F, pred, positive, negative, sample_weight=None):
        positive = self._reshape_like(F, positive, pred, "positive")
        negative = self._reshape_like(F, negative, pred, "negative")
        loss = F.sum(F.square(positive - pred) - F.square(negative - pred), axis=self._batch_axis, exclude=True)
        loss = F.relu(loss + self._margin)
        return _apply_weighting(F, loss, self._weight, sample_weight)


class CosineEmbeddingLoss(Loss):
    """1 - cos(a, b) for label 1, max(0, cos(a, b) - margin) for label -1 (and 0 for any other
    label), one value per sample as a (batch, 1) array, as MXNet 1.x returns it."""

    def __init__(self, weight=None, batch_axis=0, margin=0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._margin = margin

    def hybrid_forward(self, F, input1, input2, label, sample_weight=None):
        input1 = self._reshape_like(F, input1, input2, "input1", "input2")
        label = label.reshape((-1, 1))
        cos_sim = self._cosine_similarity(F, input1, input2)
        similar_part = (1 - cos_sim) * (label == 1)
        zero = F.zeros((1, 1))
        dissimilar_part = F.broadcast_maximum(zero, (label == -1) * (cos_sim - self._margin))
        return _apply_weighting(F, similar_part + dissimilar_part, self._weight, sample_weight)

    @staticmethod
    def _cosine_similarity(F, x, y, axis=-1):
        """cos(x, y) along ``axis`` as a (batch, 1) array; the norms' product is kept >= 1e-12."""
        x_norm = F.norm(x, axis=axis).reshape((-1, 1))
        y_norm = F.norm(y, axis=axis).reshape((-1, 1))
        x_dot_y = F.sum(x * y, axis=axis).reshape((-1, 1))
        return x_dot_y / F.broadcast_maximum(x_norm * y_norm, F.full((1, 1), 1e-12))


class CTCLoss(Loss):
    """Connectionist Temporal Classification loss (the ``CTCLoss`` operator) with the last
    channel of ``pred`` reserved for the blank; labels are padded with -1 unless
    ``label_lengths`` is given. ``pred_lengths`` and ``label_lengths`` are optional per-sample
    lengths. Returns one loss per sample, shape (batch,)."""

    def __init__(self, layout="NTC", label_layout="NT", weight=None, **kwargs):
        if layout not in ("NTC", "TNC"):
            raise AssertionError("Only 'NTC' and 'TNC' layouts for pred are supported. Got: %s" % layout)
        if label_layout not in ("NT", "TN"):
            raise AssertionError("Only 'NT' and 'TN' layouts for label are supported. Got: %s" % label_layout)
        self._layout = layout
        self._label_layout = label_layout
        super().__init__(weight, label_layout.find("N"), **kwargs)

    def hybrid_forward(self, F, pred, label, pred_lengths=None, label_lengths=None, sample_weight=None):
        if self._layout == "NTC":
            pred = F.swapaxes(pred, 0, 1)
        if self._batch_axis == 1:
            label = F.swapaxes(label, 0, 1)
        loss = F.CTCLoss(pred, label, pred_lengths, label_lengths,
                         use_data_lengths=pred_lengths is not None,
                         use_label_lengths=label_lengths is not None,
                         blank_label="last")
        return _apply_weighting(F, loss, self._weight, sample_weight)


class SDMLLoss(Loss):
    """Batch-wise Smoothed Deep Metric Learning loss (Bonadiman et al. 2019): x1[i] and x2[i]
    form a positive pair and every other row of x2 is a negative for x1[i]. The softmax of the
    negative squared distances is compared (KL divergence) with smoothed identity labels that
    give ``smoothing_parameter`` of the mass to the negatives. Returns shape (batch,)."""

    def __init__(self, smoothing_parameter=0.3, weight=1., batch_axis=0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self.kl_loss = KLDivLoss(from_logits=True)
        self.smoothing_parameter = smoothing_parameter

    def _compute_labels(self, F, batch_size):
        """Identity targets smoothed: 1 - s on the diagonal, s / (batch - 1) elsewhere."""
        gold = F.eye(batch_size)
        return gold * (1 - self.smoothing_parameter) + (1 - gold) * self.smoothing_parameter / (batch_size - 1)

    @staticmethod
    def _compute_distances(F, x1, x2):
        """Squared euclidean distance between every row of x1 and every row of x2, (batch, batch)."""
        differences = F.broadcast_sub(F.expand_dims(x1, 1), F.expand_dims(x2, 0))
        return F.sum(F.square(differences), axis=2)

    def hybrid_forward(self, F, x1, x2):
        if F is not ndarray:
            raise NotImplementedError("SDMLLoss needs the batch size of its inputs: call it on NDArrays, "
                                      "not inside a hybridized block")
        if x1.shape != x2.shape or len(x1.shape) != 2:
            raise ValueError("SDMLLoss expects two (batch_size, dim) arrays of one shape, got %s and %s"
                             % (x1.shape, x2.shape))
        labels = self._compute_labels(F, x1.shape[0])
        distances = self._compute_distances(F, x1, x2)
        log_probabilities = F.log_softmax(-distances, axis=1)
        return self.kl_loss(log_probabilities, labels.as_in_context(distances.context))


class PoissonNLLLoss(Loss):
    """Negative log-likelihood of a Poisson target; ``from_logits`` means pred is log(rate)."""

    def __init__(self, weight=None, from_logits=True, batch_axis=0, compute_full=False, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._from_logits = from_logits
        self._compute_full = compute_full

    def hybrid_forward(self, F, pred, target, sample_weight=None, epsilon=1e-08):
        target = self._reshape_like(F, target, pred, "target")
        if self._from_logits:
            loss = F.exp(pred) - target * pred
        else:
            loss = pred - target * F.log(pred + epsilon)
        if self._compute_full:
            stirling = target * F.log(target) - target + 0.5 * F.log(2 * target * np.pi)
            stirling = stirling * (target > 1)
            loss = loss + stirling
        loss = _apply_weighting(F, loss, self._weight, sample_weight)
        return F.mean(loss)
