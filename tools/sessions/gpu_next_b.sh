#!/usr/bin/env bash
# Prepared in session 18 (CPU only) for the next lent H100/H200, call b: the gradients through
# vLLM 0.34's arithmetic (k/v scales, fp8 caches; built and CPU-checked in session 18, never run
# on a GPU), then the plain backward's GPU tests again (its kernels gained an optional operand).
# Prediction: all pass; dq <= 2.6x, dgate <= 2.3x the bf16 floor, e4m3 dK/dV <= 1.05x the e4m3
# floor at TP1/TP4 up to 1024 rows (CPU at TP4, 12 rows: 1.85 / 1.48 / 1.00).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_next_b.sh
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 280 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s tests/test_gpu_backward.py \
  > "$OUT/gpu_backward.log" 2>&1
echo "gpu backward tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|GRAD fp8" "$OUT/gpu_backward.log" | tail -30
