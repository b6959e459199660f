#!/usr/bin/env bash
# For the next lent GPU (prepared in session 32 as call f, which never got a machine; carry .whl .cache/originals; <= 280 s; any Hopper, the second part on an H200 only):
# 1. compute-sanitizer memcheck of the Pallas merge's 128-wide 1-warp row (config.PALLAS_MERGE_LAYOUTS,
#    257-384 pairs, adopted after call d) through tools/memcheck.py's new shape 4 (32 rows x 12
#    heads = 384 pairs, 16 splits), pallas and triton (jax-triton's merge: D whole on 2 warps there),
#    with the planted control. Prediction: 0 errors, launches agree with XLA, the control reports.
# 2. On an H200 only: call e's Gluon A/B (jax-triton at the fp8 table's one-split launch, 2048 / 4096
#    programs, TP1 / TP4, the Triton kernel against both Gluon forms). Prediction: bit-identical;
#    V through shared memory -2 to -5% at TP1, within +-3% at TP4 (on the H100, call e: -0.1 to +1.2%).
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
IMPLS="pallas triton" PARTS="sparse4" PART_TIMEOUT=90 bash tools/gpu_memcheck_parts.sh > /dev/null
cat "$OUT/memcheck_summary.log"
if [[ "$card" == *H200* ]]; then
  timeout -s INT 170 python3 tools/fp8_kernel_ab.py --impl triton --programs 2048,4096 --geometries TP1,TP4 \
    --configs table --runs 2 --n-sets 6 --knob triton_fp8_gluon_split \
    --knob triton_fp8_gluon_split+triton_fp8_gluon_values_shared --out "$OUT/gluon" > "$OUT/gluon.log" 2>&1
  echo "gluon ab rc=$?"; grep -E "programs|knob=|bit-identical" "$OUT/gluon.log" | sed 's/ err .*\[/ [/' | cut -c1-160
fi
true
