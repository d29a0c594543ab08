"""oxnet.test_utils behaves like mxnet.test_utils."""

import os

import numpy as np
import pytest

import oxnet as mx
from oxnet import test_utils as tu


def test_almost_equal_and_assert():
    a = mx.nd.array([1.0, 2.0, 3.0])
    assert tu.almost_equal(a, np.array([1.0, 2.0, 3.00001]))
    assert not tu.almost_equal(a, np.array([1.0, 2.0, 3.1]))
    tu.assert_almost_equal(a, a.asnumpy())
    with pytest.raises(AssertionError, match="worst at index"):
        tu.assert_almost_equal(a, np.array([1.0, 2.5, 3.0]), names=("got", "want"))
    with pytest.raises(AssertionError, match="shape mismatch"):
        tu.assert_almost_equal(a, np.ones(2))
    assert tu.same(a, [1, 2, 3]) and not tu.same(a, [1, 2, 4])


def test_default_context_and_random_helpers():
    assert tu.default_context() == mx.cpu(0)
    tu.set_default_context(mx.cpu(1))
    try:
        assert tu.default_context() == mx.cpu(1)
        x = tu.rand_ndarray((3, 4))
        assert x.context == mx.cpu(1) and x.dtype == np.float32
    finally:
        tu.set_default_context(None)
    shape = tu.rand_shape_nd(4, dim=5)
    assert len(shape) == 4 and all(1 <= d <= 5 for d in shape)
    assert tu.rand_ndarray((2, 2), dtype="float64").dtype == np.float64
    with pytest.raises(ValueError):
        tu.rand_ndarray((2, 2), stype="csr")


def test_environment_sets_and_restores():
    os.environ.pop("OXNET_TEST_VAR", None)
    with tu.environment("OXNET_TEST_VAR", "1"):
        assert os.environ["OXNET_TEST_VAR"] == "1"
        with tu.environment({"OXNET_TEST_VAR": None}):
            assert "OXNET_TEST_VAR" not in os.environ
        assert os.environ["OXNET_TEST_VAR"] == "1"
    assert "OXNET_TEST_VAR" not in os.environ
