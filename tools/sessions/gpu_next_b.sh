#!/usr/bin/env bash
# Prepared in session 18 (CPU only) for the next lent H100/H200, call b: the gradients through
# vLLM 0.34's arithmetic (k/v scales, fp8 caches; built and CPU-checked in session 18, never run
# on a GPU), then the plain backward's GPU tests again (its kernels gained an optional operand).
# Session 19 ran the scaled test alone on an H100 (6 passed: dq 1.77-2.08x, dgate 1.41-1.42x,
# e4m3 dK/dV 1.00-1.01x) and the memcheck part backward_fp8 (0 errors); owed: the whole suite on
# one machine, and the memcheck of the plain backward part. Prediction: all pass, 0 errors.
# Session 20 ran it on an H100 (bench/results/nvidia-h100_2026-12-05/session20/call_e/): 23 passed,
# the 250 s limit cut the last case (scaled fp8, 2048 rows); memcheck 0 errors. The limit is now 330 s.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_next_b.sh
# Ran in session 21 on an H100 (bench/results/nvidia-h100_2026-12-05/session21/next_b/).
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 330 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s tests/test_gpu_backward.py \
  > "$OUT/gpu_backward.log" 2>&1
echo "gpu backward tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|GRAD fp8" "$OUT/gpu_backward.log" | tail -30
IMPLS=pallas PARTS="backward backward_fp8" PART_TIMEOUT=80 bash tools/gpu_memcheck_parts.sh
