#!/usr/bin/env bash
# Ran in session 32 on an H200 as call c: bench/results/nvidia-h200_2026-12-06/session32/call_c/ (its README: outcome).
# For the next lent GPU, any card, after gpu_next_j.sh (carry .whl .cache/originals; <= 560 s):
#   1. compute-sanitizer memcheck of session 30's merge layouts, pallas and triton, sparse parts 0
#      (1 row x 24 heads: 32-wide chunks on 1 warp) and 1 (16 rows x 12 heads = 192 pairs: 64-wide
#      on 1 warp), with the planted control. Prediction: 0 errors; the control reports.
#   2. the decode standing with them (session 26 call c's grid at 1-64 rows, bf16 and fp8, TP1 and
#      TP4, auto against 0.30.0 and 0.34.0, busy time). Prediction from session 30's call e: auto
#      0.1-0.8 µs faster than in session 30's call a at 1-32 rows; TP1 fp8 8 rows from 1.03x to
#      about 0.99x of 0.34.0; no row above 1.01x of the faster original.
source tools/gpu_env.sh
set -o pipefail
IMPLS="pallas triton" PARTS="sparse0 sparse1" PART_TIMEOUT=70 bash tools/gpu_memcheck_parts.sh
head -c 20000 "$OUT/memcheck_plant.log" > "$OUT/memcheck_plant.trim" && mv "$OUT/memcheck_plant.trim" "$OUT/memcheck_plant.log"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
dir="$OUT/$(echo "$card" | tr 'A-Z ' 'a-z-')_$(date +%F)_decode"
timeout -s TERM 200 python3 -m bench.run --op sparse --impl original,original034,auto \
  --kv-dtype bf16,fp8 --rows 1,2,4,8,16,32,64 --n-calls 10 --eager-calls 3 \
  --no-progress --no-plot --out "$dir" --tp TP1,TP4 > "$OUT/decode.log" 2>&1
echo "decode grid rc=$?"; rm -f "$dir/results.partial.json"; tail -n 2 "$OUT/decode.log"
python3 tools/busy_table.py "$dir/results.md" | cut -d'|' -f3,4,6,7,15,16
true
