"""Text helpers for the symbolic RNN API: encoding token sentences as integer ids, and a
bucketing iterator that batches sentences of similar length (MXNet's ``mxnet.rnn.io``)."""

import bisect
import random

import numpy as np

from .. import ndarray
from ..io import DataBatch, DataDesc, DataIter

__all__ = ["encode_sentences", "BucketSentenceIter"]


def encode_sentences(sentences, vocab=None, invalid_label=-1, invalid_key="\n", start_label=0, unknown_token=None):
    """Encode ``sentences`` (lists of string tokens) as lists of integer ids.

    Without ``vocab`` a vocabulary is built (``invalid_key`` maps to ``invalid_label``, new
    tokens get ids from ``start_label`` on, skipping ``invalid_label``). With ``vocab``, a token
    it lacks is encoded as ``unknown_token``, which is added to the vocabulary the first time it
    is needed; without ``unknown_token`` an unknown token is an error. Returns
    ``(encoded sentences, vocab)``."""
    next_id = start_label
    building = vocab is None
    if building:
        vocab = {invalid_key: invalid_label}

    def new_id():
        nonlocal next_id
        if next_id == invalid_label:
            next_id += 1
        next_id += 1
        return next_id - 1

    encoded = []
    for sentence in sentences:
        ids = []
        for word in sentence:
            if word not in vocab:
                if not building:
                    if unknown_token is None:
                        raise AssertionError("Unknown token %s" % word)
                    word = unknown_token
                if word not in vocab:
                    vocab[word] = new_id()
            ids.append(vocab[word])
        encoded.append(ids)
    return encoded, vocab


class BucketSentenceIter(DataIter):
    """Batches of encoded sentences for a language model, each batch drawn from one bucket (a
    padded length): a sentence goes to the smallest bucket that holds it, padded with
    ``invalid_label``, and its label is the sentence shifted by one step. Sentences longer than
    the largest bucket are dropped. Without ``buckets``, every length shared by at least
    ``batch_size`` sentences is a bucket. ``layout`` 'NT' gives (batch, time) arrays, 'TN'
    (time, batch)."""

    def __init__(self, sentences, batch_size, buckets=None, invalid_label=-1, data_name="data",
                 label_name="softmax_label", dtype="float32", layout="NT"):
        super().__init__(batch_size)
        if not buckets:
            counts = np.bincount([len(s) for s in sentences])
            buckets = [length for length, count in enumerate(counts) if count >= batch_size]
        buckets = sorted(buckets)
        if not buckets:
            raise ValueError("BucketSentenceIter: no bucket (no sentence length is shared by %d sentences)"
                             % batch_size)

        per_bucket = [[] for _ in buckets]
        discarded = 0
        for sentence in sentences:
            index = bisect.bisect_left(buckets, len(sentence))
            if index == len(buckets):
                discarded += 1
                continue
            padded = np.full((buckets[index],), invalid_label, dtype=dtype)
            padded[:len(sentence)] = sentence
            per_bucket[index].append(padded)
        if discarded:
            print("WARNING: discarded %d sentences longer than the largest bucket." % discarded)
        self.data = [np.asarray(rows, dtype=dtype).reshape(len(rows), length)
                     for rows, length in zip(per_bucket, buckets)]

        self.batch_size = batch_size
        self.buckets = buckets
        self.data_name = data_name
        self.label_name = label_name
        self.dtype = dtype
        self.invalid_label = invalid_label
        self.nddata = []
        self.ndlabel = []
        self.major_axis = layout.find("N")
        self.layout = layout
        self.default_bucket_key = max(buckets)
        if self.major_axis == 0:
            shape = (batch_size, self.default_bucket_key)
        elif self.major_axis == 1:
            shape = (self.default_bucket_key, batch_size)
        else:
            raise ValueError("Invalid layout %s: Must by NT (batch major) or TN (time major)" % layout)
        self.provide_data = [DataDesc(data_name, shape, dtype, layout=layout)]
        self.provide_label = [DataDesc(label_name, shape, dtype, layout=layout)]

        # (bucket, first row) of every full batch.
        self.idx = [(i, start) for i, rows in enumerate(self.data)
                    for start in range(0, len(rows) - batch_size + 1, batch_size)]
        self.curr_idx = 0
        self.reset()

    def reset(self):
        """Shuffle the batches and the sentences within each bucket."""
        self.curr_idx = 0
        random.shuffle(self.idx)
        for rows in self.data:
            np.random.shuffle(rows)
        self.nddata = []
        self.ndlabel = []
        for rows in self.data:
            label = np.empty_like(rows)
            label[:, :-1] = rows[:, 1:]
            label[:, -1] = self.invalid_label
            self.nddata.append(ndarray.array(rows, dtype=self.dtype))
            self.ndlabel.append(ndarray.array(label, dtype=self.dtype))

    def next(self):
        if self.curr_idx == len(self.idx):
            raise StopIteration
        bucket, start = self.idx[self.curr_idx]
        self.curr_idx += 1
        data = self.nddata[bucket][start:start + self.batch_size]
        label = self.ndlabel[bucket][start:start + self.batch_size]
        if self.major_axis == 1:
            data, label = data.T, label.T
        return DataBatch([data], [label], bucket_key=self.buckets[bucket],
                         provide_data=[DataDesc(self.data_name, data.shape, self.dtype, layout=self.layout)],
                         provide_label=[DataDesc(self.label_name, label.shape, self.dtype, layout=self.layout)])
