#!/usr/bin/env bash
# Session 27, call e (carry .whl .cache/originals; <= 300 s), any card.
# Call a's fp8 GPU parity at the new GPU_ROWS (1, 2, 16, 32, 64, 264, 2048) passed 7 of its 9
# cases (e4m3 and its bytes at TP1/TP2/TP4, bf16 at TP1) and ran out of time inside bf16 TP2;
# here the two left. Prediction: 2 passed.
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 280 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s tests/test_fp8.py \
  -k "gpu_fp8_parity and bf16 and (TP2 or TP4)" > "$OUT/gpu_fp8_parity_bf16.log" 2>&1
echo "fp8 parity (bf16 TP2/TP4) rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_fp8_parity_bf16.log" | tail -5
true
