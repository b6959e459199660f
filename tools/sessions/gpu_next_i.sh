#!/usr/bin/env bash
# Prepared in session 25 for the next lent GPU (carry .whl .cache/originals; ~250 s, any Hopper):
# bash tools/sessions/gpu_next_i.sh -- run it AFTER the CPU change it checks:
# config.H200_BF16's 8-program band (5-8 programs) from (64, 32 splits, 4 warps, 2 stages) to
# vLLM 0.34.0's own tiling (64, 33, 2, 2), with tests/test_fp8.py's table-evidence test taught
# to accept session 25's one-file A/B (bench/results/nvidia-h100_2026-12-06/session25/call_b/
# bf16_ab_pallas/ab.json, as SM90_FP8_ONE_FILE_AB does for fp8).
# Session 25 (H100): Pallas at (64, 33, 2, 2) 1.00 / 1.00x of 0.34.0 at 8 programs (TP1 / TP4)
# against the entry's 1.07 / 1.08x, the same error from exact.
# 1. GPU parity at the changed rows (TP1 3-4 rows, TP2 3-4, TP4 5-8: 5-8 programs), every
#    implementation, against 0.30.0 and exact. Prediction: pass.
# 2. Decode busy time, auto against 0.34.0, bf16, 1-16 rows. Prediction: TP1 4 rows and TP4 8 rows
#    from 1.06-1.09x (session 24) to 0.98-1.02x; other rows unchanged.
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
dir="$OUT/$(echo "$card" | tr 'A-Z ' 'a-z-')_$(date +%F)_decode"
QSA_PARITY_ROWS=3,4,8 timeout -s INT 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s \
  tests/test_gpu_parity.py -k sparse > "$OUT/gpu_parity.log" 2>&1
echo "gpu parity rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_parity.log" | tail -5
timeout -s TERM 120 python3 -m bench.run --op sparse --impl original034,auto --kv-dtype bf16 \
  --rows 1,2,4,8,16 --trace-rows 16 --n-calls 10 --eager-calls 5 --no-progress --no-plot \
  --out "$dir" --tp TP1,TP4 > "$OUT/decode.log" 2>&1
echo "decode grid rc=$?"; rm -f "$dir/results.partial.json"; tail -n 2 "$OUT/decode.log"
python3 tools/busy_table.py "$dir/results.md"
true
