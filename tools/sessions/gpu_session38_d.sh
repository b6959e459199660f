#!/usr/bin/env bash
# Session 38, call d (any Hopper; carry .whl .cache/originals; <= 170 s), after the fp8 table gained bands past
# 2048 programs (2 splits at 2113-2640 and 3169-3500; calls a and c). tests/test_fp8.py::test_gpu_fp8_parity at
# 1100 and 1650 rows (TP1's 2200 and 3300 programs, the new 2-split bands; TP2/TP4's 1100 and 1650), every
# implementation against 0.34.0 and exact attention, TP1/TP2/TP4, three cache forms. Prediction: 9 passed.
source tools/gpu_env.sh > /dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
QSA_FP8_PARITY_ROWS=1100,1650 timeout -k 10 -s INT 160 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE \
  "tests/test_fp8.py::test_gpu_fp8_parity" > "$OUT/fp8_parity.log" 2>&1
echo "fp8 parity rc=$?"; grep -E "passed|failed|Error" "$OUT/fp8_parity.log" | tail -3 | cut -c1-200
grep -E "^FP8PARITY TP1" "$OUT/fp8_parity.log" | cut -c1-170 | head -12
true
