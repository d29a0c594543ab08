"""Automatic bucketing of variable-length sequences, the way Wolfram's neural network framework
trains on sequences of any length without padding entering the learning problem.

Examples are grouped into buckets of similar length: a length is rounded up to the next bucket
length of a geometric series (each ``ratio`` times the previous one), so the number of buckets,
and of graphs a hybridized block specializes, grows only logarithmically with the longest
sequence while no example is padded by more than a factor ``ratio``. Each batch holds examples
of one bucket, padded to the bucket's length, and comes with every example's true length. A net
that reads those lengths (``RNN``/``LSTM``/``GRU`` with ``use_sequence_length=True``,
``SequenceLast``, ``SequenceMask``, ``SequenceReverse``, ``softmax(..., use_length=True)``)
gives each example the same outputs, loss and gradients as when it runs alone: the padding does
not change what is learned, only how much work a batch does.

One hybridized block serves every bucket with one set of parameters: the cached graph runs
any input shape, and the buffers of every bucket's calls come from one pooled allocator, so the
memory of one bucket's step is reused by the next.

Typical use::

    batches = BucketedBatches(sequences, labels, batch_size=32)
    for epoch in range(epochs):
        for batch in batches:
            with autograd.record():
                loss = loss_fn(net(batch.data, batch.lengths), batch.label)
            loss.backward()
            trainer.step(batch.data.shape[0])
    print(batches.stats())   # buckets, padding fraction, graphs the block was specialized for
"""

import collections
import math

import numpy as np

from .... import ndarray as nd

__all__ = ["bucket_length", "bucket_lengths", "BucketBatch", "BucketedBatches"]


def bucket_lengths(max_length, ratio=1.5, min_length=1):
    """The bucket lengths up to the first one that holds ``max_length``: ``min_length``, then
    each the previous one times ``ratio``, rounded up (and at least one longer)."""
    if ratio <= 1:
        raise ValueError("bucket_lengths: ratio must be greater than 1, got %r" % (ratio,))
    if min_length < 1:
        raise ValueError("bucket_lengths: min_length must be at least 1, got %r" % (min_length,))
    lengths = [int(min_length)]
    while lengths[-1] < max_length:
        lengths.append(max(lengths[-1] + 1, int(math.ceil(lengths[-1] * ratio))))
    return lengths


def bucket_length(length, ratio=1.5, min_length=1):
    """The length a sequence of ``length`` steps is padded to: the smallest bucket length that
    holds it."""
    return next(b for b in bucket_lengths(length, ratio, min_length) if b >= length)


BucketBatch = collections.namedtuple("BucketBatch", ["data", "lengths", "label", "bucket_length", "indices"])
BucketBatch.__doc__ = """One batch of a bucket: ``data`` padded to ``bucket_length`` steps, each
example's true length in ``lengths`` (float32, shape (batch,)), ``label`` (None without labels) and
the examples' positions in the dataset in ``indices``."""


class BucketedBatches:
    """Batches of similar-length sequences for training on variable-length data.

    Parameters
    ----------
    sequences : list of array-like
        The examples; example ``i`` has shape ``(length_i,) + feature_shape`` (one feature shape
        for all, e.g. ``()`` for token ids or ``(channels,)``).
    labels : list of array-like, optional
        One label per example, all of one shape; stacked into ``batch.label``.
    batch_size : int
        Examples per batch (the last batch of a bucket may hold fewer; see ``last_batch``).
    ratio : float
        Growth factor of the bucket lengths (> 1): larger means fewer buckets, more padding. The
        longest bucket ends at the longest sequence.
    min_length : int
        The shortest bucket length.
    pad_value : float
        What padding steps hold (a net that reads the lengths never looks at them).
    layout : 'NTC' or 'TNC'
        Whether ``data`` is (batch, time, ...) or (time, batch, ...).
    shuffle : bool
        Whether each pass shuffles the examples within their buckets and the order of batches.
    last_batch : 'keep' or 'discard'
        What happens to a bucket's last batch when it holds fewer than ``batch_size`` examples.
    dtype, label_dtype : str
        Element types of ``data`` and ``label``.
    ctx : Context, optional
        Where the arrays are made (the current context by default).
    seed : int, optional
        Seed of the shuffling (NumPy's global generator when None).
    pad_to : int, optional
        Pad every batch to this many steps instead of its bucket's length: the same batches, in
        the same order for the same seed, with padding to the longest sequence, say, to measure
        what bucketing saves (a net that reads the lengths learns the same either way).

    Each bucket's examples are padded once, when the batches are made, as MXNet's
    ``BucketSentenceIter`` does: a batch is then one gather from its bucket's padded array.
    """

    def __init__(self, sequences, labels=None, batch_size=32, ratio=1.5, min_length=1, pad_value=0,
                 layout="NTC", shuffle=True, last_batch="keep", dtype="float32", label_dtype="float32",
                 ctx=None, seed=None, pad_to=None):
        if layout not in ("NTC", "TNC"):
            raise ValueError("BucketedBatches: layout must be 'NTC' or 'TNC', got %r" % (layout,))
        if last_batch not in ("keep", "discard"):
            raise ValueError("BucketedBatches: last_batch must be 'keep' or 'discard', got %r" % (last_batch,))
        if batch_size < 1:
            raise ValueError("BucketedBatches: batch_size must be at least 1, got %r" % (batch_size,))
        self._sequences = [np.asarray(s) for s in sequences]
        if not self._sequences:
            raise ValueError("BucketedBatches: no sequences given")
        feature_shapes = {s.shape[1:] for s in self._sequences}
        if len(feature_shapes) != 1 or any(s.ndim == 0 for s in self._sequences):
            raise ValueError("BucketedBatches: every sequence must have shape (length,) + one common feature shape, "
                             "got feature shapes %s" % sorted(feature_shapes))
        self._feature_shape = feature_shapes.pop()
        if labels is not None and len(labels) != len(self._sequences):
            raise ValueError("BucketedBatches: %d sequences but %d labels" % (len(self._sequences), len(labels)))
        self._labels = None if labels is None else np.asarray(labels)
        self._batch_size = int(batch_size)
        self._pad_value = pad_value
        self._layout = layout
        self._shuffle = shuffle
        self._last_batch = last_batch
        self._dtype = dtype
        self._label_dtype = label_dtype
        self._ctx = ctx
        self._rng = np.random.RandomState(seed) if seed is not None else np.random
        self.lengths = np.array([len(s) for s in self._sequences])
        if self.lengths.min() < 1:
            raise ValueError("BucketedBatches: sequences must have at least one step")
        # The longest bucket ends at the longest sequence: rounding it up would only add padding.
        boundaries = np.array(bucket_lengths(self.lengths.max(), ratio, min_length))
        boundaries[-1] = max(self.lengths.max(), boundaries[0])
        padded = boundaries[np.searchsorted(boundaries, self.lengths)]
        self._buckets = {int(b): np.flatnonzero(padded == b) for b in np.unique(padded)}
        if pad_to is not None and pad_to < self.lengths.max():
            raise ValueError("BucketedBatches: pad_to=%r is shorter than the longest sequence (%d steps)"
                             % (pad_to, self.lengths.max()))
        self._pad_to = pad_to
        self._padded = {bucket: self._pad(members, bucket if pad_to is None else pad_to)
                        for bucket, members in self._buckets.items()}
        self._shapes_seen = set()

    def _pad(self, indices, length):
        """The examples at ``indices`` padded to ``length`` steps, batch-major."""
        padded = np.full((len(indices), length) + self._feature_shape, self._pad_value, dtype=self._dtype)
        for row, i in enumerate(indices):
            padded[row, :self.lengths[i]] = self._sequences[i]
        return padded

    @property
    def bucket_lengths(self):
        """The bucket lengths in use (those some example falls in), shortest first."""
        return sorted(self._buckets)

    def _batches_of(self, bucket):
        """(bucket, positions of the batch's examples among the bucket's) per batch."""
        positions = np.arange(len(self._buckets[bucket]))
        if self._shuffle:
            positions = self._rng.permutation(positions)
        cut = range(0, len(positions), self._batch_size)
        batches = [positions[i:i + self._batch_size] for i in cut]
        if self._last_batch == "discard" and len(batches[-1]) < self._batch_size:
            batches.pop()
        return [(bucket, b) for b in batches]

    def _plan(self):
        plan = [batch for bucket in self.bucket_lengths for batch in self._batches_of(bucket)]
        if self._shuffle:
            plan = [plan[i] for i in self._rng.permutation(len(plan))]
        return plan

    def __len__(self):
        full, rest = zip(*(divmod(len(m), self._batch_size) for m in self._buckets.values()))
        return sum(full) + (sum(1 for r in rest if r) if self._last_batch == "keep" else 0)

    def __iter__(self):
        for bucket, positions in self._plan():
            indices = self._buckets[bucket][positions]
            yield self._assemble(self._padded[bucket][positions], indices, self._pad_to or bucket)

    def batch(self, indices, bucket_length=None):
        """The examples at ``indices`` as one batch, padded to ``bucket_length`` (by default
        ``pad_to``, else the bucket length that holds the longest of them)."""
        indices = np.asarray(indices)
        lengths = self.lengths[indices]
        if bucket_length is None:
            bucket_length = self._pad_to or max(b for b in self.bucket_lengths if b >= lengths.max())
        if lengths.max() > bucket_length:
            raise ValueError("BucketedBatches.batch: a sequence of %d steps does not fit bucket length %d"
                             % (lengths.max(), bucket_length))
        return self._assemble(self._pad(indices, bucket_length), indices, bucket_length)

    def _assemble(self, padded, indices, bucket_length):
        """The batch of the examples at ``indices``, ``padded`` batch-major."""
        lengths = self.lengths[indices]
        if self._layout == "TNC":
            padded = padded.swapaxes(0, 1)
        data = nd.array(padded, ctx=self._ctx, dtype=self._dtype)
        self._shapes_seen.add(data.shape)
        label = None if self._labels is None else nd.array(self._labels[indices], ctx=self._ctx,
                                                             dtype=self._label_dtype)
        return BucketBatch(data, nd.array(lengths, ctx=self._ctx, dtype="float32"), label, bucket_length, indices)

    def stats(self):
        """What bucketing does to this dataset:

        - ``buckets``: {bucket length: number of examples}
        - ``padding_fraction``: share of the padded steps that are padding, over one pass (with
          ``pad_to``, of the steps padded to it)
        - ``padding_fraction_to_longest``: the same when every batch is padded to the longest
          sequence (no bucketing)
        - ``graphs``: distinct batch shapes handed out so far, i.e. the input shapes a
          hybridized block has been specialized for (its cached graphs)
        """
        steps = int(self.lengths.sum())
        padded = sum(int(self._pad_to or b) * len(m) for b, m in self._buckets.items())
        longest = int(self.lengths.max()) * len(self.lengths)
        return {
            "buckets": {b: len(m) for b, m in sorted(self._buckets.items())},
            "padding_fraction": 1 - steps / padded,
            "padding_fraction_to_longest": 1 - steps / longest,
            "graphs": len(self._shapes_seen),
        }
