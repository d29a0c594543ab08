#!/usr/bin/env bash
# Run one benchmark script for oxnet, MXNet 1.9.1 and PyTorch, interleaved ROUNDS times, all with
# two threads (the machine's cores), and print a markdown table of medians over rounds. Works
# with this repository's benches and with ../shared/bench's scripts (extra arguments pass through).
#   MXV=~/venvs/mxnet TORCHV=~/venvs/torch ROUNDS=3 bash benches/run_side_by_side.sh benches/bench_foundation.py
#   bash benches/run_side_by_side.sh ../shared/bench/bench_train.py --cases mlp,mlp_hybrid
# OXBASEPY=/path/to/venv/bin/python adds a column "oxnet-base": the same script run by another
# build of oxnet (an older commit's wheel installed in that venv), for before/after tables.
set -eu
cd "$(dirname "$0")/.."
SCRIPT=${1:?usage: run_side_by_side.sh SCRIPT [ARGS...]}
shift
MXV=${MXV:-$HOME/venvs/mxnet}
TORCHV=${TORCHV:-$HOME/venvs/torch}
OXPY=${OXPY:-$PWD/.venv/bin/python}
OXBASEPY=${OXBASEPY:-}
ROUNDS=${ROUNDS:-3}
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
out=$(mktemp)
script_dir=$(cd "$(dirname "$SCRIPT")" && pwd)
script=$script_dir/$(basename "$SCRIPT")
for r in $(seq "$ROUNDS"); do
  if [ -n "$OXBASEPY" ]; then
    (cd "$script_dir" && "$OXBASEPY" "$script" --framework oxnet "$@") | grep '^{' | tail -1 |
      "$OXPY" -c 'import json, sys; row = json.loads(sys.stdin.read()); row["framework"] = "oxnet-base"; print(json.dumps(row))' >> "$out"
  fi
  (cd "$script_dir" && "$OXPY" "$script" --framework oxnet "$@") | grep '^{' | tail -1 >> "$out"
  (cd "$script_dir" && "$MXV/bin/python" "$script" --framework mxnet "$@" 2>/dev/null) | grep '^{' | tail -1 >> "$out"
  (cd "$script_dir" && "$TORCHV/bin/python" -W ignore "$script" --framework torch "$@") | grep '^{' | tail -1 >> "$out"
done
"$OXPY" - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]

def figures(row):
    """Flat {name: number}: our benches print flat rows, ../shared/bench nests them under
    'results' with {median, ...} dicts for repeated measurements."""
    flat = dict(row.get("results", row))
    if "peak_rss_mb" in row:
        flat["peak_rss_mb"] = row["peak_rss_mb"]
    out = {}

    def add(prefix, value):
        if isinstance(value, dict) and "median" in value:
            value = value["median"]
        if isinstance(value, dict):
            for k, v in value.items():
                add(prefix + "." + k if prefix else k, v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[prefix] = value

    add("", flat)
    return out

fw = [f for f in ("oxnet-base", "oxnet", "mxnet", "torch") if any(r["framework"] == f for r in rows)]
keys = []
for r in rows:
    keys += [k for k in figures(r) if k not in keys]
print("| figure | " + " | ".join("%s %s" % (f, next(r["version"] for r in rows if r["framework"] == f)) for f in fw) + " |")
print("|---|" + "---|" * len(fw))
for k in keys:
    cells = []
    for f in fw:
        v = [figures(r)[k] for r in rows if r["framework"] == f and k in figures(r)]
        cells.append("%.3g (%.3g-%.3g, n=%d)" % (statistics.median(v), min(v), max(v), len(v)) if v else "-")
    print("| %s | %s |" % (k, " | ".join(cells)))
PY
rm -f "$out"
