#!/usr/bin/env bash
# Session 19, call b (device tool; carry .whl .cache/originals): what session 18 built on the CPU,
# on a GPU for the first time.
#  1. tools/sessions/gpu_next_b.sh: the GPU gradient tests, the scaled (k/v scales, e4m3 cache)
#     backward included. Prediction: all pass; dq <= 2.6x, dgate <= 2.3x the bf16 floor, e4m3
#     dK/dV <= 1.05x the e4m3 floor.
#  2. compute-sanitizer memcheck of the Pallas backward, plain and through vLLM 0.34's arithmetic
#     (part backward_fp8: an e4m3 cache with NaN/448 poison in unreferenced rows, k 0.5 / v 2),
#     and the planted control. Prediction: 0 errors, 2 launches each agreeing with XLA; the
#     control reports its errors.
source tools/gpu_env.sh
set -o pipefail
bash tools/sessions/gpu_next_b.sh
IMPLS=pallas PARTS="backward backward_fp8" PART_TIMEOUT=80 bash tools/gpu_memcheck_parts.sh
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
