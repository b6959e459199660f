#!/usr/bin/env bash
# Session 33, call a (carry .whl .cache/originals; <= 560 s; any Hopper, meant for an H200). Issue 13's
# fp8 bandwidth on the H200, where the one-warp fp8 kernel reached 82-89% of copy bandwidth (session 32):
# On an H100 (no H200 came) only the lazy-rescaling A/B of part 1 and part 3 run (the Gluon A/B on the H100
# is session 32's call e; part 2 is session 19's result there).
# 1. fp8_kernel_ab at the fp8 table's one-split launch (jax-triton, 2048 / 4096 programs, TP1 / TP4), the
#    Triton kernel against: the Gluon kernel (V in registers), the Gluon kernel with V through shared
#    memory (the A/B owed since session 20), and the new lazy rescaling (config.triton_fp8_lazy_rescale:
#    the accumulator's 128 multiplies per thread skipped on tiles that do not raise a row's maximum by
#    more than 2^8). Prediction: if the tile loop's issue time binds on the H200, both the Gluon kernel
#    (loop -26%) and lazy rescaling (-7% of the loop's work) gain there (3-8%); if not, all within +-2%
#    as on the H100. The Gluon kernels bit-identical to off; lazy not, with err_exact within 1.10x of off.
# 2. Three stages at that launch (Triton double-buffers K+V at 41 KB: 5 programs per SM instead of 8),
#    4096 programs. Prediction: slower at TP1 and TP4 (occupancy), as on the H100.
# 3. compute-sanitizer memcheck of the Pallas merge's 128-wide 1-warp row (memcheck.py shape 4), pallas
#    and triton, with the planted control (gpu_next_m.sh's part 1). Prediction: 0 errors, control reports.
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$card" == *H200* ]]; then
  timeout -s INT 280 python3 tools/fp8_kernel_ab.py --impl triton --programs 2048,4096 --geometries TP1,TP4 \
    --configs table --runs 2 --n-sets 6 --knob triton_fp8_gluon_split \
    --knob triton_fp8_gluon_split+triton_fp8_gluon_values_shared --knob triton_fp8_lazy_rescale \
    --out "$OUT/ab" > "$OUT/ab.log" 2>&1
  echo "ab rc=$?"
  timeout -s INT 100 python3 tools/fp8_kernel_ab.py --impl triton --programs 4096 --geometries TP1,TP4 \
    --configs table,32/1/1/3 --runs 2 --n-sets 6 --out "$OUT/stages" > "$OUT/stages.log" 2>&1
  echo "stages rc=$?"
else
  timeout -s INT 200 python3 tools/fp8_kernel_ab.py --impl triton --programs 2048,4096 --geometries TP1,TP4 \
    --configs table --runs 2 --n-sets 6 --knob triton_fp8_lazy_rescale --out "$OUT/ab" > "$OUT/ab.log" 2>&1
  echo "ab rc=$?"
fi
IMPLS="pallas triton" PARTS="sparse4" PART_TIMEOUT=60 bash tools/gpu_memcheck_parts.sh > /dev/null
cat "$OUT/memcheck_summary.log"
grep -hE "programs|knob=|bit-identical" "$OUT/ab.log" "$OUT/stages.log" 2>/dev/null | sed 's/ \[.*//' | cut -c1-150
true
