#!/usr/bin/env bash
# Session 17, call c: the jax-triton kernel's fp16 q.K^T is now on by default where G <= 8 (TP4's
# launches; config.triton_fp8_keys_f16_dot(group_size), from call a's A/B). Check: fp8 parity of
# every implementation against 0.34.0 and the float64 exact attention at TP1/TP2/TP4 (TP4 now runs
# QK_FP16), and the knob's bit-identity again. Prediction: all pass; TP4 triton bits as before
# (the knob was bit-identical at every launch in call a).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session17_c.sh
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s tests/test_fp8.py \
  -k "parity and not bf16 or knob_is_bit_identical and triton" > "$OUT/fp8_gpu.log" 2>&1
echo "fp8 parity + knob rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|TP[124]" "$OUT/fp8_gpu.log" | tail -30
