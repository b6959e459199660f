#!/usr/bin/env bash
# Session 35, call e (carry .whl .cache/originals; <= 300 s), whichever card comes. Issue 13.
# Call d (H100): at 132-512 programs the one-warp fp8 launch was fastest at the split count that fills one
# wave of 8 programs per SM (1056 on 132 SMs) without a second: floor(1056 / programs) -- 8 at 132, 5 at 200
# (4 within 3%), 2 at 396 and 512 -- where the table's 4 splits ran 7-12% slower (1.07-1.10x of 0.34.0 at
# 132 programs), and counts whose grid spilled into a second wave (3 at 396, 6 at 200) ran 14-40% slower.
# Here the rule's other counts and the bucket below 129: 64, 100, 128, 140, 170 and 300 programs, TP1 and
# TP4, the table's launch and 3 / 4 / 6 / 7 / 8 / 10 / 16 splits (32-token tiles, one warp, 2 stages).
# Prediction: floor(1056 / programs) (16, 10, 8, 7, 6, 3) is the fastest or within 3% of it at every case;
# below 129 programs, where the table has 8 or 4 splits (a quarter to half a wave), it gains 5-20% unless
# the merge's partials (more splits, fewer tiles each: 4-7 tiles at 10-16 splits) eat it.
source tools/gpu_env.sh
set -o pipefail
timeout -k 10 -s INT 280 python3 tools/fp8_kernel_ab.py --impl triton --programs 64,100,128,140,170,300 --geometries TP1,TP4 \
  --configs table,32/3/1/2,32/4/1/2,32/6/1/2,32/7/1/2,32/8/1/2,32/10/1/2,32/16/1/2 --runs 2 --n-sets 6 \
  --out "$OUT/ab" > "$OUT/ab.log" 2>&1
echo "ab rc=$?"
grep -hE "programs|triton" "$OUT/ab.log" | sed 's/ \[.*//; s/ knob=off//; s/triton 32\//s=/; s/\/1\/2 //' | cut -c1-100
true
