#!/usr/bin/env bash
# Session 35, call c (carry .whl .cache/originals; <= 400 s), whichever card comes. Issue 13.
# Why: on the H100 the one-warp fp8 kernel is bandwidth-bound (95-101% of copy at the table's launch), so
# kernel variants that shorten its tile loop (the Gluon kernel: 23-26% fewer instructions; lazy
# rescaling) came out level or slower there, and the H200, where the same kernel reaches only 82-89%,
# rarely comes. What the H100 can still show is each variant's time per tile when bandwidth does not
# bind: at one program per SM (132 programs, one split: 66 TP1 rows, one wave), a program's 65 tiles
# run on their own, so busy time / 65 is the tile loop's critical path (its own loads' latency, its
# dependent instructions); at 4 and 8 per SM (528, 1056 programs, one wave each) the programs share
# the SM; 4096 programs is the bandwidth-bound case for reference. The gather (tools/gather_roofline.py,
# the same rows, no arithmetic) at the same counts is the loads' own share.
# Prediction (H100): per tile, the Triton kernel ~2-3 us at 1 per SM (the gather ~1 us), 5.5-6 us at 8 per
# SM (bandwidth: 8 x 16 KB per tile at ~23 GB/s per SM); the Gluon kernel's critical path 10-20% shorter
# at 1 per SM, level at 8 per SM and 4096 programs; lazy rescaling level or longer at every count. If the
# Gluon kernel's path is shorter, the H200 (which needs <= 4.3 us per tile at 8 per SM for 95% of copy)
# is where it should show.
source tools/gpu_env.sh
set -o pipefail
timeout -k 10 -s INT 120 python3 tools/gather_roofline.py --programs 132,528,1056 --geometries TP1 \
  --variants 32/1/0,32/1/1 --out "$OUT/roofline" > "$OUT/roofline.log" 2>&1
echo "roofline rc=$?"; grep -vE "^\s*$|Warning|warn" "$OUT/roofline.log" | tail -30 | cut -c1-160
GLUON=triton_fp8_gluon_split+triton_fp8_gluon_values_shared
timeout -k 10 -s INT 250 python3 tools/fp8_kernel_ab.py --impl triton --programs 132,528,1056,4096 --geometries TP1 \
  --configs 32/1/1/2 --runs 2 --n-sets 6 --knob $GLUON --knob triton_fp8_gluon_split \
  --knob triton_fp8_lazy_rescale --out "$OUT/ab" > "$OUT/ab.log" 2>&1
echo "ab rc=$?"
grep -hE "programs|knob=|bit-identical" "$OUT/ab.log" | sed 's/ \[.*//' | cut -c1-150
true
