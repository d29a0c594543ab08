"""Sparse storage: CSR and row-sparse arrays built every way MXNet allows, against NumPy and
SciPy; conversions, copies, row slices, pickling, operators on their dense equivalent, and the
errors for what they refuse."""

import pickle

import numpy as np
import pytest

import oxnet as mx
from oxnet import nd
from oxnet.base import MXNetError
from oxnet.ndarray import sparse

sps = pytest.importorskip("scipy.sparse")


def _dense(rng, shape, density=0.3):
    values = rng.uniform(-1, 1, shape).astype(np.float32)
    values[rng.rand(*shape) > density] = 0
    return values


def test_csr_from_every_source_has_scipys_components():
    rng = np.random.RandomState(0)
    dense = _dense(rng, (6, 9))
    want = sps.csr_matrix(dense)
    sources = [dense, nd.array(dense), want, sps.coo_matrix(dense), (want.data, want.indices, want.indptr),
               (want.tocoo().data, (want.tocoo().row, want.tocoo().col))]
    for source in sources:
        csr = sparse.csr_matrix(source, shape=(6, 9))
        assert isinstance(csr, sparse.CSRNDArray) and csr.stype == "csr" and csr.shape == (6, 9)
        np.testing.assert_array_equal(csr.indptr.asnumpy(), want.indptr)
        np.testing.assert_array_equal(csr.indices.asnumpy(), want.indices)
        np.testing.assert_array_equal(csr.data.asnumpy(), want.data)
        np.testing.assert_array_equal(csr.asnumpy(), dense)
        np.testing.assert_array_equal(csr.asscipy().toarray(), dense)
        assert csr.indices.dtype == np.int64 and csr.indptr.dtype == np.int64
    empty = sparse.csr_matrix((3, 4))
    assert empty.dtype == np.float32 and empty.data.shape == (0,) and (empty.asnumpy() == 0).all()


def test_row_sparse_keeps_only_nonzero_rows():
    rng = np.random.RandomState(1)
    dense = rng.uniform(-1, 1, (7, 3, 2)).astype(np.float32)
    dense[[0, 2, 5]] = 0
    rsp = nd.array(dense).tostype("row_sparse")
    assert isinstance(rsp, sparse.RowSparseNDArray) and rsp.stype == "row_sparse"
    np.testing.assert_array_equal(rsp.indices.asnumpy(), [1, 3, 4, 6])
    np.testing.assert_array_equal(rsp.data.asnumpy(), dense[[1, 3, 4, 6]])
    np.testing.assert_array_equal(rsp.asnumpy(), dense)
    built = sparse.row_sparse_array((dense[[1, 3]], [1, 3]), shape=(7, 3, 2))
    np.testing.assert_array_equal(built.asnumpy()[[1, 3]], dense[[1, 3]])
    assert (built.asnumpy()[[0, 2, 4, 5, 6]] == 0).all()
    np.testing.assert_array_equal(rsp.retain(nd.array([3, 5, 6])).indices.asnumpy(), [3, 6])
    zeros = nd.zeros((4, 5), stype="row_sparse")
    assert zeros.stype == "row_sparse" and zeros.data.shape == (0, 5)


def test_conversions_round_trip_between_storage_types():
    rng = np.random.RandomState(2)
    dense = _dense(rng, (5, 8))
    for stype in ("csr", "row_sparse"):
        converted = nd.array(dense).tostype(stype)
        assert converted.stype == stype
        for target in ("default", "csr", "row_sparse"):
            again = converted.tostype(target)
            assert again.stype == target
            np.testing.assert_array_equal(again.asnumpy(), dense)
        np.testing.assert_array_equal(nd.cast_storage(converted, "default").asnumpy(), dense)


def test_csr_row_slices_match_scipy():
    rng = np.random.RandomState(3)
    dense = _dense(rng, (10, 6))
    csr = sparse.csr_matrix(dense)
    for key in (slice(2, 7), slice(None, 4), slice(8, None), slice(5, 5), 3, -1):
        got = csr[key]
        want = sps.csr_matrix(dense)[key] if not isinstance(key, int) else sps.csr_matrix(dense[key:key + 1 or None])
        assert isinstance(got, sparse.CSRNDArray)
        np.testing.assert_array_equal(got.asnumpy(), want.toarray())
        np.testing.assert_array_equal(got.indptr.asnumpy(), want.indptr)
    with pytest.raises(MXNetError, match="step 1"):
        csr[::2]
    with pytest.raises(IndexError):
        csr[10]


def test_split_and_load_keeps_csr_storage():
    csr = sparse.csr_matrix(sps.coo_matrix(([2.0], ([99], [999]))).tocsr())
    parts = mx.gluon.utils.split_and_load(csr, [mx.cpu(0), mx.cpu(0)])
    assert all(isinstance(p, sparse.CSRNDArray) for p in parts)
    assert [p.shape for p in parts] == [(50, 1000), (50, 1000)]
    assert parts[1].asnumpy()[49, 999] == 2.0 and parts[0].data.shape == (0,)


def test_copies_pickles_and_whole_assignment():
    rng = np.random.RandomState(4)
    dense = _dense(rng, (4, 5))
    csr = sparse.csr_matrix(dense)
    copy = csr.copy()
    np.testing.assert_array_equal(copy.asnumpy(), dense)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(csr)).asnumpy(), dense)
    into = nd.zeros((4, 5))
    csr.copyto(into)
    np.testing.assert_array_equal(into.asnumpy(), dense)
    target = sparse.zeros("csr", (4, 5))
    csr.copyto(target)
    np.testing.assert_array_equal(target.asnumpy(), dense)
    target[:] = 2 * dense
    np.testing.assert_array_equal(target.asnumpy(), 2 * dense)
    assert target.stype == "csr"
    assert csr.astype("float64").dtype == np.float64
    with pytest.raises(MXNetError, match="whole array"):
        target[1:2] = 0


def test_operators_compute_on_the_dense_equivalent():
    rng = np.random.RandomState(5)
    dense = _dense(rng, (6, 4))
    weight = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
    for stype in ("csr", "row_sparse"):
        x = nd.array(dense).tostype(stype)
        np.testing.assert_allclose(nd.dot(x, nd.array(weight)).asnumpy(), dense @ weight, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose((x * 2 + 1).asnumpy(), dense * 2 + 1)
        np.testing.assert_allclose(x.sum().asnumpy(), dense.sum(), rtol=1e-5)
        # An output in sparse storage receives the dense result in its own storage type.
        target = nd.zeros(dense.shape, stype=stype)
        nd.relu(nd.array(dense), out=target)
        assert target.stype == stype
        np.testing.assert_allclose(target.asnumpy(), np.maximum(dense, 0))
        x += 1
        assert x.stype == stype
        np.testing.assert_allclose(x.asnumpy(), dense + 1)


def test_invalid_components_and_storage_types_raise():
    broken = sparse.csr_matrix(([1.0, 2.0], [0, 1], [0, 1]), shape=(2, 3))  # checked when used, as in MXNet
    for use in (broken.check_format, broken.asnumpy, lambda: broken + 1):
        with pytest.raises(MXNetError, match="indptr"):
            use()
    with pytest.raises(MXNetError, match="column indices"):
        sparse.csr_matrix(([1.0], [5], [0, 1]), shape=(1, 3)).asnumpy()
    unsorted = sparse.csr_matrix(([1.0, 2.0], [2, 0], [0, 2, 2]), shape=(2, 3))
    with pytest.raises(MXNetError, match="sorted"):
        unsorted.check_format()
    np.testing.assert_array_equal(unsorted.asnumpy(), [[2, 0, 1], [0, 0, 0]])
    with pytest.raises(MXNetError, match="2-D"):
        nd.ones((2, 3, 4)).tostype("csr")
    with pytest.raises(MXNetError, match="unknown storage type"):
        nd.ones((2, 3)).tostype("coo")
    with pytest.raises(MXNetError, match="gradients of sparse arrays"):
        sparse.zeros("csr", (2, 2)).attach_grad()


def test_an_operator_updating_a_sparse_input_in_place_updates_the_array():
    """Optimizer updates write their states in place: a sparse state then holds the new values,
    through its components too; the component accessors return copies, as in MXNet."""
    weight, grad = nd.ones((3, 2)), nd.full((3, 2), 1.0)
    mom = nd.zeros((3, 2), stype="row_sparse")
    nd.sgd_mom_update(weight, grad, mom, lr=0.1, momentum=0.9, out=weight)
    np.testing.assert_allclose(mom.asnumpy(), np.full((3, 2), -0.1), rtol=1e-6)
    np.testing.assert_array_equal(mom.indices.asnumpy(), [0, 1, 2])
    np.testing.assert_allclose(pickle.loads(pickle.dumps(mom)).asnumpy(), mom.asnumpy())
    x = nd.array([[1, 0], [0, 2]]).tostype("csr")
    x.data[:] = 7  # a copy: the array keeps its values
    np.testing.assert_array_equal(x.asnumpy(), [[1, 0], [0, 2]])
    np.testing.assert_array_equal((x * 1).asnumpy(), [[1, 0], [0, 2]])
