"""mx.contrib.autograd: MXNet's early autograd API (one flag for recording and training mode)."""

import numpy as np
import pytest

import oxnet as mx
from oxnet import autograd
from oxnet.contrib import autograd as contrib_autograd


def test_train_section_records_and_trains_then_restores_both_flags():
    assert not autograd.is_recording() and not autograd.is_training()
    with contrib_autograd.train_section():
        assert autograd.is_recording() and autograd.is_training()
        with contrib_autograd.test_section():
            assert not autograd.is_recording() and not autograd.is_training()
        assert autograd.is_recording() and autograd.is_training()
    assert not autograd.is_recording() and not autograd.is_training()


def test_set_is_training_returns_previous_recording_state():
    assert contrib_autograd.set_is_training(True) is False
    try:
        assert autograd.is_training()
        assert contrib_autograd.set_is_training(False) is True
    finally:
        contrib_autograd.set_is_training(False)
    assert not autograd.is_recording()


def test_grad_and_loss_differentiates_the_chosen_arguments():
    a = mx.nd.array([[1.0, 2.0], [3.0, 4.0]])
    b = mx.nd.array([[5.0, 6.0], [7.0, 8.0]])
    grads, loss = contrib_autograd.grad_and_loss(lambda x, y: x * y + x, argnum=1)(a, b)
    assert len(grads) == 1
    np.testing.assert_allclose(grads[0].asnumpy(), a.asnumpy())
    np.testing.assert_allclose(loss.asnumpy(), (a * b + a).asnumpy())
    (grad_a,) = contrib_autograd.grad(lambda x: mx.nd.exp(x))(a)
    np.testing.assert_allclose(grad_a.asnumpy(), np.exp(a.asnumpy()), rtol=1e-6)


def test_backward_with_head_gradients_and_add_requests():
    x = mx.nd.ones((2, 3))
    dx = mx.nd.zeros((2, 3))
    contrib_autograd.mark_variables([x], [dx], grad_reqs="add")
    for _ in range(2):
        with contrib_autograd.train_section():
            y = x * 3
        contrib_autograd.backward([y], [mx.nd.full((2, 3), 2.0)])
    np.testing.assert_allclose(dx.asnumpy(), np.full((2, 3), 12.0))


def test_backward_rejects_a_bare_array_and_mismatched_head_gradients():
    x = mx.nd.ones((2,))
    contrib_autograd.mark_variables([x], [mx.nd.zeros((2,))])
    with contrib_autograd.train_section():
        y = x + 1
    with pytest.raises(TypeError, match="list or tuple"):
        contrib_autograd.backward(y)
    with pytest.raises(ValueError, match="same length"):
        contrib_autograd.backward([y], [None, None])
