#!/usr/bin/env bash
# Session 9, last device call (about 7 min): the library's default (implementation=None) against
# vLLM 0.34.0 at every program bucket, fp8 (e4m3, scales 0.5 / 2.0) and bf16, TP1 and TP4, after the
# order change (jax-triton first for fp8 at the H200 fp8 table's one-warp entries, 129 programs up).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session9_f.sh
source tools/gpu_env.sh
set -o pipefail
P=1,4,8,16,32,64,128,256,512,1024,2048,4096,8192
{
  timeout 210 python3 tools/fp8_kernel_ab.py --geometries TP1,TP4 --impl auto --programs $P --configs table \
    --n-sets 6 --runs 2 --out "$OUT/auto_fp8"
  timeout 210 python3 tools/fp8_kernel_ab.py --geometries TP1,TP4 --kv-dtype bf16 --impl auto --programs $P \
    --configs table --n-sets 6 --runs 2 --out "$OUT/auto_bf16"
} 2>&1 | grep -v -i warning | tee "$OUT/auto.log" | grep -E "programs|x\) err"
