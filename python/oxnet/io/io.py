"""Data iterators (MXNet's ``mxnet.io``): batches of NDArrays for ``Module.fit`` and friends."""

import threading
from collections import namedtuple

import numpy as np

from ..base import mx_real_t, MXNetError
from ..ndarray import NDArray, array, concat, tile
from .utils import _init_data, _getdata_by_idx, _slice_along_batch_axis


class DataDesc(namedtuple("DataDesc", ["name", "shape"])):
    """Name and shape of one input, with its ``dtype`` and ``layout`` (the axis letters;
    ``N`` marks the batch axis)."""

    def __new__(cls, name, shape, dtype=mx_real_t, layout="NCHW"):
        desc = super(DataDesc, cls).__new__(cls, name, shape)
        desc.dtype = dtype
        desc.layout = layout
        return desc

    def __repr__(self):
        return "DataDesc[%s,%s,%s,%s]" % (self.name, self.shape, self.dtype, self.layout)

    @staticmethod
    def get_batch_axis(layout):
        """The batch axis of ``layout`` (0 when no layout is given, -1 when it has no ``N``)."""
        if layout is None:
            return 0
        return layout.find("N")

    @staticmethod
    def get_list(shapes, types):
        """DataDescs from (name, shape) pairs and, optionally, (name, dtype) pairs."""
        if types is not None:
            type_dict = dict(types)
            return [DataDesc(x[0], x[1], type_dict[x[0]]) for x in shapes]
        return [DataDesc(x[0], x[1]) for x in shapes]


class DataBatch:
    """One batch: lists of data and label arrays, the number of padding examples at its end,
    and optionally the bucket key and the descriptions of its inputs."""

    def __init__(self, data, label=None, pad=None, index=None, bucket_key=None, provide_data=None,
                 provide_label=None):
        if data is not None:
            assert isinstance(data, (list, tuple)), "Data must be list of NDArrays"
        if label is not None:
            assert isinstance(label, (list, tuple)), "Label must be list of NDArrays"
        self.data = data
        self.label = label
        self.pad = pad
        self.index = index
        self.bucket_key = bucket_key
        self.provide_data = provide_data
        self.provide_label = provide_label

    def __str__(self):
        data_shapes = [d.shape for d in self.data]
        label_shapes = [l.shape for l in self.label] if self.label else None
        return "{}: data shapes: {} label shapes: {}".format(self.__class__.__name__, data_shapes, label_shapes)


class DataIter:
    """Base of the data iterators: ``next`` returns a DataBatch built from ``iter_next``,
    ``getdata``, ``getlabel``, ``getpad`` and ``getindex``, and raises StopIteration at the end."""

    def __init__(self, batch_size=0):
        self.batch_size = batch_size

    def __iter__(self):
        return self

    def reset(self):
        """Go back to the beginning of the data."""

    def next(self):
        if self.iter_next():
            return DataBatch(data=self.getdata(), label=self.getlabel(), pad=self.getpad(), index=self.getindex())
        raise StopIteration

    def __next__(self):
        return self.next()

    def iter_next(self):
        """Move to the next batch; whether there was one."""
        raise NotImplementedError()

    def getdata(self):
        """The data arrays of the current batch."""
        raise NotImplementedError()

    def getlabel(self):
        """The label arrays of the current batch."""
        raise NotImplementedError()

    def getindex(self):
        """The indices of the current batch's examples (None when unknown)."""
        return None

    def getpad(self):
        """The number of padding examples at the end of the current batch."""
        raise NotImplementedError()


class ResizeIter(DataIter):
    """``data_iter`` cut or repeated to ``size`` batches per epoch (it is restarted when it
    runs out); ``reset_internal`` also resets it on ``reset``."""

    def __init__(self, data_iter, size, reset_internal=True):
        super(ResizeIter, self).__init__()
        self.data_iter = data_iter
        self.size = size
        self.reset_internal = reset_internal
        self.cur = 0
        self.current_batch = None
        self.provide_data = data_iter.provide_data
        self.provide_label = data_iter.provide_label
        self.batch_size = data_iter.batch_size
        if hasattr(data_iter, "default_bucket_key"):
            self.default_bucket_key = data_iter.default_bucket_key

    def reset(self):
        self.cur = 0
        if self.reset_internal:
            self.data_iter.reset()

    def iter_next(self):
        if self.cur == self.size:
            return False
        try:
            self.current_batch = self.data_iter.next()
        except StopIteration:
            self.data_iter.reset()
            self.current_batch = self.data_iter.next()
        self.cur += 1
        return True

    def getdata(self):
        return self.current_batch.data

    def getlabel(self):
        return self.current_batch.label

    def getindex(self):
        return self.current_batch.index

    def getpad(self):
        return self.current_batch.pad


def _renamed(descs, renames):
    return [DataDesc(renames[x.name], x.shape, x.dtype) if isinstance(x, DataDesc) else DataDesc(*x) for x in descs]


class PrefetchingIter(DataIter):
    """Reads the next batch of each of ``iters`` on its own thread while the current one is
    used; the batches of all iterators are joined into one. ``rename_data`` /
    ``rename_label`` (one {old: new} dict per iterator) rename the inputs."""

    def __init__(self, iters, rename_data=None, rename_label=None):
        super(PrefetchingIter, self).__init__()
        if not isinstance(iters, list):
            iters = [iters]
        assert len(iters) > 0
        self.n_iter = len(iters)
        self.iters = iters
        self.rename_data = rename_data
        self.rename_label = rename_label
        self.batch_size = self.provide_data[0][1][0]
        self.data_ready = [threading.Event() for _ in range(self.n_iter)]
        self.data_taken = [threading.Event() for _ in range(self.n_iter)]
        for event in self.data_taken:
            event.set()
        self.started = True
        self.current_batch = None
        self.next_batch = [None] * self.n_iter
        self.prefetch_threads = [threading.Thread(target=self._prefetch, args=(i,), daemon=True)
                                 for i in range(self.n_iter)]
        for thread in self.prefetch_threads:
            thread.start()

    def _prefetch(self, i):
        while True:
            self.data_taken[i].wait()
            if not self.started:
                break
            try:
                self.next_batch[i] = self.iters[i].next()
            except StopIteration:
                self.next_batch[i] = None
            self.data_taken[i].clear()
            self.data_ready[i].set()

    def __del__(self):
        self.started = False
        for event in self.data_taken:
            event.set()
        for thread in self.prefetch_threads:
            thread.join()

    @property
    def provide_data(self):
        if self.rename_data is None:
            return sum([i.provide_data for i in self.iters], [])
        return sum([_renamed(i.provide_data, r) for r, i in zip(self.rename_data, self.iters)], [])

    @property
    def provide_label(self):
        if self.rename_label is None:
            return sum([i.provide_label for i in self.iters], [])
        return sum([_renamed(i.provide_label, r) for r, i in zip(self.rename_label, self.iters)], [])

    def reset(self):
        for event in self.data_ready:
            event.wait()
        for it in self.iters:
            it.reset()
        for event in self.data_ready:
            event.clear()
        for event in self.data_taken:
            event.set()

    def iter_next(self):
        for event in self.data_ready:
            event.wait()
        if self.next_batch[0] is None:
            for batch in self.next_batch:
                assert batch is None, "Number of entry mismatches between iterators"
            return False
        for batch in self.next_batch:
            assert batch.pad == self.next_batch[0].pad, "Number of entry mismatches between iterators"
        self.current_batch = DataBatch(sum([batch.data for batch in self.next_batch], []),
                                       sum([batch.label for batch in self.next_batch], []),
                                       self.next_batch[0].pad, self.next_batch[0].index,
                                       provide_data=self.provide_data, provide_label=self.provide_label)
        for event in self.data_ready:
            event.clear()
        for event in self.data_taken:
            event.set()
        return True

    def next(self):
        if self.iter_next():
            return self.current_batch
        raise StopIteration

    def getdata(self):
        return self.current_batch.data

    def getlabel(self):
        return self.current_batch.label

    def getindex(self):
        return self.current_batch.index

    def getpad(self):
        return self.current_batch.pad


class NDArrayIter(DataIter):
    """Batches of in-memory arrays (NDArray, numpy or h5py datasets; one array, a list or a
    dict of name -> array, for the data and for the labels).

    ``last_batch_handle`` says what happens to the examples left over at the end:
    'pad' fills the last batch with examples from the beginning (``pad`` counts them),
    'discard' drops them, 'roll_over' keeps them and puts them at the front of the first
    batch of the next epoch."""

    def __init__(self, data, label=None, batch_size=1, shuffle=False, last_batch_handle="pad", data_name="data",
                 label_name="softmax_label", layout="NCHW"):
        super(NDArrayIter, self).__init__(batch_size)
        if last_batch_handle not in ("pad", "discard", "roll_over"):
            raise ValueError("last_batch_handle must be 'pad', 'discard' or 'roll_over', got %r" % last_batch_handle)
        self.data = _init_data(data, allow_empty=False, default_name=data_name)
        self.label = _init_data(label, allow_empty=True, default_name=label_name)
        self.idx = np.arange(self.data[0][1].shape[0])
        self.shuffle = shuffle
        self.last_batch_handle = last_batch_handle
        self.batch_size = batch_size
        self.cursor = -self.batch_size
        self.num_data = self.idx.shape[0]
        self.layout = layout
        # The partial batch at the end of an epoch, kept for the first batch of the next
        # epoch under 'roll_over'.
        self._cache_data = None
        self._cache_label = None
        self.reset()
        self.data_list = [x[1] for x in self.data] + [x[1] for x in self.label]
        self.num_source = len(self.data_list)

    def _descs(self, sources):
        batch_axis = self.layout.find("N")
        return [DataDesc(name, tuple(list(v.shape[:batch_axis]) + [self.batch_size] + list(v.shape[batch_axis + 1:])),
                         v.dtype, layout=self.layout)
                for name, v in sources]

    @property
    def provide_data(self):
        """DataDescs of the data batches."""
        return self._descs(self.data)

    @property
    def provide_label(self):
        """DataDescs of the label batches."""
        return self._descs(self.label)

    def hard_reset(self):
        """Back to the beginning, dropping any rolled-over examples."""
        if self.shuffle:
            self._shuffle_data()
        self.cursor = -self.batch_size
        self._cache_data = None
        self._cache_label = None

    def reset(self):
        if self.shuffle:
            self._shuffle_data()
        if self.last_batch_handle == "roll_over" and self.num_data - self.batch_size < self.cursor < self.num_data:
            # A negative cursor: the next batch starts with the cached leftover examples.
            self.cursor = self.cursor - self.num_data - self.batch_size
        else:
            self.cursor = -self.batch_size

    def iter_next(self):
        self.cursor += self.batch_size
        return self.cursor < self.num_data

    def next(self):
        if not self.iter_next():
            raise StopIteration
        data = self.getdata()
        label = self.getlabel()
        if data[0].shape[self.layout.find("N")] != self.batch_size:
            # Only 'roll_over' and 'discard' produce a short batch: keep it for the next epoch.
            self._cache_data = data
            self._cache_label = label
            raise StopIteration
        return DataBatch(data=data, label=label, pad=self.getpad(), index=None)

    def _getdata(self, data_source, start=None, end=None):
        assert start is not None or end is not None, "should at least specify start or end"
        start = start if start is not None else 0
        if end is None:
            end = data_source[0][1].shape[0] if data_source else 0
        window = slice(start, end)
        batch_axis = self.layout.find("N")
        result = []
        for _, source in data_source:
            if isinstance(source, (np.ndarray, NDArray)):
                result.append(_slice_along_batch_axis(source, window, batch_axis))
            else:
                # An HDF5 dataset reads only increasing indices: read them sorted, then restore
                # the iteration order.
                indices = list(self.idx[window])
                ordered = sorted(indices)
                result.append(array(source[ordered][[indices.index(i) for i in ordered]]))
        return result

    def _concat(self, first_data, second_data):
        if not first_data or not second_data:
            return first_data if first_data else second_data
        assert len(first_data) == len(second_data), "data source should contain the same size"
        return [concat(a, b, dim=self.layout.find("N")) for a, b in zip(first_data, second_data)]

    def _tile(self, data, repeats):
        result = []
        for datum in data:
            reps = [1] * len(datum.shape)
            reps[0] = repeats
            result.append(tile(datum, reps=tuple(reps)))
        return result

    def _batchify(self, data_source):
        assert self.cursor < self.num_data, "DataIter needs reset."
        if self.last_batch_handle == "roll_over" and -self.batch_size < self.cursor < 0:
            assert self._cache_data is not None or self._cache_label is not None, \
                "next epoch should have cached data"
            # Data is batchified before the label: the first call takes the cached data, the
            # second the cached label.
            cached = self._cache_data if self._cache_data is not None else self._cache_label
            second_data = self._getdata(data_source, end=self.cursor + self.batch_size)
            if self._cache_data is not None:
                self._cache_data = None
            else:
                self._cache_label = None
            return self._concat(cached, second_data)
        if self.last_batch_handle == "pad" and self.cursor + self.batch_size > self.num_data:
            pad = self.batch_size - self.num_data + self.cursor
            first_data = self._getdata(data_source, start=self.cursor)
            if pad > self.num_data:
                # The batch is larger than the whole data set: repeat it as often as needed.
                second_data = self._tile(self._getdata(data_source, end=self.num_data), pad // self.num_data)
                if pad % self.num_data != 0:
                    second_data = self._concat(second_data, self._getdata(data_source, end=pad % self.num_data))
            else:
                second_data = self._getdata(data_source, end=pad)
            return self._concat(first_data, second_data)
        end_idx = min(self.cursor + self.batch_size, self.num_data)
        return self._getdata(data_source, self.cursor, end_idx)

    def getdata(self):
        return self._batchify(self.data)

    def getlabel(self):
        return self._batchify(self.label)

    def getpad(self):
        if self.last_batch_handle == "pad" and self.cursor + self.batch_size > self.num_data:
            return self.cursor + self.batch_size - self.num_data
        if self.last_batch_handle == "roll_over" and -self.batch_size < self.cursor < 0:
            return -self.cursor
        return 0

    def _shuffle_data(self):
        np.random.shuffle(self.idx)
        self.data = _getdata_by_idx(self.data, self.idx)
        self.label = _getdata_by_idx(self.label, self.idx)


class CSVIter(DataIter):
    """Batches read from CSV files (one example per line, comma separated): ``data_csv`` rows
    reshaped to ``data_shape``; labels from ``label_csv`` (shape ``label_shape``) or zeros.

    With ``round_batch`` (the default) the last batch is completed with examples from the
    beginning (``pad`` counts them) and the next epoch starts after those; without it the
    last batch is filled with zeros."""

    def __init__(self, data_csv, data_shape, label_csv=None, label_shape=(1,), batch_size=1, round_batch=True,
                 dtype="float32", data_name="data", label_name="softmax_label", prefetch_buffer=None, **kwargs):
        super(CSVIter, self).__init__(batch_size)
        # prefetch_buffer is accepted for MXNet compatibility: the whole file is read at once.
        del prefetch_buffer
        if kwargs:
            raise MXNetError("CSVIter: unknown arguments %s" % ", ".join(sorted(kwargs)))
        self.dtype = np.dtype(dtype)
        self._data = self._read(data_csv, data_shape, "data_csv")
        if label_csv is not None:
            self._label = self._read(label_csv, label_shape, "label_csv")
            if len(self._label) != len(self._data):
                raise MXNetError("CSVIter: %s has %d rows but %s has %d" % (label_csv, len(self._label), data_csv,
                                                                          len(self._data)))
        else:
            self._label = np.zeros((len(self._data),) + tuple(label_shape), dtype=self.dtype)
        if len(self._data) == 0:
            raise MXNetError("CSVIter: %s holds no rows" % data_csv)
        self.round_batch = bool(round_batch)
        self.provide_data = [DataDesc(data_name, (batch_size,) + tuple(data_shape), self.dtype)]
        self.provide_label = [DataDesc(label_name, (batch_size,) + tuple(label_shape), self.dtype)]
        self._start = 0
        self._overflow = 0
        self._cursor = None
        self._batch = None

    def _read(self, path, shape, what):
        # Parsed straight into the target dtype, so int64 values keep every digit.
        rows = np.loadtxt(path, delimiter=",", dtype=self.dtype, ndmin=2)
        size = int(np.prod(shape))
        if rows.shape[1] != size:
            raise MXNetError("CSVIter: each row of %s (%s) must hold %d values for shape %s, found %d"
                             % (what, path, size, tuple(shape), rows.shape[1]))
        return rows.reshape((rows.shape[0],) + tuple(shape))

    def reset(self):
        # After a rounded last batch the examples used to complete it are not repeated at
        # the start of the next epoch (MXNet's round_batch).
        self._start = self._overflow
        self._overflow = 0
        self._cursor = None
        self._batch = None

    def iter_next(self):
        cursor = self._start if self._cursor is None else self._cursor
        num = len(self._data)
        if cursor >= num:
            return False
        end = cursor + self.batch_size
        indices = np.arange(cursor, min(end, num))
        pad = end - num if end > num else 0
        data, label = self._data[indices], self._label[indices]
        if pad:
            if self.round_batch:
                wrapped = np.arange(pad) % num
                data = np.concatenate([data, self._data[wrapped]])
                label = np.concatenate([label, self._label[wrapped]])
                self._overflow = pad % num
            else:
                data = np.concatenate([data, np.zeros((pad,) + data.shape[1:], dtype=self.dtype)])
                label = np.concatenate([label, np.zeros((pad,) + label.shape[1:], dtype=self.dtype)])
        self._cursor = end
        self._batch = (array(data, dtype=self.dtype), array(label, dtype=self.dtype), pad)
        return True

    def next(self):
        if self.iter_next():
            return DataBatch(data=[self.getdata()], label=[self.getlabel()], pad=self.getpad(), index=None)
        raise StopIteration

    def getdata(self):
        return self._batch[0]

    def getlabel(self):
        return self._batch[1]

    def getpad(self):
        return self._batch[2]
