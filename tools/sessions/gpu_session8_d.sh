#!/usr/bin/env bash
# Session 8, call D (about 4 min of device time): the jax-triton implementation on fp8 (call C:
# its split kernel is 20-30% faster than the Pallas one, compiled by Triton 3.6, but its merge
# splits D in 64-wide chunks: 14-66 µs against the Pallas merge's 3-19 µs). Tilings and merge
# chunk against 0.34.0, TP1/TP4, 256 / 1024 / 2048 programs; spec bn/splits/warps/stages/merge_d.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session8_d.sh
source tools/gpu_env.sh
set -o pipefail
timeout 170 python3 tools/fp8_kernel_ab.py --impl triton --programs 256 --geometries TP1,TP4 \
  --configs table,32/8/1/2/64,32/8/1/2/256,32/4/1/2/256,32/8/2/2/256 \
  --out "$OUT/ab_triton256" 2>&1 | grep -v -i warning | tee "$OUT/ab_triton.log" | tail -14
timeout 300 python3 tools/fp8_kernel_ab.py --impl triton --programs 1024,2048 --geometries TP1,TP4 \
  --configs table,32/4/1/2/64,32/4/1/2/256,32/2/1/2/256,32/4/2/2/256 \
  --out "$OUT/ab_triton1024" 2>&1 | grep -v -i warning | tee -a "$OUT/ab_triton.log" | tail -28
tar -C "$OUT" -czf "$OUT/ab_triton.tgz" ab_triton256 ab_triton1024 2>/dev/null && rm -rf "$OUT/ab_triton256" "$OUT/ab_triton1024"
