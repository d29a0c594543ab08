"""CTCLoss (the operator and gluon.loss.CTCLoss) against a brute-force reference that sums the
probability of every alignment, and its gradient against finite differences."""

import itertools
import math

import numpy as np
import pytest

import oxnet as mx
from oxnet import autograd, gluon


def _log_softmax(x):
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _collapse(path, blank):
    """CTC's many-to-one map: merge repeated symbols, then drop blanks."""
    merged = [s for i, s in enumerate(path) if i == 0 or s != path[i - 1]]
    return [s for s in merged if s != blank]


def _brute_force_loss(activations, labels, blank):
    """-log of the summed probability of every path over (steps, alphabet) that collapses to
    `labels`; 0 when no path does (MXNet's convention for unalignable labels)."""
    log_probs = _log_softmax(activations.astype(np.float64))
    steps, alphabet = log_probs.shape
    total = 0.0
    for path in itertools.product(range(alphabet), repeat=steps):
        if _collapse(list(path), blank) == list(labels):
            total += np.exp(sum(log_probs[t, s] for t, s in enumerate(path)))
    return 0.0 if total == 0.0 else -np.log(total)


def _reference(data, label_rows, data_lengths, blank):
    """Loss per batch element of data (steps, batch, alphabet) for the given label lists."""
    return np.array([_brute_force_loss(data[:data_lengths[b], b], label_rows[b], blank)
                     for b in range(data.shape[1])])


@pytest.mark.parametrize("blank_label", ["first", "last"])
def test_ctc_loss_matches_brute_force(blank_label):
    rng = np.random.RandomState(0)
    steps, batch, alphabet = 5, 4, 4
    data = rng.randn(steps, batch, alphabet).astype(np.float32) * 2
    blank = 0 if blank_label == "first" else alphabet - 1
    symbols = [s for s in range(alphabet) if s != blank]
    a, b, c = symbols
    label_rows = [[a, b], [c, c], [a, b, a], []]  # different labels, a repeat, the longest, empty
    padding = 0 if blank_label == "first" else -1
    label = np.full((batch, 3), padding, dtype=np.float32)
    for row, labels in zip(label, label_rows):
        row[:len(labels)] = labels
    loss = mx.nd.CTCLoss(mx.nd.array(data), mx.nd.array(label), blank_label=blank_label)
    expected = _reference(data, label_rows, [steps] * batch, blank)
    np.testing.assert_allclose(loss.asnumpy(), expected, rtol=1e-5, atol=1e-5)


def test_ctc_loss_lengths_inputs_match_brute_force():
    rng = np.random.RandomState(1)
    steps, batch, alphabet = 6, 3, 3
    data = rng.randn(steps, batch, alphabet).astype(np.float32)
    # blank 'last' = 2; label_lengths cut the rows, so any value may follow the valid labels
    label = np.array([[0, 1, 1], [1, 1, 0], [0, 0, 0]], dtype=np.float32)
    label_lengths = np.array([2, 3, 1], dtype=np.float32)
    data_lengths = np.array([4, 6, 2], dtype=np.float32)
    loss = mx.nd.ctc_loss(mx.nd.array(data), mx.nd.array(label), mx.nd.array(data_lengths),
                          mx.nd.array(label_lengths), use_data_lengths=True, use_label_lengths=True,
                          blank_label="last")
    label_rows = [list(label[b, :int(label_lengths[b])].astype(int)) for b in range(batch)]
    expected = _reference(data, label_rows, data_lengths.astype(int), blank=2)
    np.testing.assert_allclose(loss.asnumpy(), expected, rtol=1e-5, atol=1e-5)


def test_ctc_loss_unalignable_label_is_zero_with_zero_gradient():
    # 3 labels with one repeat need 4 steps; 3 are given
    data = mx.nd.array(np.random.RandomState(2).randn(3, 1, 3))
    data.attach_grad()
    with autograd.record():
        loss = mx.nd.contrib.CTCLoss(data, mx.nd.array([[1, 1, 2]]))
    loss.backward()
    assert loss.asnumpy().tolist() == [0.0]
    assert not data.grad.asnumpy().any()


def test_ctc_loss_gradient_matches_finite_differences():
    rng = np.random.RandomState(3)
    steps, batch, alphabet = 6, 3, 4
    data = rng.randn(steps, batch, alphabet)
    label = mx.nd.array([[1, 2, 2], [3, 1, 0], [2, 0, 0]], dtype="float64")
    data_lengths = mx.nd.array([6, 5, 3], dtype="float64")
    head = rng.uniform(0.5, 2.0, size=batch)

    def weighted_loss(values):
        out = mx.nd.CTCLoss(mx.nd.array(values, dtype="float64"), label, data_lengths, use_data_lengths=True)
        return float((out.asnumpy() * head).sum())

    x = mx.nd.array(data, dtype="float64")
    x.attach_grad()
    with autograd.record():
        loss = mx.nd.CTCLoss(x, label, data_lengths, use_data_lengths=True)
    loss.backward(mx.nd.array(head, dtype="float64"))
    analytic = x.grad.asnumpy()

    numeric = np.zeros_like(data)
    eps = 1e-6
    for index in np.ndindex(*data.shape):
        plus, minus = data.copy(), data.copy()
        plus[index] += eps
        minus[index] -= eps
        numeric[index] = (weighted_loss(plus) - weighted_loss(minus)) / (2 * eps)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-7)
    # past a sequence's length the gradient is exactly zero
    assert not analytic[3:, 2].any() and not analytic[5:, 1].any()


def test_ctc_loss_stays_finite_for_long_confident_sequences():
    # 400 steps of activations far from the labels: probabilities of 1e-300 and below, which a
    # recursion outside log space would flush to zero
    steps, alphabet = 400, 5
    data = np.full((steps, 1, alphabet), -40.0, dtype=np.float32)
    data[:, 0, 0] = 40.0
    x = mx.nd.array(data)
    x.attach_grad()
    with autograd.record():
        loss = mx.nd.CTCLoss(x, mx.nd.array([[1, 2, 3, 4]]))
    loss.backward()
    # the paths that emit each label once and blanks elsewhere dominate: C(400, 4) of them,
    # each of probability e^(-80 * 4)
    expected = 4 * 80 - np.log(float(math.comb(steps, 4)))
    np.testing.assert_allclose(loss.asnumpy(), [expected], rtol=1e-5)
    assert np.isfinite(x.grad.asnumpy()).all()


def test_gluon_ctc_loss_mxnet_values_and_layouts():
    # MXNet 1.9.1's values: uniform activations, labels padded with -1 (blank is the last channel)
    expected = np.array([18.82820702, 16.50581741])
    label = mx.nd.array([[1, 0, -1, -1], [2, 1, 1, -1]])
    np.testing.assert_allclose(gluon.loss.CTCLoss()(mx.nd.ones((2, 20, 4)), label).asnumpy(), expected, rtol=1e-5)
    tn = gluon.loss.CTCLoss(layout="TNC", label_layout="TN")
    np.testing.assert_allclose(tn(mx.nd.ones((20, 2, 4)), label.T).asnumpy(), expected, rtol=1e-5)
    with_lengths = gluon.loss.CTCLoss()(mx.nd.ones((2, 25, 4)), mx.nd.array([[2, 1, 3, 3], [3, 2, 2, 3]]),
                                        mx.nd.array([20, 20]), mx.nd.array([2, 3]))
    np.testing.assert_allclose(with_lengths.asnumpy(), expected, rtol=1e-5)


def test_gluon_ctc_loss_hybridized_and_symbolic():
    rng = np.random.RandomState(4)
    pred = mx.nd.array(rng.randn(3, 7, 5))
    label = mx.nd.array([[0, 1, -1], [2, 2, 3], [3, -1, -1]])
    loss = gluon.loss.CTCLoss()
    imperative = loss(pred, label).asnumpy()
    loss.hybridize()
    np.testing.assert_allclose(loss(pred, label).asnumpy(), imperative, rtol=1e-6)

    out = mx.sym.CTCLoss(mx.sym.var("data"), mx.sym.var("label"), mx.sym.var("data_lengths"),
                         use_data_lengths=True)
    assert out.list_arguments() == ["data", "label", "data_lengths"]
    _, out_shapes, _ = out.infer_shape(data=(7, 3, 5), label=(3, 3))
    assert out_shapes == [(3,)]


def test_ctc_loss_rejects_bad_inputs():
    data = mx.nd.ones((4, 2, 3))
    with pytest.raises(mx.MXNetError, match=r"CTCLoss: label 3 of batch element 0 is not a channel index in \[0, 3\)"):
        mx.nd.CTCLoss(data, mx.nd.array([[3, 1], [1, 2]])).asnumpy()
    with pytest.raises(mx.MXNetError, match="same batch size"):
        mx.nd.CTCLoss(data, mx.nd.array([[1, 2]]))
    with pytest.raises(mx.MXNetError, match="more labels per sequence"):
        mx.nd.CTCLoss(data, mx.nd.ones((2, 5)))
    with pytest.raises(mx.MXNetError, match="data length 5"):
        mx.nd.CTCLoss(data, mx.nd.ones((2, 2)), mx.nd.array([5, 1]), use_data_lengths=True).asnumpy()
    with pytest.raises(mx.MXNetError, match="blank_label must be 'first' or 'last'"):
        mx.nd.CTCLoss(data, mx.nd.ones((2, 2)), blank_label="middle")
