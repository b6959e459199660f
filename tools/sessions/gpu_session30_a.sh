#!/usr/bin/env bash
# Session 30, call a. Asked for as kind nvidia-h200 (carry .whl .cache/originals; <= 440 s on an
# H200, <= 480 s on an H100).
# - H200 (issue 13's card, last lent in session 17): gpu_session29_a.sh's H200 branch, as
#   gpu_next_i.sh (the grid at 1024-4096 rows, decode against 0.34.0, the image GPU tests;
#   predictions there).
# - H100: (1) compute-sanitizer memcheck of jax-triton's sparse part 1 (16 rows x 12 heads =
#   192 (row, head) pairs, W 2051, split) with the planted control: the one memcheck shape in
#   the 129-256 pairs where session 29's config.TRITON_MERGE_SPLIT_D_MAX_PAIRS = 128 changed the
#   merge's launch (D whole on 2 warps instead of 64-wide chunks); the other parts launch as
#   before. Prediction: 0 errors, 4 launches agree; the control reports errors.
#   (2) the decode standing (gpu_session26_c.sh's H100 branch; prediction in gpu_next_i.sh).
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$card" == *H200* ]]; then
  exec bash tools/sessions/gpu_session29_a.sh
fi
source tools/gpu_env.sh
IMPLS=triton PARTS=sparse1 PART_TIMEOUT=100 bash tools/gpu_memcheck_parts.sh
head -c 20000 "$OUT/memcheck_plant.log" > "$OUT/memcheck_plant.trim" && mv "$OUT/memcheck_plant.trim" "$OUT/memcheck_plant.log"
exec bash tools/sessions/gpu_session26_c.sh
