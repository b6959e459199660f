#!/usr/bin/env bash
# Session 36, call c (carry .whl .cache/originals; <= 300 s), an H100 like call a. Call a (bf16 Pallas, 32-token
# tiles, 2 warps, 3 stages: 4 programs per SM, 528 per wave on 132 SMs): one split (the table's from 257
# programs) was fastest at 400, 528, 800 and 1056 programs but 1.08 / 1.06x of 0.34.0 at 600 (3 splits
# 0.93 / 0.91x) and 0.99 / 0.98x at 700 (2 splits 0.90x); TP1 / TP4 alike. Here the boundaries in
# between: 544-768 programs, 1-4 splits, TP1 and TP4.
# Prediction (the second wave's share of one wave, (P - 528) / 528): 3 splits fastest up to ~0.2
# (544-624), 2 splits from there to ~0.4 (648-720), one split from ~0.45 (744-768); each winner at most
# 0.95x of 0.34.0.
source tools/gpu_env.sh > /dev/null
set -o pipefail
timeout -k 5 -s INT 260 python3 tools/fp8_kernel_ab.py --kv-dtype bf16 --impl pallas \
  --configs table,32/2/2/3,32/3/2/3,32/4/2/3 --programs 544,576,624,648,672,720,744,768 --geometries TP1,TP4 \
  --runs 2 --n-sets 6 --out "$OUT/bf16" > "$OUT/bf16.log" 2>&1
echo "bf16 rc=$?"; grep -hE "programs|pallas" "$OUT/bf16.log" | sed 's/ \[.*//; s/ knob=off//; s/ err .*//' | paste - - - - - | cut -c1-200
true
