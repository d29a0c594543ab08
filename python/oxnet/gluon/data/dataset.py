"""Datasets: indexable collections of samples."""

import os
import threading

from ... import ndarray


class Dataset:
    """Anything with ``__getitem__`` and ``__len__``; ``transform`` maps samples lazily."""

    def __getitem__(self, idx):
        raise NotImplementedError

    def __len__(self):
        raise NotImplementedError

    def filter(self, fn):
        return SimpleDataset([self[i] for i in range(len(self)) if fn(self[i])])

    def shard(self, num_shards, index):
        if not 0 <= index < num_shards:
            raise ValueError("Shard index of out bound: %d out of %d" % (index, num_shards))
        length = len(self)
        per, extra = divmod(length, num_shards)
        start = index * per + min(index, extra)
        end = start + per + (1 if index < extra else 0)
        return _SubsetDataset(self, range(start, end))

    def take(self, count):
        if count is None or count > len(self):
            count = len(self)
        return _SubsetDataset(self, range(count))

    def sample(self, sampler):
        return _SubsetDataset(self, list(sampler))

    def transform(self, fn, lazy=True):
        trans = _LazyTransformDataset(self, fn)
        if lazy:
            return trans
        return SimpleDataset([trans[i] for i in range(len(trans))])

    def transform_first(self, fn, lazy=True):
        def first(x, *args):
            return (fn(x),) + args if args else fn(x)
        return self.transform(first, lazy)


class SimpleDataset(Dataset):
    """A dataset around a list (or anything indexable)."""

    def __init__(self, data):
        self._data = data

    def __len__(self):
        return len(self._data)

    def __getitem__(self, idx):
        return self._data[idx]


class _SubsetDataset(Dataset):
    def __init__(self, dataset, indices):
        self._dataset = dataset
        self._indices = list(indices)

    def __len__(self):
        return len(self._indices)

    def __getitem__(self, idx):
        return self._dataset[self._indices[idx]]


class _LazyTransformDataset(Dataset):
    def __init__(self, data, fn):
        self._data = data
        self._fn = fn

    def __len__(self):
        return len(self._data)

    def __getitem__(self, idx):
        item = self._data[idx]
        if isinstance(item, tuple):
            return self._fn(*item)
        return self._fn(item)


class ArrayDataset(Dataset):
    """Samples are tuples of the i-th elements of several equally long arrays."""

    def __init__(self, *args):
        if not args:
            raise AssertionError("Needs at least 1 arrays")
        self._length = len(args[0])
        self._data = []
        for i, data in enumerate(args):
            if len(data) != self._length:
                raise AssertionError("All arrays must have the same length; array[0] has length %d while "
                                     "array[%d] has %d." % (self._length, i + 1, len(data)))
            if isinstance(data, ndarray.NDArray) and len(data.shape) == 1:
                data = data.asnumpy()
            self._data.append(data)

    def __getitem__(self, idx):
        if len(self._data) == 1:
            return self._data[0][idx]
        return tuple(data[idx] for data in self._data)

    def __len__(self):
        return self._length



class RecordFileDataset(Dataset):
    """The records of a RecordIO file, by position (bytes); the index file beside it
    (``name.idx`` for ``name.rec``) gives their order."""

    def __init__(self, filename):
        from ... import recordio
        self.idx_file = os.path.splitext(filename)[0] + ".idx"
        self.filename = filename
        self._record = recordio.MXIndexedRecordIO(self.idx_file, self.filename, "r")
        # Seek-then-read on the one shared file must not interleave between DataLoader threads.
        self._read_lock = threading.Lock()

    def __getitem__(self, idx):
        with self._read_lock:
            return self._record.read_idx(self._record.keys[idx])

    def __len__(self):
        return len(self._record.keys)

    def __getstate__(self):
        state = dict(self.__dict__)
        del state["_read_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__ = state
        self._read_lock = threading.Lock()
