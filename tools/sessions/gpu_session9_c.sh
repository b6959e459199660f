#!/usr/bin/env bash
# Session 9, second device call (about 7 min): after gpu_session9_a.sh showed jax-triton at
# 0.73-0.85x of 0.34.0 at 4096 fp8 programs (one warp, 2 splits) but 1.21-1.35x at 32-128
# (where the table launches 2 warps):
#  1. jax-triton at one warp (0.34.0's warps) on the table's tilings at 8-128 programs;
#  2. jax-triton and the library's choice at 8192 programs and with the prefill flag (TP1 2048 rows);
#  3. the backward kernels under Nsight Compute (gpu_session9_b.sh).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session9_c.sh
source tools/gpu_env.sh
set -o pipefail
AB="timeout 100 python3 tools/fp8_kernel_ab.py --geometries TP1,TP4"
{
  $AB --impl triton --programs 8 --configs 32/64/1/3,32/64/2/3,64/33/2/2 --out "$OUT/ab_p8"
  $AB --impl triton --programs 32 --configs 32/16/1/2,32/16/1/3 --out "$OUT/ab_p32"
  $AB --impl triton --programs 64 --configs 32/8/1/2 --out "$OUT/ab_p64"
  $AB --impl triton --programs 128 --configs 32/4/1/2,32/4/1/3 --out "$OUT/ab_p128"
  $AB --impl triton --programs 8192 --configs table --out "$OUT/ab_t8192"
  $AB --impl auto --programs 8192 --configs table --out "$OUT/ab_a8192"
  timeout 100 python3 tools/fp8_kernel_ab.py --geometries TP1 --prefill --impl triton --programs 4096 --configs table --out "$OUT/ab_tpre"
  timeout 100 python3 tools/fp8_kernel_ab.py --geometries TP1 --prefill --impl auto --programs 4096 --configs table --out "$OUT/ab_apre"
} 2>&1 | grep -v -i warning | tee "$OUT/ab.log" | grep -E "programs|x\) err"
tar -C "$OUT" -czf "$OUT/ab.tgz" ab_p8 ab_p32 ab_p64 ab_p128 ab_t8192 ab_a8192 ab_tpre ab_apre 2>/dev/null \
  && rm -rf "$OUT"/ab_*/
bash tools/sessions/gpu_session9_b.sh
