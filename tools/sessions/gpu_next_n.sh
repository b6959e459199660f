#!/usr/bin/env bash
# For the next session, any Hopper with 132 SMs (carry .whl .cache/originals; <= 140 s). Session 35's bf16 lead
# (bench/results/nvidia-h100_2026-12-07/session35/call_h/): the bf16 table (Pallas, 32-token tiles, 2 warps, 3 stages: 4 programs per SM by registers, 528
# per wave) takes one split from 257 programs, which at 600 programs ran 1.08x of 0.34.0.
# Here: TP1 at 400 / 528 / 600 / 700 / 800 / 1056 programs, 1-4 splits beside the table and 0.34.0.
# Prediction: one split stays fastest at 400 and 528 (at most one wave) and 1056 (two full waves); at
# 600-800 (1.1-1.5 waves) 2-4 splits beat it by 5-15% and the table is slower than 0.34.0 there.
source tools/gpu_env.sh > /dev/null
set -o pipefail
timeout -k 5 -s INT 110 python3 tools/fp8_kernel_ab.py --kv-dtype bf16 --impl pallas \
  --configs table,32/1/2/3,32/2/2/3,32/3/2/3,32/4/2/3 --programs 600,700,800,528,400,1056 --geometries TP1 \
  --runs 2 --n-sets 6 --out "$OUT/bf16" > "$OUT/bf16.log" 2>&1
echo "rc=$?"; grep -hE "programs|pallas" "$OUT/bf16.log" | sed 's/ \[.*//; s/ knob=off//' | cut -c1-100
true
