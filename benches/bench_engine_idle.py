"""How much CPU a framework burns when it has little or nothing to do (issue 22).

    python benches/bench_engine_idle.py --framework oxnet|mxnet|torch

- burst_then_idle_cpu_ms: the process's CPU time over the 100 ms that start 10 ms after a burst
  of work ended (a thread pool that spins or busy-yields after its last task shows here; an idle
  one sleeps: ~0).
- periodic_1M_add_cores: cores used (CPU time / wall time) by a program that adds two
  1M-element arrays every 3 ms for 3 s, waiting for each result: the work itself is a fraction
  of a core, anything above it is the pool spinning between ops.
- periodic_1M_add_work_ms: the mean time of one add in that loop, to tell work from waste.

Prints one JSON line; `benches/run_side_by_side.sh benches/bench_engine_idle.py` runs all three.
"""
import argparse
import importlib
import json
import os
import statistics
import time

N = 1 << 20
PERIOD_S = 0.003
DURATION_S = 3.0


def cpu_seconds():
    return time.process_time()


def measure(add, make_inputs, burst, sync):
    res = {}
    a, b = make_inputs()
    add(a, b)
    sync()
    idle = []
    for _ in range(5):
        burst()
        sync()
        time.sleep(0.010)
        start = cpu_seconds()
        time.sleep(0.100)
        idle.append((cpu_seconds() - start) * 1e3)
    res["burst_then_idle_cpu_ms"] = statistics.median(idle)

    work = []
    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    deadline = wall0 + DURATION_S
    next_tick = wall0
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        add(a, b)
        sync()
        work.append(time.perf_counter() - t0)
        next_tick += PERIOD_S
        pause = next_tick - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    res["periodic_1M_add_cores"] = cpu / wall
    res["periodic_1M_add_work_ms"] = statistics.mean(work) * 1e3
    return res


def mx_like(mx):
    nd = mx.nd

    def burst():
        x = nd.ones((512, 512))
        for _ in range(20):
            x = nd.dot(x, x) * 1e-3
        x.wait_to_read()

    return measure(lambda a, b: (a + b).wait_to_read(),
                   lambda: (nd.ones((N,)), nd.ones((N,))), burst, nd.waitall)


def torch_like(torch):
    def burst():
        x = torch.ones(512, 512)
        for _ in range(20):
            x = torch.mm(x, x) * 1e-3

    return measure(lambda a, b: a + b, lambda: (torch.ones(N), torch.ones(N)), burst, lambda: None)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--framework", default="oxnet")
    p.add_argument("--quick", action="store_true")  # accepted for the side-by-side runner
    args = p.parse_args()
    mod = importlib.import_module(args.framework)
    res = torch_like(mod) if args.framework == "torch" else mx_like(mod)
    res["framework"] = args.framework
    res["version"] = getattr(mod, "__version__", "?")
    res["threads"] = os.environ.get("OMP_NUM_THREADS", "default")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
