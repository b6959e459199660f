#!/usr/bin/env bash
# For the next session (carry .whl .cache/originals; <= 130 s, then <= 220 s more on an H100, <= 480 s on
# an H200). Rewritten in session 38, whose device time went to nine refused starts (991 s) and three H100
# calls; session 39 added the H100 branch, then got no machine at all (eight refused
# starts and three "none asked for" answers took 1,557 s; the last 243 s could start none).
# Ran in session 40 as call a, on an H100 (bench/results/nvidia-h100_2026-12-08/session40/call_a/);
# what it leaves owed is in gpu_next_q.sh.
# 1. Any Hopper (owed since session 38, whose last 406 s could not start another machine):
#    tests/test_fp8.py::test_gpu_fp8_parity at 1100 and 1650 rows, TP1's 2200 and 3300 programs, the
#    2-split bands past 2048 that session 38 added to config.H200_FP8. Prediction: 9 passed.
# 2. On an H100: gpu_session39_a.sh (<= 220 s; its header has the predictions). On an H200:
#    gpu_session38_a.sh's H200 branch, which never got an H200 (its header has the predictions): the gather
#    roofline, the Gluon A/B, then sessions 36-37's split bands on that card.
source tools/gpu_env.sh > /dev/null
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$card"
QSA_FP8_PARITY_ROWS=1100,1650 timeout -k 10 -s INT 120 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE \
  "tests/test_fp8.py::test_gpu_fp8_parity" > "$OUT/fp8_parity.log" 2>&1
echo "fp8 parity rc=$?"; grep -E "passed|failed|Error" "$OUT/fp8_parity.log" | tail -3 | cut -c1-200
if [[ "$card" == *H200* ]]; then bash tools/sessions/gpu_session38_a.sh; else bash tools/sessions/gpu_session39_a.sh; fi
true
