#!/usr/bin/env bash
# Session 36, call a (carry .whl .cache/originals; <= 560 s), whichever card comes.
# 1. On an H200 only: tools/sessions/gpu_next_m.sh (the gather roofline, the Gluon A/B; ~300 s).
# 2. The bf16 split sweep written as gpu_next_n.sh in session 35 (its call h: the bf16 table's one split from
#    257 programs ran 1.08x of 0.34.0 at 600 TP1 programs, 3-4 splits 13% faster), widened to 300 programs
#    and, where the card leaves time (not after step 1), TP4. Pallas at 32-token tiles, 2 warps, 3 stages
#    (the table's launch; 4 programs per SM by registers, 528 per wave), 1-4 splits beside 0.34.0.
#    Prediction: one split stays fastest at 300, 400 and 528 (at most one wave) and 1056 (two full waves);
#    at 600-800 (1.1-1.5 waves) 2-4 splits beat it by 5-15% and the table is slower than 0.34.0 there.
source tools/gpu_env.sh > /dev/null
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
geoms=TP1,TP4
if [[ "$card" == *H200* ]]; then
  bash tools/sessions/gpu_next_m.sh 2>&1 | tail -40
  geoms=TP1
fi
timeout -k 5 -s INT 260 python3 tools/fp8_kernel_ab.py --kv-dtype bf16 --impl pallas \
  --configs table,32/1/2/3,32/2/2/3,32/3/2/3,32/4/2/3 --programs 600,700,800,528,400,300,1056 --geometries $geoms \
  --runs 2 --n-sets 6 --out "$OUT/bf16" > "$OUT/bf16.log" 2>&1
echo "bf16 rc=$?"; grep -hE "programs|pallas" "$OUT/bf16.log" | sed 's/ \[.*//; s/ knob=off//' | cut -c1-100
true
