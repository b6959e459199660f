#!/usr/bin/env bash
# For the next lent H200 (carry .whl .cache/originals; <= 450 s; exits at once on another card). Written in
# session 32 as call f; its memcheck part ran in session 33 (H100, call a: 0 errors, control reported).
# What is left is the H200 half of session 33's call a: fp8_kernel_ab at the fp8 table's one-split launch
# (jax-triton, 2048 / 4096 programs, TP1 / TP4), the Triton kernel against the Gluon kernel with V through
# shared memory, lazy rescaling (config.triton_fp8_lazy_rescale), and both. On the H100 (session 33):
# Gluon +0.1 to +1.3%, lazy +1.8 to +5.7%, both +6.3 to +8.8% -- no gain. Prediction for the H200: the
# same order (the loop's issue time is not what binds); a gain of 3% or more for either would say it is.
# First (session 34): tools/gather_roofline.py, the bandwidth a pure gather of the same K/V bytes reaches
# on the H200 (on the H100: 104.7-105.7% of copy, the library's fp8 0.91-0.95x of it). Prediction: the
# gather at 95-105% of copy, so the H200's 82-89% is the kernel's (8 one-warp programs per SM), not the
# access pattern's; a gather near 85% would make issue 13's 95% out of reach for any kernel.
# Session 35 (H100, call c): a one-warp program's tile takes 2.91 us alone (Triton) and 2.31 us (Gluon, V
# through shared memory), 5.96 us at 8 per SM where the H100's bandwidth binds; 95% of the H200's copy
# bandwidth needs ~4.3 us at 8 per SM. Lazy rescaling's path was longer everywhere, so only the Gluon
# kernel is timed here; prediction: Gluon 3-8% faster than Triton at 2048 / 4096 programs on the H200.
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
[[ "$card" == *H200* ]] || { echo "not an H200 ($card): nothing run"; exit 0; }
timeout -k 10 -s INT 150 python3 tools/gather_roofline.py --variants 16/1/0,32/1/0,32/1/1,32/4/1 --out "$OUT/roofline" \
  > "$OUT/roofline.log" 2>&1
echo "roofline rc=$?"; grep -vE "^\s*$|Warning|warn" "$OUT/roofline.log" | tail -60 | cut -c1-160
GLUON=triton_fp8_gluon_split+triton_fp8_gluon_values_shared
timeout -s INT 250 python3 tools/fp8_kernel_ab.py --impl triton --programs 2048,4096 --geometries TP1,TP4 \
  --configs table --runs 2 --n-sets 6 --knob $GLUON --out "$OUT/ab" > "$OUT/ab.log" 2>&1
echo "ab rc=$?"
grep -hE "programs|knob=|bit-identical" "$OUT/ab.log" | sed 's/ \[.*//' | cut -c1-150
true
