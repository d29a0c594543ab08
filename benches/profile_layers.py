"""Per-layer time of a model-zoo network's hybridized inference, from oxnet's profiler (its Chrome trace).
    python benches/profile_layers.py --model resnet18_v1 --batch 32 [--repeat 3] [--top 15]
Prints a markdown table: the operator calls of one forward pass grouped by operator and input shapes, their
calls per pass, time per pass (mean over `repeat` passes) and share, slowest first; then the total per operator type.
"""
import argparse
import collections
import json
import os
import sys
import tempfile

THREADS = 2
os.environ.setdefault("OXNET_CPU_WORKER_NTHREADS", str(THREADS))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import oxnet as mx  # noqa: E402
from bench_inference import gluon_runner  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet18_v1")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    run = gluon_runner(mx, args.model, args.batch)
    run()
    run()
    trace = os.path.join(tempfile.mkdtemp(), "trace.json")
    mx.profiler.set_config(profile_all=True, filename=trace)
    mx.profiler.set_state("run")
    for _ in range(args.repeat):
        run()
    mx.profiler.set_state("stop")
    mx.profiler.dump()
    events = json.load(open(trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    calls = [e for e in events if e.get("ph") == "X" and e.get("cat") == "operator"]
    # Layers of the same operator and input shapes are one row (ResNet's repeated blocks).
    layers = collections.defaultdict(list)
    for e in calls:
        layers[(e["name"], e["args"].get("inputs", ""))].append(e["dur"] / 1e3)
    rows = [(sum(times) / args.repeat, len(times) // args.repeat, name, inputs) for (name, inputs), times in layers.items()]
    per_pass = len(calls) // args.repeat
    total = sum(r[0] for r in rows)
    print(f"{args.model}, batch {args.batch}: {per_pass} operator calls, {total:.1f} ms per pass (operators only)\n")
    print("| operator | inputs | calls | ms | share |\n|---|---|---|---|---|")
    for ms, count, name, inputs in sorted(rows, reverse=True)[:args.top]:
        print(f"| {name} | {inputs} | {count} | {ms:.2f} | {100 * ms / total:.1f}% |")
    by_type = collections.Counter()
    for ms, _, name, _ in rows:
        by_type[name] += ms
    print("\n| operator type | ms | share |\n|---|---|---|")
    for name, ms in by_type.most_common():
        print(f"| {name} | {ms:.2f} | {100 * ms / total:.1f}% |")


if __name__ == "__main__":
    main()
