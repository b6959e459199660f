#!/usr/bin/env bash
# For the next session (carry .whl .cache/originals; <= 230 s on any Hopper, then <= 480 s more on an
# H200). Written in session 40, whose one H100 call ran gpu_next_p.sh (results:
# bench/results/nvidia-h100_2026-12-08/session40/) and whose remaining starts were refused.
# 1. Any Hopper, owed since session 40 stretched config.H200_FP8's last 2-split band from 3500 to 3695
#    programs (call a: 2 splits 3.5% ahead of one split at TP4 3550):
#    a. GPU parity (tests/test_fp8.py: every implementation, e4m3 / uint8 bytes / bf16, TP1 / TP2 / TP4)
#       at 1800 rows, TP1's 3600 programs, inside the stretched band. Prediction: 9 passed.
#    b. jax-triton fp8, the table's own launch beside one and 2 splits at 3450, 3600, 3690 (the
#       stretched band) and 3700 programs (the large-batch entry), TP1 / TP4. Predictions: the table
#       within 1% of its 2-split twin at 3450-3690 and of one split at 3700; at 3450-3690 2 splits
#       within 2% of the faster of the two on each geometry.
# 2. On an H200: gpu_session38_a.sh's H200 branch (the gather roofline, the Gluon A/B, sessions 36-37's
#    split bands on that card; its header has the predictions). Issue 13's throughput targets are stated
#    for the H200, and none has come since session 32.
source tools/gpu_env.sh > /dev/null
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$card"
QSA_FP8_PARITY_ROWS=1800 timeout -k 10 -s INT 120 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE \
  "tests/test_fp8.py::test_gpu_fp8_parity" > "$OUT/fp8_parity.log" 2>&1
echo "fp8 parity rc=$?"; grep -E "passed|failed|Error" "$OUT/fp8_parity.log" | tail -3 | cut -c1-200
timeout -k 5 -s INT 100 python3 tools/fp8_kernel_ab.py --impl triton --configs table,32/1/1/2,32/2/1/2 \
  --programs 3450,3600,3690,3700 --geometries TP1,TP4 --runs 2 --n-sets 6 --out "$OUT/fp8_3695" \
  > "$OUT/fp8_3695.log" 2>&1
echo "fp8 rc=$?"
grep -hE "programs|triton[ )]" "$OUT/fp8_3695.log" | sed 's/ \[.*//; s/ knob=off//; s/ err .*//; s/ us / /' | cut -c1-90
if [[ "$card" == *H200* ]]; then bash tools/sessions/gpu_session38_a.sh; fi
true
