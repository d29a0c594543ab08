"""The DataLoader: batches from a dataset, optionally built in worker processes."""

import multiprocessing
from multiprocessing import shared_memory

import numpy as np

from ... import ndarray
from .sampler import BatchSampler, RandomSampler, SequentialSampler


def _as_numpy_batch(data):
    """Stack samples into NumPy arrays (tuples of fields stay tuples)."""
    first = data[0]
    if isinstance(first, tuple):
        return tuple(_as_numpy_batch(list(field)) for field in zip(*data))
    if isinstance(first, ndarray.NDArray):
        return np.stack([d.asnumpy() for d in data])
    return np.asarray(data)


def _to_ndarray(batch):
    if isinstance(batch, tuple):
        return [_to_ndarray(b) for b in batch]
    if isinstance(batch, _SharedArray):
        return batch.to_ndarray()
    return ndarray.array(batch, dtype=batch.dtype)


def default_batchify_fn(data):
    """Stack a list of samples into a batch (NDArrays; tuples of fields become lists)."""
    if isinstance(data[0], ndarray.NDArray):
        return ndarray.stack(*data)
    if isinstance(data[0], tuple):
        return [default_batchify_fn(list(field)) for field in zip(*data)]
    data = np.asarray(data)
    return ndarray.array(data, dtype=data.dtype)


_worker_dataset = None


def _worker_init(dataset):
    global _worker_dataset
    _worker_dataset = dataset


class _SharedArray:
    """A NumPy array a worker left in a shared-memory block: only its name, shape and dtype
    travel through the pool's pipe; the parent copies the block into an NDArray and unlinks it."""

    def __init__(self, array):
        block = shared_memory.SharedMemory(create=True, size=array.nbytes)
        np.ndarray(array.shape, array.dtype, buffer=block.buf)[...] = array
        self.name, self.shape, self.dtype = block.name, array.shape, array.dtype
        block.close()

    def to_ndarray(self):
        block = shared_memory.SharedMemory(name=self.name)
        try:
            return ndarray.array(np.ndarray(self.shape, self.dtype, buffer=block.buf), dtype=self.dtype)
        finally:
            block.close()
            block.unlink()


def _share(batch):
    if isinstance(batch, tuple):
        return tuple(_share(b) for b in batch)
    return _SharedArray(batch) if batch.nbytes else batch


def _worker_batch(indices):
    """Runs in a worker process: NumPy only, so no engine threads are needed there."""
    return _share(_as_numpy_batch([_worker_dataset[i] for i in indices]))


class DataLoader:
    """Iterate over ``dataset`` in batches. With ``num_workers > 0`` batches are assembled in
    worker processes (spawned, so they never inherit the engine's threads), handed over in
    shared memory and converted to NDArrays in the main process; the pool is shut down when the
    loader is collected."""

    def __init__(self, dataset, batch_size=None, shuffle=False, sampler=None, last_batch=None, batch_sampler=None,
                 batchify_fn=None, num_workers=0, pin_memory=False, pin_device_id=0, prefetch=None,
                 thread_pool=False, timeout=120):
        self._dataset = dataset
        self._timeout = timeout
        if batch_sampler is None:
            if batch_size is None:
                raise ValueError("batch_size must be specified unless batch_sampler is specified")
            if sampler is None:
                sampler = RandomSampler(len(dataset)) if shuffle else SequentialSampler(len(dataset))
            elif shuffle:
                raise ValueError("shuffle must not be specified if sampler is specified")
            batch_sampler = BatchSampler(sampler, batch_size, last_batch if last_batch else "keep")
        elif batch_size is not None or shuffle or sampler is not None or last_batch is not None:
            raise ValueError("batch_size, shuffle, sampler and last_batch must not be specified if batch_sampler "
                             "is specified.")
        self._batch_sampler = batch_sampler
        self._num_workers = max(0, int(num_workers))
        self._batchify_fn = batchify_fn
        self._prefetch = max(0, int(prefetch) if prefetch is not None else 2 * self._num_workers)
        self._pool = None
        if self._num_workers > 0:
            context = multiprocessing.get_context("spawn")
            self._pool = context.Pool(self._num_workers, initializer=_worker_init, initargs=(dataset,))

    def __len__(self):
        return len(self._batch_sampler)

    def __iter__(self):
        if self._pool is None:
            batchify = self._batchify_fn or default_batchify_fn
            for batch in self._batch_sampler:
                yield batchify([self._dataset[i] for i in batch])
            return
        pending = []
        batches = iter(self._batch_sampler)
        for indices in batches:
            pending.append(self._pool.apply_async(_worker_batch, (indices,)))
            if len(pending) > self._prefetch:
                break
        while pending:
            result = pending.pop(0).get(self._timeout)
            for indices in batches:
                pending.append(self._pool.apply_async(_worker_batch, (indices,)))
                break
            batch = _to_ndarray(result)
            yield self._batchify_fn(batch) if self._batchify_fn else batch

    def close(self):
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __del__(self):
        self.close()
