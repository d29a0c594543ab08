"""Bad input gets a clear exception naming the operator, the shapes and what was expected."""

import numpy as np
import pytest

import oxnet as mx
from oxnet.test_utils import assert_exception


def test_shape_mismatch_names_op_and_shapes(ctx):
    a, b = mx.nd.ones((2, 3), ctx=ctx), mx.nd.ones((4,), ctx=ctx)
    with pytest.raises(mx.MXNetError, match=r"broadcast_add\(\(2, 3\) float32, \(4,\) float32\).*could not be broadcast"):
        a + b
    with pytest.raises(mx.MXNetError, match=r"dot.*not aligned.*3 != 4"):
        mx.nd.dot(a, mx.nd.ones((4, 2), ctx=ctx))
    with pytest.raises(mx.MXNetError, match="batch_dot: both inputs must be 3-D"):
        mx.nd.batch_dot(a, a)
    with pytest.raises(mx.MXNetError, match="transpose: axes"):
        mx.nd.transpose(a, axes=(0, 1, 2))


def test_dtype_errors(ctx):
    with pytest.raises(mx.MXNetError, match="share one dtype.*float32.*int32"):
        mx.nd.ones((2,), ctx=ctx) + mx.nd.ones((2,), ctx=ctx, dtype="int32")
    with pytest.raises(mx.MXNetError, match="unknown dtype 'complex64'"):
        mx.nd.cast(mx.nd.ones((2,), ctx=ctx), dtype="complex64")
    with pytest.raises(TypeError, match="unsupported dtype"):
        mx.nd.zeros((2,), ctx=ctx, dtype=np.complex64)


def test_parameter_errors_list_valid_parameters(ctx):
    x = mx.nd.ones((2, 3), ctx=ctx)
    with pytest.raises(mx.MXNetError, match=r"sum: unknown parameter 'axes'; valid parameters: axis, keepdims, exclude"):
        mx.nd.sum(x, axes=1)
    with pytest.raises(mx.MXNetError, match=r"invalid value 'maybe' for parameter 'keepdims'"):
        mx.nd.sum(x, keepdims="maybe")
    with pytest.raises(mx.MXNetError, match=r"required parameter 'num_outputs' is missing"):
        mx.nd.split(x)
    with pytest.raises(mx.MXNetError, match="axis 5 is out of bounds"):
        mx.nd.sum(x, axis=5)
    with pytest.raises(mx.MXNetError, match=r"invalid value 'nearest' for parameter 'mode' \(\{'clip', 'wrap', 'raise'\}\)"):
        mx.nd.take(x, mx.nd.ones((1,), ctx=ctx), mode="nearest")
    with pytest.raises(mx.MXNetError, match="expects 2 input"):
        mx.nd.broadcast_add(x)
    with pytest.raises(mx.MXNetError, match="not registered"):
        mx._core.invoke("no_such_operator", ())


def test_out_argument_is_checked(ctx):
    with pytest.raises(mx.MXNetError, match=r"out\[0\] has shape \(3,\).*result has shape \(2,\)"):
        mx.nd.elemwise_add(mx.nd.ones((2,), ctx=ctx), mx.nd.ones((2,), ctx=ctx), out=mx.nd.zeros((3,), ctx=ctx))


def test_assert_exception_helper():
    assert_exception(mx.nd.sum, mx.MXNetError, mx.nd.ones((2,)), axis=3)
    with pytest.raises(AssertionError):
        assert_exception(mx.nd.sum, mx.MXNetError, mx.nd.ones((2,)))
    assert issubclass(mx.MXNetError, RuntimeError) and mx.base.MXNetError is mx.MXNetError


def test_allocations_beyond_the_machine_raise():
    with pytest.raises(mx.MXNetError, match=r"_zeros.*cannot allocate an array of shape \(4611686018427387904, 4\)"):
        mx.nd.zeros((1 << 62, 4))
    # Larger than physical memory: refused instead of overcommitted (which would kill the
    # process on first touch); the error reaches the caller when the result is read.
    big = mx.nd.zeros((1 << 38,))
    with pytest.raises(mx.MXNetError, match="out of host memory: 1099511627776 bytes requested"):
        big.wait_to_read()
    mx.nd.waitall()  # the error was raised at wait_to_read: not again here
    assert mx.nd.ones((2,)).asnumpy().tolist() == [1, 1]
