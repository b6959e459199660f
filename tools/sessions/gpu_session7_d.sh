#!/usr/bin/env bash
# Session 7, call D (about 4 min of device time; not yet run):
#  1. tools/sessions/gpu_shim7.sh: the shim's GPU ordering / in-place tests on both out= routes (call
#     C's run stopped at a bookkeeping assert before the stale-read check; fixed), the eager
#     grid against the originals (same tensors and fresh q/gate objects), the host profile;
#  2. compute-sanitizer memcheck of the jax-triton kernels (changed since their last run).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session7_d.sh
bash tools/sessions/gpu_shim7.sh
source tools/gpu_env.sh > /dev/null
NO_PLANT=1 IMPLS=triton PART_TIMEOUT=30 bash tools/gpu_memcheck_parts.sh > /dev/null 2>&1
echo "triton memcheck (${SECONDS} s)"; cat "$OUT/memcheck_summary.log"
mkdir -p "$OUT/memcheck_triton" && mv "$OUT"/memcheck_triton_*.log "$OUT/memcheck_triton/" 2>/dev/null
tar -C "$OUT" -czf "$OUT/memcheck_triton.tgz" memcheck_triton && rm -rf "$OUT/memcheck_triton"
