#!/usr/bin/env bash
# Session 20, call b (device tool; carry .whl .cache/originals). Issue 13.
# 1. compute-sanitizer memcheck of the Gluon fp8 split kernel (tools/memcheck.py part fp8_gluon:
#    adversarial metadata, one-warp tilings, V early and late) and the planted control.
#    Prediction: 0 errors; the control reports its invalid reads.
# 2. Triton's kernel at 3 stages (K and V double-buffered, 41 KB shared memory) at 4096 programs:
#    whether overlap beats occupancy for the Triton kernel (session 19's staged V, the same 41 KB
#    without overlap, lost 1.28-1.40x).
source tools/gpu_env.sh
set -o pipefail
IMPLS=triton PARTS=fp8_gluon PART_TIMEOUT=150 bash tools/gpu_memcheck_parts.sh
timeout -s INT 150 python3 tools/fp8_kernel_ab.py --impl triton --programs 4096 --geometries TP1,TP4 \
  --configs table,32/2/1/3 --runs 2 --n-sets 6 --out "$OUT/stages" > "$OUT/stages.log" 2>&1
echo "stages rc=$?"; grep -E "programs|knob=" "$OUT/stages.log" | sed 's/ err .*\[/ [/' | tail -12
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
