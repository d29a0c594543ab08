"""gluon.loss blocks whose MXNet 1.x form has particular shapes or semantics."""

import numpy as np
import pytest

import oxnet as mx
from oxnet import autograd, gluon


def test_binary_broadcast_ops_ignore_extra_attributes_as_mxnet_does():
    # MXNet registers the element-wise binary family without a parameter parser: extra keyword
    # arguments (gluon's CosineEmbeddingLoss passes axis=1) are kept and ignored
    out = mx.nd.broadcast_maximum(mx.nd.array([0]), mx.nd.array([[2.0], [-1.0]]), axis=1)
    assert out.asnumpy().tolist() == [[2.0], [0.0]]
    assert mx.nd.elemwise_add(mx.nd.ones((2,)), mx.nd.ones((2,)), axis=0).asnumpy().tolist() == [2.0, 2.0]
    sym = mx.sym.broadcast_minimum(mx.sym.var("a"), mx.sym.var("b"), axis=1)
    _, out_shapes, _ = sym.infer_shape(a=(2, 1), b=(1, 3))
    assert out_shapes == [(2, 3)]


@pytest.mark.parametrize("hybridize", [False, True])
def test_cosine_embedding_loss_values_and_shape(hybridize):
    rng = np.random.RandomState(0)
    a, b = rng.randn(4, 3), rng.randn(4, 3)
    label = np.array([1, -1, -1, 0])
    loss_block = gluon.loss.CosineEmbeddingLoss(margin=0.1)
    if hybridize:
        loss_block.hybridize()
    loss = loss_block(mx.nd.array(a), mx.nd.array(b), mx.nd.array(label)).asnumpy()
    cos = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    expected = np.where(label == 1, 1 - cos, np.where(label == -1, np.maximum(cos - 0.1, 0), 0))
    assert loss.shape == (4, 1)  # MXNet 1.x keeps the (batch, 1) column
    np.testing.assert_allclose(loss[:, 0], expected, rtol=1e-5, atol=1e-6)


def test_sdml_loss_values_and_gradient():
    rng = np.random.RandomState(1)
    x1, x2 = rng.randn(4, 3), rng.randn(4, 3)
    smoothing = 0.3
    distances = ((x1[:, None, :] - x2[None, :, :]) ** 2).sum(axis=2)
    shifted = -distances - (-distances).max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    labels = np.where(np.eye(4) == 1, 1 - smoothing, smoothing / 3)
    expected = (labels * (np.log(labels + 1e-12) - log_probs)).mean(axis=1)

    a = mx.nd.array(x1)
    a.attach_grad()
    with autograd.record():
        loss = gluon.loss.SDMLLoss(smoothing_parameter=smoothing)(a, mx.nd.array(x2))
    loss.backward()
    np.testing.assert_allclose(loss.asnumpy(), expected, rtol=1e-5, atol=1e-6)
    assert loss.shape == (4,) and np.isfinite(a.grad.asnumpy()).all() and a.grad.asnumpy().any()
    with pytest.raises(ValueError, match="SDMLLoss expects two"):
        gluon.loss.SDMLLoss()(mx.nd.ones((4, 3)), mx.nd.ones((3, 3)))
