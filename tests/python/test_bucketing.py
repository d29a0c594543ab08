"""gluon.contrib.data.bucketing: log-rounded buckets of variable-length sequences, and padding
invariance of nets that read the lengths (an example's outputs, loss and parameter gradients do
not depend on the bucket it is padded in)."""

import numpy as np
import pytest

import oxnet as mx
from oxnet import autograd, gluon, nd
from oxnet.gluon import nn, rnn
from oxnet.gluon.contrib.data import BucketedBatches
from oxnet.gluon.contrib.data.bucketing import bucket_length, bucket_lengths
from oxnet.test_utils import assert_almost_equal


def test_bucket_lengths_grow_geometrically():
    assert bucket_lengths(64, ratio=1.5, min_length=2) == [2, 3, 5, 8, 12, 18, 27, 41, 62, 93]
    assert bucket_lengths(5, ratio=1.1) == [1, 2, 3, 4, 5]  # always at least one step longer
    assert [bucket_length(n, ratio=2) for n in (1, 2, 3, 5, 9, 16)] == [1, 2, 4, 8, 16, 16]
    with pytest.raises(ValueError, match="ratio must be greater than 1"):
        bucket_lengths(10, ratio=1)


def _digits(count, seed=0):
    rng = np.random.RandomState(seed)
    lengths = rng.randint(1, 40, size=count)
    return [rng.randint(0, 10, size=n) for n in lengths]


def test_batches_cover_every_example_once_padded_to_their_bucket():
    sequences = _digits(200)
    labels = [s.sum() for s in sequences]
    batches = BucketedBatches(sequences, labels, batch_size=16, ratio=1.5, pad_value=-1, seed=3)
    seen = []
    for batch in batches:
        data, lengths = batch.data.asnumpy(), batch.lengths.asnumpy()
        assert data.shape[1] == batch.bucket_length and data.shape[0] <= 16
        # The longest bucket ends at the longest sequence.
        longest = max(len(s) for s in sequences)
        assert min(bucket_length(int(lengths.max()), ratio=1.5), longest) == batch.bucket_length
        for row, i in enumerate(batch.indices):
            n = len(sequences[i])
            assert lengths[row] == n
            assert (data[row, :n] == sequences[i]).all() and (data[row, n:] == -1).all()
            assert batch.label.asnumpy()[row] == labels[i]
        seen.extend(batch.indices)
    assert sorted(seen) == list(range(200))
    assert len(batches) == len(list(batches))
    stats = batches.stats()
    assert sum(stats["buckets"].values()) == 200 and list(stats["buckets"]) == batches.bucket_lengths
    steps = sum(len(s) for s in sequences)
    padded = sum(b * n for b, n in stats["buckets"].items())
    assert stats["padding_fraction"] == pytest.approx(1 - steps / padded)
    assert stats["padding_fraction"] < stats["padding_fraction_to_longest"]
    # Full batches and each bucket's last one: at most two shapes per bucket.
    assert len(stats["buckets"]) <= stats["graphs"] <= 2 * len(stats["buckets"])


def test_pad_to_gives_the_same_batches_in_the_same_order_padded_to_one_length():
    sequences = _digits(120, seed=5)
    bucketed = BucketedBatches(sequences, batch_size=8, ratio=1.5, pad_value=-1, seed=4)
    padded = BucketedBatches(sequences, batch_size=8, ratio=1.5, pad_value=-1, seed=4, pad_to=50)
    for _ in range(2):  # two passes: the shuffles stay in step
        pairs = list(zip(bucketed, padded))
        assert len(pairs) == len(bucketed) == len(padded)
        for short, long in pairs:
            assert list(short.indices) == list(long.indices) and long.bucket_length == 50
            data, wide = short.data.asnumpy(), long.data.asnumpy()
            assert wide.shape == (data.shape[0], 50)
            assert (wide[:, :data.shape[1]] == data).all() and (wide[:, data.shape[1]:] == -1).all()
            assert (short.lengths.asnumpy() == long.lengths.asnumpy()).all()
    steps = sum(len(s) for s in sequences)
    assert padded.stats()["padding_fraction"] == pytest.approx(1 - steps / (50 * len(sequences)))
    assert padded.batch([0, 1]).data.shape == (2, 50)
    assert padded.batch([0, 1], bucket_length=45).data.shape == (2, 45)
    with pytest.raises(ValueError, match="pad_to=30 is shorter than the longest sequence"):
        BucketedBatches(sequences, pad_to=30)


def test_time_major_layout_discarded_last_batches_and_bad_input():
    sequences = [np.ones((n, 3)) * n for n in (2, 3, 3, 4, 7, 8)]
    batches = BucketedBatches(sequences, batch_size=2, ratio=2, layout="TNC", last_batch="discard", shuffle=False)
    shapes = [b.data.shape for b in batches]
    # Buckets 2 (one example: discarded), 4 (three: one full batch) and 8 (two).
    assert shapes == [(4, 2, 3), (8, 2, 3)] and len(batches) == 2
    assert all(b.label is None for b in batches)
    with pytest.raises(ValueError, match="one common feature shape"):
        BucketedBatches([np.ones((2, 3)), np.ones((2, 4))])
    with pytest.raises(ValueError, match="2 sequences but 1 labels"):
        BucketedBatches([np.ones(2), np.ones(3)], labels=[1])


class RecurrentLast(gluon.HybridBlock):
    """Recurrent layer over the valid steps, each sequence's last output, dense head."""

    def __init__(self, cell, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            layer = rnn.LSTM if cell == "lstm" else rnn.GRU
            self.recurrent = layer(6, num_layers=2, bidirectional=True, layout="NTC", use_sequence_length=True)
            self.head = nn.Dense(2)

    def hybrid_forward(self, F, x, lengths):
        states = self.recurrent.begin_state(batch_size=0, func=F.zeros) if F is mx.sym else \
            self.recurrent.begin_state(batch_size=x.shape[0], ctx=x.context)
        out, _ = self.recurrent(x, states, lengths)
        return self.head(F.SequenceLast(out, lengths, use_sequence_length=True, axis=1))


class AttentionPooling(gluon.HybridBlock):
    """Softmax attention over the valid steps only (masked), then a dense head."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.values = nn.Dense(8, flatten=False, activation="tanh")
            self.score = nn.Dense(1, flatten=False)
            self.head = nn.Dense(2)

    def hybrid_forward(self, F, x, lengths):
        values = self.values(x)
        scores = F.reshape(self.score(values), shape=(0, -1))
        weights = F.softmax(scores, lengths, axis=-1, use_length=True)
        pooled = F.batch_dot(F.expand_dims(weights, axis=1), values)
        return self.head(F.reshape(pooled, shape=(0, -1)))


def _example_result(net, batch, row, target):
    """Output, loss and parameter gradients of the example in row ``row`` of ``batch``."""
    with autograd.record():
        out = net(batch.data, batch.lengths)
        losses = ((out - target) ** 2).sum(axis=1)
        picked = (losses * nd.one_hot(nd.array([row]), losses.shape[0])[0]).sum()
    picked.backward()
    grads = {name: p.grad().asnumpy().copy() for name, p in net.collect_params().items()}
    return out.asnumpy()[row], losses.asnumpy()[row], grads


@pytest.mark.parametrize("hybridize", [False, True])
@pytest.mark.parametrize("net_kind", ["lstm", "gru", "attention"])
def test_an_example_learns_the_same_alone_and_padded_in_a_longer_bucket(net_kind, hybridize):
    rng = np.random.RandomState(5)
    sequences = [rng.randn(n, 3) for n in (2, 3, 5, 6, 7, 9, 12, 16)]
    net = AttentionPooling() if net_kind == "attention" else RecurrentLast(net_kind)
    net.initialize(mx.init.Uniform(0.4))
    if hybridize:
        net.hybridize()
    batches = BucketedBatches(sequences, batch_size=4, ratio=2.5, pad_value=7.0, shuffle=False)
    target = nd.array([[0.3, -0.2]])
    compared, compiled = 0, set()
    for batch in batches:
        for row, i in enumerate(batch.indices):
            if len(sequences[i]) == batch.bucket_length:
                continue
            padded = _example_result(net, batch, row, target)
            alone = _example_result(net, batches.batch([i], bucket_length=len(sequences[i])), 0, target)
            assert_almost_equal(padded[0], alone[0], rtol=1e-5, atol=1e-6)
            assert_almost_equal(padded[1], alone[1], rtol=1e-5, atol=1e-6)
            for name, grad in alone[2].items():
                assert_almost_equal(padded[2][name], grad, rtol=1e-4, atol=1e-6)
            compared += 1
            compiled.add(id(net._cached_op))
    assert compared >= 4
    if hybridize:
        # One compiled graph (with one set of parameters) serves every bucket's shape.
        assert len(compiled) == 1 and net._cached_op is not None
