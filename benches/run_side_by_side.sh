#!/usr/bin/env bash
# Run one benchmark script for oxnet, MXNet 1.9.1 and PyTorch, interleaved ROUNDS times, all with
# two threads (the machine's cores), and print a markdown table of medians over rounds.
#   MXV=/root/venvs/mxnet TORCHV=/root/venvs/torch ROUNDS=3 bash benches/run_side_by_side.sh benches/bench_foundation.py
set -eu
cd "$(dirname "$0")/.."
SCRIPT=${1:?usage: run_side_by_side.sh benches/bench_<name>.py}
MXV=${MXV:-$HOME/venvs/mxnet}
TORCHV=${TORCHV:-$HOME/venvs/torch}
OXPY=${OXPY:-.venv/bin/python}
ROUNDS=${ROUNDS:-3}
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
out=$(mktemp)
for r in $(seq "$ROUNDS"); do
  "$OXPY" "$SCRIPT" --framework oxnet >> "$out"
  "$MXV/bin/python" "$SCRIPT" --framework mxnet >> "$out" 2>/dev/null
  "$TORCHV/bin/python" -W ignore "$SCRIPT" --framework torch >> "$out"
done
"$OXPY" - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
fw = ["oxnet", "mxnet", "torch"]
keys = [k for k in rows[0] if k not in ("framework", "version")]
print("| figure | " + " | ".join("%s %s" % (f, next(r["version"] for r in rows if r["framework"] == f)) for f in fw) + " |")
print("|---|" + "---|" * len(fw))
for k in keys:
    cells = []
    for f in fw:
        v = [r[k] for r in rows if r["framework"] == f and k in r]
        cells.append("%.3g (%.3g-%.3g, n=%d)" % (statistics.median(v), min(v), max(v), len(v)) if v else "-")
    print("| %s | %s |" % (k, " | ".join(cells)))
PY
rm -f "$out"
