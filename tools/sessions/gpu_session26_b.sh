#!/usr/bin/env bash
# Session 26, call b (carry .whl .cache/originals; <= 560 s, any Hopper): the two checks session 25
# left out for the jax-triton merge on 2 warps (config.TRITON_MERGE_WARPS, session 25):
# 1. fp8 GPU parity at TP2 (session 25 ran TP1 and TP4): every implementation, e4m3 / e4m3 bytes /
#    bf16 with scales, against 0.34.0 and exact. Prediction: 3 passed.
# 2. compute-sanitizer memcheck of the jax-triton kernels (split + merge; bf16 shapes 0-3 and fp8),
#    plus the planted control, which must report errors. The last memcheck of the jax-triton
#    kernels was session 12's (H200; before session 25's 2-warp merge). Prediction: the control
#    reports, every part 0 errors.
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_fp8.py \
  -k "gpu_fp8_parity and TP2" > "$OUT/gpu_fp8_tp2.log" 2>&1
echo "gpu fp8 TP2 rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_fp8_tp2.log" | tail -5
IMPLS=triton PARTS="fp8 sparse0 sparse1 sparse2 sparse3" PART_TIMEOUT=70 bash tools/gpu_memcheck_parts.sh
true
