"""Float32 GEMM throughput: square `dot` products 256..4096 and FullyConnected's skinny shapes
(batch 1..256 times weights of 1k..8k, `x * W^T + b`), two threads, for oxnet, MXNet 1.9.1
(oneDNN) or PyTorch, with NumPy's `x @ W.T` (its BLAS) on the same shapes in the same process.

    python benches/bench_gemm.py --framework oxnet|mxnet|torch [--quick]
    MXV=... TORCHV=... bash benches/run_side_by_side.sh benches/bench_gemm.py

oxnet's row also gives the cores' measured float32 peak (`peak_GFLOPs`: its micro-kernel on cached
panels on both threads at once, so the clock under load) and each of its figures as a percentage of
it (`*_pct_peak`); the other rows' percentages follow from the same peak. Prints one JSON row of
GFLOP/s (median of the timed repeats after a warm-up), with the CPU model and its vector features.
"""

import argparse
import json
import os
import platform
import statistics
import time

THREADS = 2
# Not MXNET_CPU_WORKER_NTHREADS: with it set to 2, MXNet 1.9.1 hung in its first `dot` here
# (its oneDNN kernels take their threads from OMP_NUM_THREADS).
for var in ("OXNET_CPU_WORKER_NTHREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(var, str(THREADS))

import numpy as np  # noqa: E402

SQUARE = [256, 512, 1024, 2048, 4096]
# bfloat16 products (float32 accumulation), against the float32 figures of the same shapes.
BF16_SQUARE = [1024, 2048]
BF16_DENSE = [(256, 4096, 1024)]
# (batch, num_hidden, features): FullyConnected's x (batch x features) times W^T.
SKINNY = [(b, n, f) for b in (1, 16, 64, 256) for (n, f) in ((1024, 1024), (4096, 1024), (1024, 4096), (8192, 2048))]


def cpu_description():
    model, flags = platform.processor(), set()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name") and model in ("", "x86_64"):
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
    return model, [f for f in wanted if f in flags]


def gflops(flops, run, sync, seconds):
    """Median GFLOP/s of timed batches of calls, each batch about `seconds` long."""
    run()
    sync()
    start = time.perf_counter()
    run()
    sync()
    calls = max(1, int(seconds / max(time.perf_counter() - start, 1e-6)))
    rates = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        sync()
        rates.append(flops * calls / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


def cases(quick):
    square = SQUARE[:3] if quick else SQUARE
    skinny = SKINNY[::3] if quick else SKINNY
    return square, skinny


def measure(framework, quick):
    rng = np.random.RandomState(0)
    seconds = 0.05 if quick else 0.25
    square, skinny = cases(quick)
    row = {}
    if framework == "torch":
        import torch
        torch.set_num_threads(THREADS)
        fn = torch.nn.functional

        def dot(a, b, dtype="float32"):
            ta, tb = (torch.from_numpy(v).to(getattr(torch, dtype)) for v in (a, b))
            return (lambda: torch.mm(ta, tb)), (lambda: None)

        def dense(x, w, bias, dtype="float32"):
            tx, tw, tbias = (torch.from_numpy(v).to(getattr(torch, dtype)) for v in (x, w, bias))
            return (lambda: fn.linear(tx, tw, tbias)), (lambda: None)
        context = torch.inference_mode
    else:
        if framework == "mxnet":
            import mxnet as mx
        else:
            import oxnet as mx
        nd = mx.nd

        def dot(a, b, dtype="float32"):
            xa, xb = (nd.array(v).astype(dtype) for v in (a, b))
            return (lambda: nd.dot(xa, xb)), nd.waitall

        def dense(x, w, bias, dtype="float32"):
            xx, xw, xbias = (nd.array(v).astype(dtype) for v in (x, w, bias))
            return (lambda: nd.FullyConnected(xx, xw, xbias, num_hidden=w.shape[0])), nd.waitall

        import contextlib
        context = contextlib.nullcontext
    with context():
        for size in square:
            a, b = rng.rand(size, size).astype(np.float32), rng.rand(size, size).astype(np.float32)
            run, sync = dot(a, b)
            row[f"dot{size}"] = gflops(2 * size ** 3, run, sync, seconds)
            row[f"numpy_dot{size}"] = gflops(2 * size ** 3, lambda: a @ b, lambda: None, seconds)
        for batch, hidden, features in skinny:
            x = rng.rand(batch, features).astype(np.float32)
            w = rng.rand(hidden, features).astype(np.float32)
            bias = rng.rand(hidden).astype(np.float32)
            run, sync = dense(x, w, bias)
            name = f"fc_b{batch}_{hidden}x{features}"
            flops = 2 * batch * hidden * features
            row[name] = gflops(flops, run, sync, seconds)
            row["numpy_" + name] = gflops(flops, lambda: x @ w.T + bias, lambda: None, seconds)
        for size in BF16_SQUARE:
            a, b = rng.rand(size, size).astype(np.float32), rng.rand(size, size).astype(np.float32)
            bf16_case(row, f"bf16_dot{size}", 2 * size ** 3, lambda: dot(a, b, "bfloat16"), seconds)
        for batch, hidden, features in BF16_DENSE:
            x, w = rng.rand(batch, features).astype(np.float32), rng.rand(hidden, features).astype(np.float32)
            bias = rng.rand(hidden).astype(np.float32)
            bf16_case(row, f"bf16_fc_b{batch}_{hidden}x{features}", 2 * batch * hidden * features,
                      lambda: dense(x, w, bias, "bfloat16"), seconds)
    if framework == "oxnet":
        from oxnet import _core
        # Builds from before the probe existed (an older commit's wheel in a before/after run).
        probe = getattr(_core, "cpu_peak_gflops", None)
        peaks = {"": probe(THREADS), "bf16_": probe(THREADS, True)} if probe else {}
        for prefix, peak in peaks.items():
            if not peak:
                continue
            row[prefix + "peak_GFLOPs"] = peak
            for key in [k for k in row if not k.startswith(("numpy_", "peak", "bf16_peak"))]:
                if key.startswith("bf16_") == bool(prefix) and not key.endswith("_pct_peak"):
                    row[key + "_pct_peak"] = 100 * row[key] / peak
    return row


def bf16_case(row, name, flops, make, seconds):
    """A bfloat16 figure, left out where the framework has no bfloat16 product on this CPU."""
    try:
        run, sync = make()
        row[name] = gflops(flops, run, sync, seconds)
    except Exception as error:  # MXNet 1.9.1 builds without bfloat16 kernels raise here
        print(f"# {name}: no bfloat16 product ({type(error).__name__}: {str(error)[:80]})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=["oxnet", "mxnet", "torch"], default="oxnet")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    model, features = cpu_description()
    row = {"framework": args.framework, "cpu": model, "cpu_features": features, "threads": THREADS}
    row.update({k: round(v, 1) for k, v in measure(args.framework, args.quick).items()})
    print(json.dumps(row))


if __name__ == "__main__":
    main()
