#!/usr/bin/env bash
# Session 35, call d (carry .whl .cache/originals; <= 420 s), whichever card comes. Issue 13 ("never slower
# than 0.34.0 at any grid shape").
# Why: call c put the library's fp8 call at 132 programs (66 TP1 rows: the fp8 table's 129-512 bucket, 4
# splits, one warp) at 72.6 us where 0.34.0 (8 splits at 129-256 programs) took 66.2 us in another run.
# The one-warp kernel holds 8 programs per SM, 1056 on 132 SMs; the table's split counts are per
# power-of-two bucket, so 4 splits fill 49-97% of one wave at 129-256 programs and 1.0-1.9 waves at
# 257-512, and 8 / 16 splits fill a quarter to a half below 128. Here: jax-triton at 32-token tiles,
# one warp, 2 stages, 2 / 3 / 4 / 5 / 6 / 8 splits beside the table's launch and 0.34.0, at 132, 200, 396
# and 512 programs, TP1 and TP4, busy time of split + merge from one trace per run, error from exact.
# Prediction: the fastest split count is the one nearest one full wave, floor(1056 / programs) (8 at 132,
# 5 at 200, 2 at 396 and 512), 5-15% faster than the table's where that differs, minus what the larger
# merge costs (s x rows x 24 x 256 fp32 partials written and read: ~10% of the K/V bytes at 8 splits).
source tools/gpu_env.sh
set -o pipefail
timeout -k 10 -s INT 380 python3 tools/fp8_kernel_ab.py --impl triton --programs 132,200,396,512 --geometries TP1,TP4 \
  --configs table,32/2/1/2,32/3/1/2,32/4/1/2,32/5/1/2,32/6/1/2,32/8/1/2 --runs 2 --n-sets 6 \
  --out "$OUT/ab" > "$OUT/ab.log" 2>&1
echo "ab rc=$?"
grep -hE "programs|triton " "$OUT/ab.log" | sed 's/ \[.*//; s/knob=off//' | cut -c1-120
true
