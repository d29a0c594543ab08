#!/usr/bin/env bash
# Run bench_foundation.py for oxnet, MXNet 1.9.1 and PyTorch, interleaved ROUNDS times, all with
# two threads (the machine's cores), and print a markdown table of medians over rounds.
#   MXV=/root/venvs/mxnet TORCHV=/root/venvs/torch OXPY=.venv/bin/python ROUNDS=3 bash benches/run_foundation.sh
set -eu
cd "$(dirname "$0")/.."
MXV=${MXV:-$HOME/venvs/mxnet}
TORCHV=${TORCHV:-$HOME/venvs/torch}
OXPY=${OXPY:-.venv/bin/python}
ROUNDS=${ROUNDS:-3}
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
out=$(mktemp)
for r in $(seq "$ROUNDS"); do
  "$OXPY" benches/bench_foundation.py --framework oxnet >> "$out"
  "$MXV/bin/python" benches/bench_foundation.py --framework mxnet >> "$out" 2>/dev/null
  "$TORCHV/bin/python" -W ignore benches/bench_foundation.py --framework torch >> "$out"
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
        v = [r[k] for r in rows if r["framework"] == f]
        cells.append("%.3g (%.3g-%.3g, n=%d)" % (statistics.median(v), min(v), max(v), len(v)))
    print("| %s | %s |" % (k, " | ".join(cells)))
PY
rm -f "$out"
