#!/usr/bin/env bash
# After session 9 (not yet run; about 2 min of device time): fp8 at 5-24 programs, the buckets where
# the library's default is still 1.08-1.21x of vLLM 0.34.0 (session 9, f_default_vs_034). At 8
# programs jax-triton at 0.34.0's own tiling (64-wide tiles, 33 splits, 2 warps, 2 stages) measured
# 1.01 / 0.99x (c_ab_backward_ncu); 16 programs was not timed that way. If both hold, give the
# H200 fp8 table's 8- and 16-program buckets a jax-triton entry at that tiling (its error is
# 0.34.0's own) and let sparse_attention_order take it there.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session10_c.sh
source tools/gpu_env.sh
set -o pipefail
{
  timeout 100 python3 tools/fp8_kernel_ab.py --geometries TP1,TP4 --impl triton --programs 8,16,24 \
    --configs 64/33/2/2,64/33/2/3 --out "$OUT/ab_t"
  timeout 100 python3 tools/fp8_kernel_ab.py --geometries TP1,TP4 --impl auto --programs 8,16,24 \
    --configs table --out "$OUT/ab_a"
} 2>&1 | grep -v -i warning | tee "$OUT/ab.log" | grep -E "programs|x\) err"
