"""Distributed kvstore benchmarks, run under MPI (figures in benches/RESULTS.md):

    python -m oxnet.launch -n 2 benches/bench_kvstore.py allreduce [--sizes-mb 1,4,16,64,256]
    python -m oxnet.launch -n 2 benches/bench_kvstore.py overlap   # then with -n 1 for the baseline

allreduce: bus throughput of summing one float32 tensor over the ranks, side by side on the same
buffer: mpi4py's own ``Allreduce`` (in place), the 'horovod' store's ``pushpull`` (in place on the
array) and the 'dist_sync' store's ``pushpull`` (which also keeps the sum in the store).

overlap: training step of an MLP with about 20 M parameters on a fixed per-rank batch, with the
time split into forward+backward alone (no store) and the whole step (with dist_sync).
"""

import argparse
import time

import numpy as np

import oxnet as mx
from oxnet import autograd, gluon


def timed(fn, repeat):
    fn()  # warm-up: buffers, fusion buffer, engine threads
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def interleaved(fns, repeat):
    """Best time of each of ``fns``, run in turn ``repeat`` times, so that a busy moment of the
    machine does not fall on one of them only."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def bench_allreduce(sizes_mb, repeat):
    from mpi4py import MPI

    kv_hvd = mx.kv.create("horovod")
    kv_sync = mx.kv.create("dist_sync")
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    if rank == 0:
        print("allreduce of float32 on %d ranks (best of %d), GB/s of tensor per second" % (n, repeat))
        print("%8s %12s %12s %12s %10s %10s" % ("MB", "mpi4py", "horovod", "dist_sync", "hvd/mpi", "sync/mpi"))
    for size_mb in sizes_mb:
        count = size_mb * 1024 * 1024 // 4
        host = np.ones(count, dtype=np.float32)
        array = mx.nd.ones((count,))
        kv_sync.init(size_mb, mx.nd.zeros((count,)))

        def raw():
            comm.Barrier()
            comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)

        def horovod():
            comm.Barrier()
            kv_hvd.pushpull(size_mb, array)
            array.wait_to_read()

        def dist_sync():
            comm.Barrier()
            kv_sync.pushpull(size_mb, array)
            array.wait_to_read()

        times = interleaved([raw, horovod, dist_sync], repeat)
        if rank == 0:
            rates = [size_mb / 1024 / t for t in times]
            print("%8d %12.2f %12.2f %12.2f %9.0f%% %9.0f%%"
                  % (size_mb, rates[0], rates[1], rates[2], 100 * rates[1] / rates[0], 100 * rates[2] / rates[0]))


def bench_overlap(batch, steps):
    kv = mx.kv.create("dist_sync")
    net = gluon.nn.HybridSequential()
    # 1024*4096 + 4096*4096 + 4096*10 + biases: about 20.9 M parameters.
    net.add(gluon.nn.Dense(4096, activation="relu", in_units=1024),
            gluon.nn.Dense(4096, activation="relu", in_units=4096), gluon.nn.Dense(10, in_units=4096))
    mx.random.seed(0)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x = mx.nd.random.uniform(shape=(batch, 1024))
    y = mx.nd.array(np.random.RandomState(kv.rank).randint(0, 10, batch))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=kv,
                            update_on_kvstore=False)

    def compute_only():
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        mx.nd.waitall()

    def full_step():
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(batch * kv.num_workers)
        mx.nd.waitall()

    full_step()
    params = sum(int(np.prod(p.shape)) for p in net.collect_params().values())
    kv.barrier()
    compute = timed(compute_only, steps)
    kv.barrier()
    step = timed(full_step, steps)
    if kv.rank == 0:
        print("MLP %.1f M parameters, per-rank batch %d, %d rank(s): forward+backward %.1f ms, "
              "step with allreduce and update %.1f ms (communication and update not hidden: %.1f ms)"
              % (params / 1e6, batch, kv.num_workers, compute * 1e3, step * 1e3, (step - compute) * 1e3))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["allreduce", "overlap"])
    parser.add_argument("--sizes-mb", default="1,4,16,64,256")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    if args.what == "allreduce":
        bench_allreduce([int(s) for s in args.sizes_mb.split(",")], args.repeat)
    else:
        bench_overlap(args.batch, args.repeat)


if __name__ == "__main__":
    main()
