#!/usr/bin/env bash
# Prepared in session 20, the second call after gpu_next_c.sh (any H100/H200; carry .whl
# .cache/originals): bash tools/sessions/gpu_next_d.sh
# 1. memcheck part fp8_gluon (the Gluon kernel, V through registers and through shared memory,
#    adversarial metadata; each launch checks the plan named the Gluon kernel) and the planted
#    control. Prediction: 0 errors; the control reports its errors.
# 2. The Triton kernel at 3 stages (K and V double-buffered, 41 KB of shared memory, 5 programs
#    per SM instead of 8) at 4096 programs: whether overlap beats occupancy for it (never run;
#    session 19's staged V, the same 41 KB without overlap, lost 1.28-1.40x on an H100).
# Ran in session 21 on an H100 (bench/results/nvidia-h100_2026-12-05/session21/next_d/).
source tools/gpu_env.sh
set -o pipefail
PARTS=fp8_gluon IMPLS=triton PART_TIMEOUT=150 bash tools/gpu_memcheck_parts.sh
timeout -s INT 100 python3 tools/fp8_kernel_ab.py --impl triton --programs 4096 --geometries TP1,TP4 \
  --configs table,32/2/1/3 --runs 2 --n-sets 6 --out "$OUT/stages" > "$OUT/stages.log" 2>&1
echo "stages rc=$?"; grep -E "programs|knob=" "$OUT/stages.log" | sed 's/ err .*\[/ [/' | tail -8
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
