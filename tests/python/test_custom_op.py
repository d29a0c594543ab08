"""mx.operator: Python operators run as engine ops imperatively, under autograd, in symbols,
executors and hybridized blocks; their errors surface at the next sync point."""

import numpy as np
import pytest

import oxnet as mx
from oxnet import gluon
from oxnet.test_utils import assert_almost_equal, check_numeric_gradient


class _Scale(mx.operator.CustomOp):
    """out = data * weight (broadcast over rows); counts calls into an auxiliary state."""

    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, is_train, req, in_data, out_data, aux):
        self.saved_is_train = is_train
        self.assign(out_data[0], req[0], in_data[0] * in_data[1] * self.factor)
        aux[0][:] = aux[0] + 1

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        self.assign(in_grad[0], req[0], out_grad[0] * in_data[1] * self.factor)
        self.assign(in_grad[1], req[1], (out_grad[0] * in_data[0] * self.factor).sum(axis=0))


@mx.operator.register("test_scale")
class _ScaleProp(mx.operator.CustomOpProp):
    def __init__(self, factor="1.0"):
        super().__init__(need_top_grad=True)
        self.factor = float(factor)

    def list_arguments(self):
        return ["data", "weight"]

    def list_auxiliary_states(self):
        return ["calls"]

    def infer_shape(self, in_shape):
        data = in_shape[0]
        return [data, [data[1]]], [data], [[1]]

    def create_operator(self, ctx, shapes, dtypes):
        return _Scale(self.factor)


class _Failing(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        raise ValueError("custom forward failed on purpose")


@mx.operator.register("test_failing")
class _FailingProp(mx.operator.CustomOpProp):
    def create_operator(self, ctx, shapes, dtypes):
        return _Failing()


def _inputs():
    rng = np.random.RandomState(0)
    return rng.randn(3, 4).astype(np.float32), rng.randn(4).astype(np.float32)


def test_imperative_values_and_aux_state():
    x, w = _inputs()
    calls = mx.nd.zeros((1,))
    y = mx.nd.Custom(mx.nd.array(x), mx.nd.array(w), calls, op_type="test_scale", factor=2.0)
    assert_almost_equal(y, x * w * 2)
    mx.nd.Custom(mx.nd.array(x), mx.nd.array(w), calls, op_type="test_scale", factor=2.0)
    assert calls.asscalar() == 2


def test_autograd_gradient_matches_numpy():
    x, w = _inputs()
    data, weight, calls = mx.nd.array(x), mx.nd.array(w), mx.nd.zeros((1,))
    data.attach_grad()
    weight.attach_grad()
    with mx.autograd.record():
        loss = (mx.nd.Custom(data, weight, calls, op_type="test_scale", factor=3.0) ** 2).sum()
    loss.backward()
    assert_almost_equal(data.grad, 2 * (x * w * 3) * w * 3, rtol=1e-5, atol=1e-5)
    assert_almost_equal(weight.grad, (2 * (x * w * 3) * x * 3).sum(axis=0), rtol=1e-5, atol=1e-5)


def test_symbol_executor_and_numeric_gradient():
    x, w = _inputs()
    sym = mx.sym.Custom(mx.sym.var("data"), mx.sym.var("weight"), mx.sym.var("calls"), op_type="test_scale",
                        factor=0.5, name="scale")
    assert sym.list_arguments() == ["data", "weight"]
    assert sym.list_auxiliary_states() == ["calls"]
    arg_shapes, out_shapes, aux_shapes = sym.infer_shape(data=(3, 4))
    assert arg_shapes == [(3, 4), (4,)] and out_shapes == [(3, 4)] and aux_shapes == [(1,)]
    check_numeric_gradient(sym, {"data": x.astype(np.float64), "weight": w.astype(np.float64)},
                           aux_states={"calls": np.zeros(1)}, numeric_eps=1e-4, rtol=1e-3, atol=1e-4,
                           dtype=np.float64)
    reloaded = mx.sym.load_json(sym.tojson())
    exe = reloaded.simple_bind(mx.cpu(), data=(3, 4))
    exe.forward(is_train=False, data=mx.nd.array(x), weight=mx.nd.array(w))
    assert_almost_equal(exe.outputs[0], x * w * 0.5)


def test_hybridized_block_uses_custom_op():
    class Net(gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.weight = self.params.get("weight", shape=(4,), init=mx.init.One())
                self.calls = self.params.get("calls", shape=(1,), init=mx.init.Zero(), grad_req="null")

        def hybrid_forward(self, F, x, weight, calls):
            return F.Custom(x, weight, calls, op_type="test_scale", factor=2.0)

    x, _ = _inputs()
    net = Net()
    net.initialize()
    expected = net(mx.nd.array(x)).asnumpy()
    net.hybridize()
    data = mx.nd.array(x)
    data.attach_grad()
    with mx.autograd.record():
        out = net(data)
    out.backward()
    assert_almost_equal(out, expected)
    assert_almost_equal(out, x * 2)
    assert_almost_equal(data.grad, np.full_like(x, 2.0))


def test_error_surfaces_at_next_sync_point():
    y = mx.nd.Custom(mx.nd.ones((2, 2)), op_type="test_failing")  # does not raise here
    with pytest.raises(mx.MXNetError, match="custom forward failed on purpose"):
        y.asnumpy()


def test_unknown_op_type_is_a_clear_error():
    with pytest.raises(mx.MXNetError, match="no custom operator is registered as 'not_registered'"):
        mx.nd.Custom(mx.nd.ones((2,)), op_type="not_registered")
