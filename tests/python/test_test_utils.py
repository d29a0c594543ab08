"""oxnet.test_utils behaves like mxnet.test_utils."""

import os
import sys

import numpy as np
import pytest

import oxnet as mx
from oxnet import test_utils as tu


def test_almost_equal_and_assert():
    a = mx.nd.array([1.0, 2.0, 3.0])
    assert tu.almost_equal(a, np.array([1.0, 2.0, 3.00001]))
    assert not tu.almost_equal(a, np.array([1.0, 2.0, 3.1]))
    assert not tu.almost_equal(a, np.ones(2))
    tu.assert_almost_equal(a, a.asnumpy())
    with pytest.raises(AssertionError, match=r"maximum error: \(1,\), got=2, want=2.5"):
        tu.assert_almost_equal(a, np.array([1.0, 2.5, 3.0]), names=("got", "want"))
    with pytest.raises(AssertionError, match="shape mismatch"):
        tu.assert_almost_equal(a, np.ones(2))
    with pytest.raises(AssertionError, match="shape mismatch"):
        tu.assert_almost_equal(a, np.ones((1, 3)), use_broadcast=False)
    tu.assert_almost_equal(np.ones((2, 3)), np.ones(3))  # broadcasting by default
    assert tu.same(a, [1, 2, 3]) and not tu.same(a, [1, 2, 4])


def test_assert_almost_equal_names_worst_index_and_counts():
    a = np.zeros((3, 4), dtype=np.float32)
    b = a.copy()
    b[2, 1] = 5.0
    b[0, 3] = 0.5
    with pytest.raises(AssertionError) as info:
        tu.assert_almost_equal(a, b, names=("ours", "ref"))
    msg = str(info.value)
    assert "Location of maximum error: (2, 1), ours=0, ref=5" in msg
    assert "2 of 12 elements mismatch" in msg
    assert "(0, 3)" in msg  # the second-worst element is listed too


def test_tolerances_follow_the_less_precise_dtype():
    assert tu.get_rtol() == 1e-5 and tu.get_atol() == 1e-20
    assert tu.get_rtol(dtype=np.float16) == 1e-2 and tu.get_atol(0.5) == 0.5
    assert tu.get_etol() == 0 and tu.get_etol(0.1) == 0.1
    x16, x64 = np.ones(3, np.float16), np.ones(3, np.float64)
    assert tu.get_tols(x16, x64, None, None) == (1e-2, 1e-1)
    assert tu.get_tols(x64, x64, None, None) == (1e-5, 1e-20)
    assert tu.get_tolerance(x16, {np.dtype(np.float16): 0.3}, tu.default_rtols()) == 0.3
    assert tu.get_tolerance(x16, 0.7, tu.default_rtols()) == 0.7
    # float16 data passes at float16 tolerances, fails at float32 ones
    a = np.array([1.0, 2.0], dtype=np.float16)
    tu.assert_almost_equal(a, np.array([1.005, 2.0]))
    with pytest.raises(AssertionError):
        tu.assert_almost_equal(a.astype(np.float32), np.array([1.005, 2.0], dtype=np.float32))
    # integers compare exactly; booleans too
    with pytest.raises(AssertionError):
        tu.assert_almost_equal(np.array([1, 2]), np.array([1, 3]))
    tu.assert_almost_equal(np.array([True, False]), np.array([True, False]))
    with pytest.raises(AssertionError):
        tu.assert_almost_equal(np.array([True, False]), np.array([True, True]))


def test_effective_dtype():
    assert tu.effective_dtype(mx.nd.ones((2,))) == np.float32
    assert tu.effective_dtype(np.ones(2, np.float64)) == np.float64
    assert tu.effective_dtype(mx.nd.ones((2,)).astype("bfloat16")) == np.float16
    assert tu.default_dtype() == np.float32


def test_nan_handling_and_variants():
    a = np.array([1.0, np.nan, 3.0])
    with pytest.raises(AssertionError):
        tu.assert_almost_equal(a, a.copy())
    tu.assert_almost_equal(a, a.copy(), equal_nan=True)
    tu.assert_allclose(a, a.copy())
    tu.assert_almost_equal_ignore_nan(a, np.array([1.0, 7.0, np.nan]))
    with pytest.raises(AssertionError):
        tu.assert_almost_equal_ignore_nan(a, np.array([2.0, 7.0, 3.0]))
    b = np.arange(10.0)
    c = b.copy()
    c[3] += 1
    tu.assert_almost_equal_with_err(b, c, etol=0.2)
    with pytest.raises(AssertionError, match="Mismatch rate"):
        tu.assert_almost_equal_with_err(b, c, etol=0.05)
    with pytest.raises(AssertionError):
        tu.assert_almost_equal_with_err(b, c)
    idx, viol = tu.find_max_violation(b, c, rtol=0, atol=0.5)
    assert idx == (3,) and viol == pytest.approx(2.0)


def test_default_context_and_random_helpers():
    assert tu.default_context() == mx.cpu(0)
    tu.set_default_context(mx.cpu(1))
    try:
        assert tu.default_context() == mx.cpu(1)
        assert mx.current_context() == mx.cpu(1)
        x = tu.rand_ndarray((3, 4))
        assert x.context == mx.cpu(1) and x.dtype == np.float32
    finally:
        tu.set_default_context(None)
    assert tu.default_context() == mx.cpu(0)
    shape = tu.rand_shape_nd(4, dim=5)
    assert len(shape) == 4 and all(1 <= d <= 5 for d in shape)
    assert any(0 in tu.rand_shape_nd(3, dim=1, allow_zero_size=True) for _ in range(50))
    assert all(1 <= d <= 3 for d in tu.rand_shape_2d(3, 3) + tu.rand_shape_3d(3, 3, 3))
    assert tu.rand_ndarray((2, 2), dtype="float64").dtype == np.float64
    csr, (values, indices, indptr) = tu.rand_sparse_ndarray((6, 5), "csr", density=0.4, shuffle_csr_indices=True)
    dense = np.zeros((6, 5), dtype=np.float32)
    dense[np.repeat(np.arange(6), np.diff(indptr)), indices] = values
    np.testing.assert_array_equal(csr.asnumpy(), dense)
    rsp = tu.create_sparse_array((5, 3), "row_sparse", rsp_indices=[4, 1], data_init=2.0)
    assert rsp.indices.asnumpy().tolist() == [1, 4] and (rsp.data.asnumpy() == 2).all()
    assert tu.create_sparse_array_zd((5, 3), "row_sparse", 0).data.shape == (0, 3)
    assert tu.rand_ndarray((8, 8), stype="csr", density=0.5, distribution="powerlaw").stype == "csr"
    assert tu.random_arrays((2, 3)).shape == (2, 3)
    assert [x.shape for x in tu.random_arrays((1,), (2, 2))] == [(1,), (2, 2)]
    u = tu.random_uniform_arrays((100,), low=2, high=3)[0]
    assert u.dtype == np.float32 and 2 <= u.min() and u.max() < 3
    assert sorted(tu.random_sample(list(range(10)), 10)) == list(range(10))
    x, y = tu.rand_coord_2d(0, 3, 5, 6)
    assert 0 <= x < 3 and y == 5


def test_small_constructors_and_numpy_helpers():
    assert tu.create_vector(4).asnumpy().tolist() == [0, 1, 2, 3]
    assert tu.create_2d_tensor(3, 2).asnumpy().tolist() == [[0, 0], [1, 1], [2, 2]]
    assert tu.get_identity_mat_batch(2).shape == (2, 2, 2)
    dat = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(tu.np_reduce(dat, (0, 2), True, np.sum),
                                  dat.sum(axis=(0, 2), keepdims=True))
    np.testing.assert_array_equal(tu.np_reduce(dat, None, False, np.max), dat.max())
    np.testing.assert_array_equal(tu.collapse_sum_like(dat, (3, 1)), dat.sum(axis=(0, 2)).reshape(3, 1))
    assert tu.collapse_sum_like(dat, (0, 4)).shape == (0, 4)
    m = tu.new_matrix_with_real_eigvals_nd((2, 4, 4))
    assert m.shape == (2, 4, 4) and np.abs(np.linalg.eigvals(m).imag).max() < 1e-6
    s = tu.new_sym_matrix_with_real_eigvals_nd((3, 3))
    np.testing.assert_allclose(s, s.T, atol=1e-12)


def test_same_array_detects_shared_memory():
    a = mx.nd.arange(6).reshape((2, 3))
    view = a.reshape((2, 3))
    copy = a.copy()
    assert tu.same_array(a, view)
    assert not tu.same_array(a, copy)
    assert a.asnumpy().tolist() == [[0, 1, 2], [3, 4, 5]]  # restored


def test_environment_sets_and_restores():
    os.environ.pop("OXNET_TEST_VAR", None)
    with tu.environment("OXNET_TEST_VAR", "1"):
        assert os.environ["OXNET_TEST_VAR"] == "1"
        with tu.environment({"OXNET_TEST_VAR": None}):
            assert "OXNET_TEST_VAR" not in os.environ
        assert os.environ["OXNET_TEST_VAR"] == "1"
    assert "OXNET_TEST_VAR" not in os.environ
    assert tu.set_env_var("OXNET_TEST_VAR", "2", default_val="none") == "none"
    assert tu.set_env_var("OXNET_TEST_VAR", "3") == "2"
    os.environ.pop("OXNET_TEST_VAR")


def test_misc_flags_exceptions_and_retry():
    assert list(tu.list_gpus()) == list(range(mx.context.num_gpus()))
    assert tu.has_tvm_ops() is False and tu.is_op_runnable() is True
    with tu.environment("CD_JOB", None):
        assert tu.is_cd_run() is False
    tu.assert_exception(int, ValueError, "x")
    with pytest.raises(AssertionError):
        tu.assert_exception(int, ValueError, "1")
    calls = []

    @tu.retry(3)
    def flaky():
        calls.append(1)
        assert len(calls) >= 2

    flaky()
    assert len(calls) == 2

    @tu.retry(2)
    def always_fails():
        assert False, "nope"

    with pytest.raises(AssertionError, match="nope"):
        always_fails()
    assert callable(tu.use_np)


def test_discard_stderr_redirects_fd2(capfd):
    with tu.discard_stderr():
        os.write(2, b"hidden\n")
        sys.stderr.write("also hidden\n")
    os.write(2, b"visible\n")
    err = capfd.readouterr().err
    assert "hidden" not in err and "visible" in err


def test_download_fails_clearly(tmp_path):
    existing = tmp_path / "already.txt"
    existing.write_text("x")
    assert tu.download("http://127.0.0.1:9/already.txt", dirname=str(tmp_path)) == str(existing)
    with pytest.raises(OSError, match="127.0.0.1:9/missing.bin"):
        tu.download("http://127.0.0.1:9/missing.bin", dirname=str(tmp_path), retries=0)


def _sym_xy():
    x, y = mx.sym.var("x"), mx.sym.var("y")
    return mx.sym.elemwise_add(x * y, mx.sym.sin(x), name="out")


def test_check_numeric_gradient_passes_and_catches_wrong_gradients():
    x = np.random.uniform(-1, 1, (2, 3))
    y = np.random.uniform(-1, 1, (2, 3))
    sym = _sym_xy()
    tu.check_numeric_gradient(sym, [x, y])
    tu.check_numeric_gradient(sym, {"x": x, "y": y}, grad_nodes=["x"], dtype=np.float64)
    tu.check_numeric_gradient(sym, [x, y], grad_nodes={"x": "write", "y": "null"})
    tu.check_numeric_gradient(mx.sym.tanh(mx.sym.var("x")), [x], grad_nodes={"x": "add"})
    # BlockGrad's backward is zero while its forward is the identity: a wrong gradient
    wrong = mx.sym.BlockGrad(mx.sym.var("x")) * 2
    with pytest.raises(AssertionError, match="NUMERICAL_x"):
        tu.check_numeric_gradient(wrong, [x])
    exe = sym.simple_bind(mx.cpu(), x=(2, 3), y=(2, 3), type_dict={"x": np.float64, "y": np.float64})
    grads = tu.numeric_grad(exe,
                            {"x": x, "y": y}, eps=1e-6, dtype=np.float64)
    np.testing.assert_allclose(grads["x"], y + np.cos(x), rtol=1e-5)
    np.testing.assert_allclose(grads["y"], x, rtol=1e-5)


def test_check_symbolic_forward_and_backward():
    x = np.random.uniform(-1, 1, (2, 3))
    y = np.random.uniform(-1, 1, (2, 3))
    og = np.random.uniform(-1, 1, (2, 3))
    sym = _sym_xy()
    outs = tu.check_symbolic_forward(sym, [x, y], [x * y + np.sin(x)])
    assert outs[0].shape == (2, 3)
    tu.check_symbolic_forward(sym, {"x": x, "y": y}, {sym.list_outputs()[0]: x * y + np.sin(x)},
                              dtype=np.float64)
    with pytest.raises(AssertionError, match="EXPECTED_"):
        tu.check_symbolic_forward(sym, [x, y], [x * y])
    with pytest.raises(ValueError):
        tu.check_symbolic_forward(sym, {"x": x}, [x])
    grads = tu.check_symbolic_backward(sym, [x, y], [og], [og * (y + np.cos(x)), og * x])
    assert set(grads) == {"x", "y"}
    tu.check_symbolic_backward(sym, {"x": x, "y": y}, {sym.list_outputs()[0]: og},
                               {"x": og * (y + np.cos(x))}, grad_req={"x": "write", "y": "null"},
                               dtype="asnumpy")
    tu.check_symbolic_backward(mx.sym.sin(mx.sym.var("x")), [x], [og], [og * np.cos(x)],
                               grad_req="add")
    with pytest.raises(AssertionError, match="BACKWARD_y"):
        tu.check_symbolic_backward(sym, [x, y], [og], [og * (y + np.cos(x)), og * y])
    # aux states: BatchNorm in inference mode uses the given moving statistics
    data = mx.sym.var("data")
    bn = mx.sym.BatchNorm(data, fix_gamma=False, name="bn")
    d = np.random.uniform(-1, 1, (4, 3))
    mean, var = np.random.uniform(-1, 1, 3), np.random.uniform(0.5, 1, 3)
    expect = (d - mean) / np.sqrt(var + 1e-3)
    tu.check_symbolic_forward(bn, [d, np.ones(3), np.zeros(3)], [expect], aux_states=[mean, var],
                              rtol=1e-3, atol=1e-4)


def test_simple_forward_and_check_speed():
    x = np.random.uniform(-1, 1, (2, 3))
    y = np.random.uniform(-1, 1, (2, 3))
    out = tu.simple_forward(_sym_xy(), x=x, y=y)
    tu.assert_almost_equal(out, x * y + np.sin(x))
    assert tu.check_speed(_sym_xy(), x=(4, 5), y=(4, 5), N=2) > 0
    assert tu.check_speed(_sym_xy(), location={"x": x, "y": y}, N=2, typ="forward") > 0
    with pytest.raises(ValueError):
        tu.check_speed(_sym_xy(), x=(4, 5), y=(4, 5), typ="neither")


def test_check_consistency_across_dtypes():
    sym = _sym_xy()
    ctx_list = [{"ctx": mx.cpu(0), "x": (3, 4), "y": (3, 4), "type_dict": {"x": t, "y": t}}
                for t in (np.float64, np.float32, np.float16)]
    gt = tu.check_consistency(sym, ctx_list)
    out_name = sym.list_outputs()[0]
    assert gt[out_name].dtype == np.float64 and set(gt) == {out_name, "x", "y"}
    gt = tu.check_consistency([sym, sym], ctx_list[:2], grad_req="null")
    assert set(gt) == {out_name}
    # two different computations are caught
    x, y = mx.sym.var("x"), mx.sym.var("y")
    other = mx.sym.elemwise_add(x * y, mx.sym.cos(x), name="out")
    with pytest.raises(AssertionError):
        tu.check_consistency([sym, other], ctx_list[:2])
    tu.check_consistency([sym, other], ctx_list[:2], raise_on_err=False)


class _NoisySGD:
    """The two methods compare_optimizer calls: plain SGD with momentum, plus optional noise."""

    def __init__(self, lr, noise=0.0):
        self.lr, self.noise = lr, noise

    def create_state_multi_precision(self, index, weight):
        return mx.nd.zeros(weight.shape, dtype=weight.dtype)

    def update_multi_precision(self, index, weight, grad, state):
        if isinstance(index, list):
            for i, w, g, s in zip(index, weight, grad, state):
                self.update_multi_precision(i, w, g, s)
            return
        state[:] = 0.9 * state + grad
        weight[:] = weight - self.lr * state
        if self.noise:
            weight[:] = weight + mx.nd.random.normal(0, self.noise, shape=weight.shape, dtype=weight.dtype)


def test_compare_optimizer_helpers():
    tu.compare_optimizer(_NoisySGD(0.1), _NoisySGD(0.1), (3, 4), np.float32)
    with pytest.raises(AssertionError):
        tu.compare_optimizer(_NoisySGD(0.1), _NoisySGD(0.2), (3, 4), np.float32)
    tu.compare_optimizer(_NoisySGD(0.1), _NoisySGD(0.1), [(3, 4), (5,)], np.float64, ntensors=2)
    tu.compare_optimizer_noise_seeded(_NoisySGD(0.1, 0.5), _NoisySGD(0.1, 0.5), (3, 4), np.float32, 42)
    tu.compare_optimizer_noise_seeded(_NoisySGD(0.1, 0.5), _NoisySGD(0.1, 0.5), [(3, 4), (2,)], np.float32, 7)
    with pytest.raises(AssertionError):
        tu.compare_optimizer(_NoisySGD(0.1, 0.5), _NoisySGD(0.1, 0.5), (3, 4), np.float32)
    tu.compare_ndarray_tuple((mx.nd.ones((2,)), None), (np.ones(2), mx.nd.zeros((2,))))
    with pytest.raises(AssertionError):
        tu.compare_ndarray_tuple((mx.nd.ones((2,)),), (np.zeros(2),))


def test_same_symbol_structure():
    a = mx.sym.var("a")
    assert tu.same_symbol_structure(mx.sym.relu(a) + 1, mx.sym.relu(mx.sym.var("b")) + 2)
    assert not tu.same_symbol_structure(mx.sym.relu(a) + 1, mx.sym.sigmoid(a) + 1)


def test_random_generator_checks():
    pytest.importorskip("scipy")
    import scipy.stats as ss
    np.random.seed(0)
    buckets, probs = tu.gen_buckets_probs_with_ppf(lambda q: ss.norm.ppf(q, 0, 1), 5)
    assert len(buckets) == 5 and probs == [0.2] * 5
    assert buckets[0][0] == -np.inf and buckets[-1][1] == np.inf
    normal = lambda n: np.random.normal(0, 1, size=n)  # noqa: E731
    tu.verify_generator(normal, buckets, probs, nsamples=20000)
    with pytest.raises(AssertionError, match="Generator test fails"):
        tu.verify_generator(lambda n: np.random.normal(0.5, 1, size=n), buckets, probs, nsamples=20000)
    p, obs, expected = tu.chi_square_check(lambda n: np.random.randint(0, 4, size=n), [0, 1, 2, 3],
                                           [0.25] * 4, nsamples=8000)
    assert obs.sum() == 8000 and list(expected) == [2000] * 4 and 0 <= p <= 1
    assert tu.mean_check(normal, 0, 1, nsamples=20000)
    assert not tu.mean_check(lambda n: np.random.normal(1, 1, size=n), 0, 1, nsamples=20000)
    assert tu.var_check(normal, 1, nsamples=20000)
    assert not tu.var_check(lambda n: np.random.normal(0, 2, size=n), 1, nsamples=20000)
    # mx.random samplers can be checked the same way
    tu.verify_generator(lambda n: mx.nd.random.normal(0, 1, shape=(n,)).asnumpy(), buckets, probs,
                        nsamples=20000)


def test_dummy_iter_repeats_the_first_batch():
    if not hasattr(mx, "io") and not hasattr(tu, "DummyIter"):
        pytest.skip("mx.io is not available")
    try:
        it = mx.io.NDArrayIter(np.arange(12.0).reshape(6, 2), np.arange(6.0), batch_size=2)
    except AttributeError:
        pytest.skip("mx.io.NDArrayIter is not available")
    dummy = tu.DummyIter(it)
    first = next(dummy)
    assert next(dummy) is first and dummy.next() is first
    assert dummy.batch_size == 2
    tu.assert_almost_equal(first.data[0], np.array([[0.0, 1.0], [2.0, 3.0]]))
