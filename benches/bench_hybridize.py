"""Hybridized Gluon training against imperative, and the memory a hybridized block plans
(issue 24), for oxnet, MXNet 1.9.1 and PyTorch:

- <net>_imperative_ms / <net>_hybrid_ms: one training step (forward, backward, SGD update) of a
  deep MLP (12 x 1024, batch 128, relu) and LeNet (batch 64), imperative and hybridized with
  static_alloc (PyTorch: eager).
- mlp_plan_mb: the memory planned for the hybridized MLP's forward and backward (oxnet:
  HybridBlock.planned_memory()); executor_plan_mb: a bound executor's plan for the same symbol
  (oxnet: Executor.planned_bytes; MXNet: the "Total N MB allocated" of debug_str).
- mlp_rss_growth_mb: resident memory added by 20 hybridized training steps (after the build).

    python benches/bench_hybridize.py --framework oxnet|mxnet|torch

Prints one JSON line; `benches/run_side_by_side.sh benches/bench_hybridize.py` runs all three.
"""

import argparse
import importlib
import json
import statistics
import time

import numpy as np

LAYERS, HIDDEN, MLP_BATCH, LENET_BATCH = 12, 1024, 128, 64
STEPS, WARMUP = 30, 5


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def step_ms(step, steps=STEPS, warmup=WARMUP):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def mx_mlp(mx):
    net = mx.gluon.nn.HybridSequential()
    for _ in range(LAYERS):
        net.add(mx.gluon.nn.Dense(HIDDEN, activation="relu"))
    net.add(mx.gluon.nn.Dense(10))
    return net


def mx_lenet(mx):
    nn = mx.gluon.nn
    net = nn.HybridSequential()
    net.add(nn.Conv2D(20, 5, activation="relu"), nn.MaxPool2D(2, 2), nn.Conv2D(50, 5, activation="relu"),
            nn.MaxPool2D(2, 2), nn.Flatten(), nn.Dense(500, activation="relu"), nn.Dense(10))
    return net


def mx_case(mx, build, shape, hybridize):
    net = build(mx)
    net.initialize(mx.init.Xavier())
    x = mx.nd.array(np.random.RandomState(0).rand(*shape).astype(np.float32))
    y = mx.nd.array(np.random.RandomState(1).randint(0, 10, shape[0]).astype(np.float32))
    net(x)
    if hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()

    def step():
        with mx.autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(shape[0])
        loss.wait_to_read()

    return net, step


def run_mx(mx):
    res = {}
    for name, build, shape in (("mlp", mx_mlp, (MLP_BATCH, HIDDEN)), ("lenet", mx_lenet, (LENET_BATCH, 1, 28, 28))):
        for hybridize in (False, True):
            net, step = mx_case(mx, build, shape, hybridize)
            res["%s_%s_ms" % (name, "hybrid" if hybridize else "imperative")] = step_ms(step)
    net, step = mx_case(mx, mx_mlp, (MLP_BATCH, HIDDEN), True)
    step()
    mx.nd.waitall()
    before = rss_mb()
    for _ in range(20):
        step()
    mx.nd.waitall()
    res["mlp_rss_growth_mb"] = rss_mb() - before
    if hasattr(net, "planned_memory"):
        res["mlp_plan_mb"] = net.planned_memory() / 2**20
    sym = net(mx.sym.var("data"))
    reqs = {name: ("null" if name == "data" else "write") for name in sym.list_arguments()}
    exe = sym.simple_bind(mx.cpu(), grad_req=reqs, data=(MLP_BATCH, HIDDEN))
    if hasattr(exe, "planned_bytes"):
        res["executor_plan_mb"] = exe.planned_bytes / 2**20
    else:
        total = [line for line in exe.debug_str().splitlines() if line.startswith("Total")]
        res["executor_plan_mb"] = float(total[-1].split()[1]) if total else float("nan")
    return res


def run_torch(torch):
    torch.set_num_threads(2)
    nn = torch.nn
    res = {}

    def mlp():
        layers = []
        for i in range(LAYERS):
            layers += [nn.Linear(HIDDEN, HIDDEN), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(HIDDEN, 10))

    def lenet():
        return nn.Sequential(nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(20, 50, 5), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10))

    for name, build, shape in (("mlp", mlp, (MLP_BATCH, HIDDEN)), ("lenet", lenet, (LENET_BATCH, 1, 28, 28))):
        net = build()
        x = torch.from_numpy(np.random.RandomState(0).rand(*shape).astype(np.float32))
        y = torch.from_numpy(np.random.RandomState(1).randint(0, 10, shape[0]))
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        loss_fn = nn.CrossEntropyLoss()

        def step():
            opt.zero_grad()
            loss_fn(net(x), y).backward()
            opt.step()

        res["%s_imperative_ms" % name] = step_ms(step)
        if name == "mlp":
            before = rss_mb()
            for _ in range(20):
                step()
            res["mlp_rss_growth_mb"] = rss_mb() - before
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", default="oxnet")
    args = ap.parse_args()
    if args.framework == "torch":
        import torch
        res, version = run_torch(torch), torch.__version__
    else:
        mx = importlib.import_module(args.framework)
        res, version = run_mx(mx), mx.__version__
    print(json.dumps({"bench": "hybridize", "framework": args.framework, "version": version, **res}))


if __name__ == "__main__":
    main()
