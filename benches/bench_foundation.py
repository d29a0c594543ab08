"""Side-by-side benchmark of the foundation issue's figures: per-op overhead, a memory-bound add,
a reduction and matmul, for oxnet, MXNet 1.9.1 and PyTorch, plus NumPy's BLAS as the GEMM anchor.

    python benches/bench_foundation.py --framework oxnet|mxnet|torch [--quick]

Prints one JSON line of medians. `benches/run_side_by_side.sh benches/bench_foundation.py` runs all three and writes the table.
"""
import argparse
import importlib
import json
import statistics
import time

import numpy as np

N_SMALL = 20000
N_BIG = 1 << 24


def timeit(fn, sync, reps, warmup=2):
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def mx_like(mx, quick):
    nd, sync = mx.nd, mx.nd.waitall
    reps = 3 if quick else 9
    res = {}
    a = nd.random.uniform(shape=(2, 2))
    b = nd.random.uniform(shape=(2, 2))

    def loop():
        for _ in range(N_SMALL):
            a + b
    res["add2x2_us_per_op"] = timeit(loop, sync, reps, 1) / N_SMALL * 1e6
    A = nd.random.uniform(shape=(N_BIG,))
    B = nd.random.uniform(shape=(N_BIG,))
    C = nd.zeros((N_BIG,))
    sync()
    res["add16M_out_GBps"] = 12 * N_BIG / timeit(lambda: nd.elemwise_add(A, B, out=C), sync, reps) / 1e9
    res["add16M_new_GBps"] = 12 * N_BIG / timeit(lambda: A + B, sync, reps) / 1e9
    res["sum16M_GBps"] = 4 * N_BIG / timeit(lambda: nd.sum(A), sync, reps) / 1e9
    for n in (512, 1024, 2048):
        X = nd.random.uniform(shape=(n, n))
        Y = nd.random.uniform(shape=(n, n))
        sync()
        res["dot%d_GFLOPs" % n] = 2 * n ** 3 / timeit(lambda: nd.dot(X, Y), sync, 3 if quick else {512: 30, 1024: 10, 2048: 5}[n]) / 1e9
    return res


def torch_like(torch, quick):
    torch.set_grad_enabled(False)
    sync = lambda: None  # noqa: E731 (CPU torch is synchronous)
    reps = 3 if quick else 9
    res = {}
    a, b = torch.rand(2, 2), torch.rand(2, 2)

    def loop():
        for _ in range(N_SMALL):
            a + b
    res["add2x2_us_per_op"] = timeit(loop, sync, reps, 1) / N_SMALL * 1e6
    A, B, C = torch.rand(N_BIG), torch.rand(N_BIG), torch.zeros(N_BIG)
    res["add16M_out_GBps"] = 12 * N_BIG / timeit(lambda: torch.add(A, B, out=C), sync, reps) / 1e9
    res["add16M_new_GBps"] = 12 * N_BIG / timeit(lambda: A + B, sync, reps) / 1e9
    res["sum16M_GBps"] = 4 * N_BIG / timeit(lambda: torch.sum(A), sync, reps) / 1e9
    for n in (512, 1024, 2048):
        X, Y = torch.rand(n, n), torch.rand(n, n)
        res["dot%d_GFLOPs" % n] = 2 * n ** 3 / timeit(lambda: torch.mm(X, Y), sync, 3 if quick else {512: 30, 1024: 10, 2048: 5}[n]) / 1e9
    return res


def numpy_anchors(quick):
    res = {}
    A = np.random.rand(N_BIG).astype(np.float32)
    B = np.random.rand(N_BIG).astype(np.float32)
    C = np.empty_like(A)
    res["numpy_add16M_out_GBps"] = 12 * N_BIG / timeit(lambda: np.add(A, B, out=C), lambda: None, 3 if quick else 9) / 1e9
    for n in (1024, 2048):
        X = np.random.rand(n, n).astype(np.float32)
        Y = np.random.rand(n, n).astype(np.float32)
        res["numpy_sgemm%d_GFLOPs" % n] = 2 * n ** 3 / timeit(lambda: X @ Y, lambda: None, 3 if quick else {1024: 10, 2048: 5}[n]) / 1e9
    return res


def bench_main(mx_like, torch_like, anchors=None):
    """Parse --framework/--quick, run the framework's half of a benchmark and print its JSON line."""
    p = argparse.ArgumentParser()
    p.add_argument("--framework", default="oxnet")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    mod = importlib.import_module(args.framework)
    res = torch_like(mod, args.quick) if args.framework == "torch" else mx_like(mod, args.quick)
    if anchors is not None:
        res.update(anchors(args.quick))
    res["framework"] = args.framework
    res["version"] = getattr(mod, "__version__", "?")
    print(json.dumps(res))


if __name__ == "__main__":
    bench_main(mx_like, torch_like, numpy_anchors)
