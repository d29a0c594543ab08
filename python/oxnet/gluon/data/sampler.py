"""Samplers: the order in which a DataLoader visits a dataset."""

import numpy as np


class Sampler:
    def __iter__(self):
        raise NotImplementedError

    def __len__(self):
        raise NotImplementedError


class SequentialSampler(Sampler):
    def __init__(self, length, start=0):
        self._length = length
        self._start = start

    def __iter__(self):
        return iter(range(self._start, self._start + self._length))

    def __len__(self):
        return self._length


class RandomSampler(Sampler):
    """A fresh permutation per epoch, drawn from NumPy's global generator."""

    def __init__(self, length):
        self._length = length

    def __iter__(self):
        indices = np.arange(self._length)
        np.random.shuffle(indices)
        return iter(indices.tolist())

    def __len__(self):
        return self._length


class SplitSampler(Sampler):
    """Part ``part_index`` of ``num_parts`` equal, contiguous parts of ``range(length)``, for
    data-parallel training: rank r of N reads ``SplitSampler(len(dataset), N, r)``. Every part
    has ``length // num_parts`` indices (the remainder is left out, so that all workers run the
    same number of steps); ``shuffle`` visits the part in a fresh order each epoch (NumPy's
    global generator)."""

    def __init__(self, length, num_parts=1, part_index=0, shuffle=False):
        if num_parts < 1 or not 0 <= part_index < num_parts:
            raise ValueError("part_index must be in [0, num_parts), got part_index=%d, num_parts=%d"
                             % (part_index, num_parts))
        self._part_length = length // num_parts
        self._start = self._part_length * part_index
        self._shuffle = shuffle

    def __iter__(self):
        indices = np.arange(self._start, self._start + self._part_length)
        if self._shuffle:
            np.random.shuffle(indices)
        return iter(indices.tolist())

    def __len__(self):
        return self._part_length


class FilterSampler(Sampler):
    def __init__(self, fn, dataset):
        self._fn = fn
        self._dataset = dataset
        self._indices = [i for i, sample in enumerate(dataset) if fn(sample)]

    def __iter__(self):
        return iter(self._indices)

    def __len__(self):
        return len(self._indices)


class BatchSampler(Sampler):
    """Groups another sampler's indices into batches; ``last_batch`` is 'keep', 'discard' or
    'rollover' (the remainder starts the next epoch)."""

    def __init__(self, sampler, batch_size, last_batch="keep"):
        if last_batch not in ("keep", "discard", "rollover"):
            raise ValueError("last_batch must be one of 'keep', 'discard', or 'rollover', but got %s" % last_batch)
        self._sampler = sampler
        self._batch_size = batch_size
        self._last_batch = last_batch
        self._prev = []

    def __iter__(self):
        batch, self._prev = self._prev, []
        for i in self._sampler:
            batch.append(i)
            if len(batch) == self._batch_size:
                yield batch
                batch = []
        if batch:
            if self._last_batch == "keep":
                yield batch
            elif self._last_batch == "rollover":
                self._prev = batch

    def __len__(self):
        if self._last_batch == "keep":
            return (len(self._sampler) + self._batch_size - 1) // self._batch_size
        if self._last_batch == "discard":
            return len(self._sampler) // self._batch_size
        return (len(self._prev) + len(self._sampler)) // self._batch_size
