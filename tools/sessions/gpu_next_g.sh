#!/usr/bin/env bash
# Prepared in session 23 for the next lent GPU (carry .whl .cache/originals): bash tools/sessions/gpu_next_g.sh
# Session 23 turned the jax-triton kernel's fp16 q.K^T on at TP1's one-split launches
# (config.triton_fp8_keys_f16_dot) on CPU evidence plus its first H100 call; the GPU tests of
# that default never ran (the machine was lost, then none was lent).
# On an H200 (issue 13's card): tests/test_fp8.py's GPU tests (prediction: all pass; the knob
#   bit-identical at the one-warp one-split launch too), then gpu_next_e.sh (one split vs 2 at
#   520-8192 programs and the bf16/fp8 grid: issue 13's targets; predictions in its header).
# On any other card: gpu_session23_b.sh (the same tests' fp8 parity and knob cases, the torch
#   A/B of the new default, the grid at TP1/TP4; predictions in its header).
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
if [[ "$card" != *H200* ]]; then exec bash tools/sessions/gpu_session23_b.sh; fi
timeout -s INT 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_fp8.py > "$OUT/gpu_fp8.log" 2>&1
echo "gpu fp8 tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_fp8.log" | tail -10
bash tools/sessions/gpu_next_e.sh
