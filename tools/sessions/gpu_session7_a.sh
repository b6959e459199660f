#!/usr/bin/env bash
# Session 7, call A: fp8 GPU parity against 0.34.0 with the measured H200_FP8 table, and
# the fp8 tiling sweep of the buckets session 6 left unswept (1-32, 128, 512 programs).
# Usage (device tool): bash tools/sessions/gpu_session7_a.sh
source tools/gpu_env.sh
set -o pipefail
timeout 200 python3 -m pytest -q -m gpu tests/test_fp8.py -k "gpu_fp8_parity or keys_via_f16" -p no:cacheprovider \
  2>&1 | tee "$OUT/fp8_parity_h200fp8.log" | tail -5
timeout 300 python3 -m bench.hopper_sweep --kv-dtype fp8 --buckets 1,2,4,8,16,32,128,512 \
  --budget-s 230 --out "$OUT/fp8_sweep_small" > "$OUT/fp8_sweep_small.log" 2>&1; echo "sweep rc=$?"
tar -C "$OUT" -czf "$OUT/fp8_sweep_small.tgz" fp8_sweep_small && rm -rf "$OUT/fp8_sweep_small"
tail -20 "$OUT/fp8_sweep_small.log"
