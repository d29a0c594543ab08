"""Side-by-side benchmark of the tensor-operator issue: element-wise, broadcast, reductions,
transpose and gather throughput, and autograd's per-op costs, for oxnet, MXNet 1.9.1 and PyTorch.

    python benches/bench_tensor_ops.py --framework oxnet|mxnet|torch [--quick]

Prints one JSON line of medians; `benches/run_side_by_side.sh benches/bench_tensor_ops.py` runs all
three frameworks and prints the table. Bandwidth counts each array read or written once.
"""
import numpy as np

from bench_foundation import bench_main, timeit

N_BIG = 1 << 24
SIDE = 4096
N_SMALL = 20000


def mx_like(mx, quick):
    nd, sync, autograd = mx.nd, mx.nd.waitall, mx.autograd
    reps = 3 if quick else 9
    res = {}
    A = nd.random.uniform(shape=(N_BIG,))
    M = A.reshape((SIDE, SIDE))
    row = nd.random.uniform(shape=(1, SIDE))
    rows = nd.array(np.random.RandomState(0).randint(0, SIDE, size=SIDE))
    sync()
    gb = lambda arrays, fn: arrays * 4 * N_BIG / timeit(fn, sync, reps) / 1e9  # noqa: E731
    res["exp16M_GBps"] = gb(2, lambda: nd.exp(A))
    res["relu16M_GBps"] = gb(2, lambda: nd.relu(A))
    res["mul_scalar16M_GBps"] = gb(2, lambda: A * 2.0)
    res["broadcast_add_4096x4096_GBps"] = gb(2, lambda: nd.broadcast_add(M, row))
    res["sum16M_GBps"] = gb(1, lambda: nd.sum(A))
    res["sum_axis0_4096x4096_GBps"] = gb(1, lambda: nd.sum(M, axis=0))
    res["sum_axis1_4096x4096_GBps"] = gb(1, lambda: nd.sum(M, axis=1))
    res["mean_axis1_4096x4096_GBps"] = gb(1, lambda: nd.mean(M, axis=1))
    res["max_axis1_4096x4096_GBps"] = gb(1, lambda: nd.max(M, axis=1))
    res["argmax_axis1_4096x4096_GBps"] = gb(1, lambda: nd.argmax(M, axis=1))
    res["transpose_4096x4096_GBps"] = gb(2, lambda: nd.transpose(M))
    res["take_rows_4096x4096_GBps"] = gb(2, lambda: nd.take(M, rows))

    a = nd.random.uniform(shape=(2, 2))
    b = nd.random.uniform(shape=(2, 2))
    a.attach_grad()
    b.attach_grad()
    sync()

    def record_loop():
        with autograd.record():
            for _ in range(N_SMALL):
                a + b
    res["record_add2x2_us_per_op"] = timeit(record_loop, sync, reps, 1) / N_SMALL * 1e6

    def chain_backward():
        with autograd.record():
            x = a
            for _ in range(N_SMALL):
                x = x + b
        x.backward()
    res["chain20k_record_backward_us_per_op"] = timeit(chain_backward, sync, reps, 1) / N_SMALL * 1e6

    def tiny_step():
        for _ in range(N_SMALL // 10):
            with autograd.record():
                c = a * b + a
            c.backward()
    res["record_mul_add_backward_us_per_iter"] = timeit(tiny_step, sync, reps, 1) / (N_SMALL // 10) * 1e6
    return res


def torch_like(torch, quick):
    sync = lambda: None  # noqa: E731 (CPU torch is synchronous)
    reps = 3 if quick else 9
    res = {}
    with torch.no_grad():
        A = torch.rand(N_BIG)
        M = A.reshape(SIDE, SIDE)
        row = torch.rand(1, SIDE)
        rows = torch.from_numpy(np.random.RandomState(0).randint(0, SIDE, size=SIDE))
        gb = lambda arrays, fn: arrays * 4 * N_BIG / timeit(fn, sync, reps) / 1e9  # noqa: E731
        res["exp16M_GBps"] = gb(2, lambda: torch.exp(A))
        res["relu16M_GBps"] = gb(2, lambda: torch.relu(A))
        res["mul_scalar16M_GBps"] = gb(2, lambda: A * 2.0)
        res["broadcast_add_4096x4096_GBps"] = gb(2, lambda: M + row)
        res["sum16M_GBps"] = gb(1, lambda: torch.sum(A))
        res["sum_axis0_4096x4096_GBps"] = gb(1, lambda: torch.sum(M, dim=0))
        res["sum_axis1_4096x4096_GBps"] = gb(1, lambda: torch.sum(M, dim=1))
        res["mean_axis1_4096x4096_GBps"] = gb(1, lambda: torch.mean(M, dim=1))
        res["max_axis1_4096x4096_GBps"] = gb(1, lambda: torch.amax(M, dim=1))
        res["argmax_axis1_4096x4096_GBps"] = gb(1, lambda: torch.argmax(M, dim=1))
        res["transpose_4096x4096_GBps"] = gb(2, lambda: M.t().contiguous())
        res["take_rows_4096x4096_GBps"] = gb(2, lambda: torch.index_select(M, 0, rows))

    a = torch.rand(2, 2, requires_grad=True)
    b = torch.rand(2, 2, requires_grad=True)

    def record_loop():
        for _ in range(N_SMALL):
            a + b
    res["record_add2x2_us_per_op"] = timeit(record_loop, sync, reps, 1) / N_SMALL * 1e6

    def chain_backward():
        x = a
        for _ in range(N_SMALL):
            x = x + b
        x.backward(torch.ones_like(x))
    res["chain20k_record_backward_us_per_op"] = timeit(chain_backward, sync, reps, 1) / N_SMALL * 1e6

    def tiny_step():
        for _ in range(N_SMALL // 10):
            c = a * b + a
            c.backward(torch.ones_like(c))
    res["record_mul_add_backward_us_per_iter"] = timeit(tiny_step, sync, reps, 1) / (N_SMALL // 10) * 1e6
    return res


if __name__ == "__main__":
    bench_main(mx_like, torch_like)
