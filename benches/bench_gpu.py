"""GPU figures of issue 31, oxnet and PyTorch side by side on one device in one run:

- GEMM 4096 x 4096 x 4096 in float32 (full precision), TF32 and bfloat16: TFLOP/s;
- an add of two 256M-element float32 arrays: GB/s (bytes read and written), against the
  device's peak bandwidth when given (--peak-gbs);
- an MLP training step (Dense 4096-4096-4096-10 with ReLU, batch 1024, L2 loss, SGD): samples/s.

    python benches/bench_gpu.py [--repeat N] [--peak-gbs 4800]

TF32 is a process-wide switch in both frameworks (OXNET_CUDA_ALLOW_TF32=1,
torch.backends.cuda.matmul.allow_tf32), so each GEMM case runs in its own process. Prints one
JSON row per case: the median of `repeat` timed runs of `inner` calls each, after warm-up.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

N_GEMM = 4096
N_ADD = 256 << 20
INNER = 10


def median_seconds(run, sync, repeat):
    run()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(INNER):
            run()
        sync()
        times.append((time.perf_counter() - start) / INNER)
    return statistics.median(times)


def oxnet_case(case, repeat):
    import oxnet as mx

    g = mx.gpu(0)
    if case.startswith("gemm"):
        dtype = "bfloat16" if case == "gemm_bf16" else "float32"
        a = mx.nd.random.uniform(-1, 1, shape=(N_GEMM, N_GEMM), ctx=g).astype(dtype)
        b = mx.nd.random.uniform(-1, 1, shape=(N_GEMM, N_GEMM), ctx=g).astype(dtype)
        return median_seconds(lambda: mx.nd.dot(a, b), mx.nd.waitall, repeat)
    if case == "add":
        a = mx.nd.ones((N_ADD,), ctx=g)
        b = mx.nd.ones((N_ADD,), ctx=g)
        return median_seconds(lambda: a + b, mx.nd.waitall, repeat)
    if case == "mlp_step":
        from oxnet import autograd, gluon

        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(4096, activation="relu"), gluon.nn.Dense(4096, activation="relu"), gluon.nn.Dense(10))
        net.initialize(ctx=g)
        net.hybridize()
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
        loss_fn = gluon.loss.L2Loss()
        x = mx.nd.random.uniform(shape=(1024, 4096), ctx=g)
        y = mx.nd.random.uniform(shape=(1024, 10), ctx=g)

        def step():
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(1024)

        return median_seconds(step, mx.nd.waitall, repeat)
    raise ValueError(case)


def torch_case(case, repeat):
    import torch

    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    torch.backends.cuda.matmul.allow_tf32 = case == "gemm_tf32"
    if case.startswith("gemm"):
        dtype = torch.bfloat16 if case == "gemm_bf16" else torch.float32
        a = (torch.rand(N_GEMM, N_GEMM, device=dev) * 2 - 1).to(dtype)
        b = (torch.rand(N_GEMM, N_GEMM, device=dev) * 2 - 1).to(dtype)
        return median_seconds(lambda: a @ b, sync, repeat)
    if case == "add":
        a = torch.ones(N_ADD, device=dev)
        b = torch.ones(N_ADD, device=dev)
        return median_seconds(lambda: a + b, sync, repeat)
    if case == "mlp_step":
        net = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                  torch.nn.Linear(4096, 10)).to(dev)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        x = torch.rand(1024, 4096, device=dev)
        y = torch.rand(1024, 10, device=dev)

        def loss_fn(out, target):  # Gluon's L2Loss: mean over features of (out - target)^2 / 2
            return ((out - target) ** 2 / 2).mean(dim=1)

        def step():
            opt.zero_grad(set_to_none=True)
            loss_fn(net(x), y).sum().backward()
            opt.step()

        return median_seconds(step, sync, repeat)
    raise ValueError(case)


def figure(case, seconds):
    if case.startswith("gemm"):
        return {"tflops": 2 * N_GEMM ** 3 / seconds / 1e12}
    if case == "add":
        return {"gbs": 3 * 4 * N_ADD / seconds / 1e9}
    return {"samples_per_s": 1024 / seconds}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--peak-gbs", type=float, default=None)
    parser.add_argument("--one", nargs=2, metavar=("FRAMEWORK", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        framework, case = args.one
        seconds = (oxnet_case if framework == "oxnet" else torch_case)(case, args.repeat)
        print(json.dumps(figure(case, seconds)))
        return
    for case in ["gemm_fp32", "gemm_tf32", "gemm_bf16", "add", "mlp_step"]:
        env = dict(os.environ)
        if case == "gemm_tf32":
            env["OXNET_CUDA_ALLOW_TF32"] = "1"
            env["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] = "1"
        row = {"case": case}
        for framework in ["oxnet", "torch"]:
            cmd = [sys.executable, __file__, "--repeat", str(args.repeat), "--one", framework, case]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                row[framework] = {"error": done.stderr.strip().splitlines()[-1:]}
                continue
            row[framework] = json.loads(done.stdout.strip().splitlines()[-1])
        ox, pt = row.get("oxnet", {}), row.get("torch", {})
        key = next((k for k in ox if k != "error"), None)
        if key and key in pt:
            row["oxnet_over_torch"] = round(ox[key] / pt[key], 3)
        if case == "add" and args.peak_gbs and "gbs" in ox:
            row["oxnet_of_peak"] = round(ox["gbs"] / args.peak_gbs, 3)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
