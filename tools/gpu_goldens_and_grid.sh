#!/usr/bin/env bash
# One device call: re-record the goldens (0.30.0 and 0.34.0), then the sparse-attention
# grid with both originals side by side on bf16 and fp8 caches, then the fp8 GPU tests.
#   $OUT/golden.tgz (unpack into tests/golden), $OUT/<card>_<date>/ (results.json/md, plots)
# Usage (device tool; carry .whl .cache/originals): bash tools/gpu_goldens_and_grid.sh
# Knobs: GRID_ARGS (extra bench.run flags), GRID_IMPLS (default rows: both originals, pallas and
# auto = implementation=None, i.e. jax-triton for fp8 on Hopper at 5-24 and 33+ programs; add ",triton"
# for every jax-triton row; a longer grid), GRID_TIMEOUT, GOLDEN_TIMEOUT, TESTS_TIMEOUT.
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')
mkdir -p "$OUT/golden"
timeout "${GOLDEN_TIMEOUT:-120}" python3 tools/record_goldens.py --out "$OUT/golden" > "$OUT/goldens.log" 2>&1
echo "goldens rc=$?"; tail -n 7 "$OUT/goldens.log"
tar -C "$OUT" -czf "$OUT/golden.tgz" golden && rm -rf "$OUT/golden"
timeout -s TERM "${GRID_TIMEOUT:-330}" python3 -m bench.run --op sparse --impl "${GRID_IMPLS:-original,original034,pallas,auto}" \
  --kv-dtype bf16,fp8 --n-calls 10 --eager-calls 5 --no-progress --out "$OUT/${card}_$(date +%F)" ${GRID_ARGS:---tp TP1,TP4} \
  > "$OUT/grid.log" 2>&1
echo "grid rc=$?"; rm -f "$OUT/${card}_$(date +%F)/results.partial.json"; tail -n 3 "$OUT/grid.log"
timeout "${TESTS_TIMEOUT:-110}" python3 -m pytest -q -s -m gpu -p no:cacheprovider -rfE tests/test_fp8.py \
  > "$OUT/fp8_tests.log" 2>&1
echo "fp8 gpu tests rc=$?"; grep -E "FP8PARITY|passed|failed|FAILED" "$OUT/fp8_tests.log" | tail -14
