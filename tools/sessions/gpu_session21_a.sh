#!/usr/bin/env bash
# Session 21, call a (any H100/H200; carry .whl .cache/originals): bash tools/sessions/gpu_session21_a.sh
# Question: the session-21 H100 grid has 0.34.0's *prefill* tiling for fp8 above 2048 programs
# (32-wide tiles, ONE split, one warp) at 92.6-96.8% of copy bandwidth, 1.03-1.07x faster than
# this project's table entry there (32-wide, 2 splits, one warp: 87.7-93.7%). Session 9 saw the
# same 1.05x on the H200 and did not separate the tiling. So: the jax-triton fp8 kernel at one
# split (2 stages, as 0.34.0 launches) against the table entry, 1024-8192 programs, TP1/TP4, with
# 0.34.0 at its prefill tiling as the comparator, and the Gluon kernel with V through shared
# memory (the faster Gluon form in call c of session 21) at each tiling.
# Prediction: one split 3-8% faster than the table at 4096-8192 programs (no merge kernel, which
# is 3% of the TP1 time, and half the programs), level or slower at 1024 (one wave of programs);
# our kernel at one split within +-2% of 0.34.0's at the same tiling; bit-identical Gluon.
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 330 python3 tools/fp8_kernel_ab.py --impl triton --prefill --programs 1024,2048,4096,8192 \
  --geometries TP1,TP4 --configs table,32/1/1/2 --runs 2 --n-sets 6 \
  --knob triton_fp8_gluon_split+triton_fp8_gluon_values_shared --out "$OUT/one_split" > "$OUT/one_split.log" 2>&1
echo "one split ab rc=$?"; grep -E "programs|knob=|bit-identical" "$OUT/one_split.log" | sed 's/ err .*\[/ [/' | tail -48
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
true
