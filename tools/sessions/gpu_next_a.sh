#!/usr/bin/env bash
# Prepared in session 18 (CPU only, no device lent) for the next lent H100/H200, call a.
# Owed since session 17 changed a default (the jax-triton fp8 kernel's fp16 q.K^T on where
# G <= 8, i.e. TP4's launches):
#  1. compute-sanitizer memcheck of the jax-triton fp8 part (its shape 2 has G = 6: the knob's
#     path) and the planted control. Prediction: 0 errors, the control reports its errors.
#  2. the sparse-attention grid with both originals on bf16 and fp8 at TP1/TP4 under the new
#     default. Prediction: TP4 fp8 rows of `auto` 6-11% faster than the committed session-13
#     grid's, TP1 unchanged (the knob stays off there); bf16 rows unchanged.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_next_a.sh
# Ran in session 21 on an H100 (bench/results/nvidia-h100_2026-12-05/session21/next_a/).
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')
IMPLS=triton PARTS=fp8 PART_TIMEOUT=90 bash tools/gpu_memcheck_parts.sh
timeout -s TERM "${GRID_TIMEOUT:-380}" python3 -m bench.run --op sparse --impl original,original034,pallas,auto \
  --kv-dtype bf16,fp8 --n-calls 10 --eager-calls 5 --no-progress --out "$OUT/${card}_$(date +%F)" --tp TP1,TP4 \
  > "$OUT/grid.log" 2>&1
echo "grid rc=$?"; rm -f "$OUT/${card}_$(date +%F)/results.partial.json"; tail -n 3 "$OUT/grid.log"
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
