#!/usr/bin/env bash
# The GPU checks of a source checkout whose python/oxnet holds a built extension
# (`maturin develop --release`), on a machine with an NVIDIA GPU: the GPU tests, the GPU
# variants of the ctx-parametrized tests, and the GPU benchmark. Logs go to $OUT (default
# /tmp/gpu-check).
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "device: $name"
case "$name" in
*H200*) peak=4800 ;;
*H100*) peak=3350 ;;
*) peak=0 ;;
esac
python3 -c 'import oxnet as mx; print("oxnet sees", mx.context.num_gpus(), "GPU(s)")'
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/python/test_gpu.py >"$OUT/test_gpu.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/test_gpu.log" | tail -30
timeout 240 python3 -m pytest -q -p no:cacheprovider -k gpu tests/python/test_operator_table.py tests/python/test_ndarray.py \
    tests/python/test_autograd.py tests/python/test_gradients.py tests/python/test_nn_ops.py tests/python/test_engine.py \
    tests/python/test_errors.py >"$OUT/ctx_tests.log" 2>&1
grep -E "passed|failed" "$OUT/ctx_tests.log" | tail -1
echo "failures by cause (operators without a GPU kernel are named):"
grep -E "^E  +[A-Za-z.]*(Error|Exception)" "$OUT/ctx_tests.log" | sed -E 's/pushed from [^)]*//; s/\(\([0-9, ]*\) [a-z0-9]+(, \([0-9, ]*\) [a-z0-9]+)*\)/(..)/g; s/[0-9]+/N/g' |
    sort | uniq -c | sort -rn | cut -c1-220 | head -70
timeout 240 python3 benches/bench_gpu.py --repeat 5 --peak-gbs "$peak" 2>&1 | tee "$OUT/bench.log"
