#!/usr/bin/env bash
# Session 7, call D (the last ~4 min of device time), in order of need:
#  1. the shim's GPU ordering / in-place tests on both out= routes (call C's run stopped at a
#     bookkeeping assert before the stale-read check; fixed),
#  2. the shim's eager grid against the originals (same tensors and fresh q/gate objects),
#  3. compute-sanitizer memcheck of the jax-triton kernels (changed since their last run),
#  4. the shim's single-shape host profile (TP1, 1 row).
# Usage (device tool; carry .whl .cache/originals): bash tools/gpu_session7_d.sh
source tools/gpu_env.sh
set -o pipefail
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/test_shim*.py \
  -k "(race or identity) and TP1 or fast_import_route" > "$OUT/shim7_gpu_tests.log" 2>&1
echo "shim gpu tests rc=$? (${SECONDS} s)"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/shim7_gpu_tests.log" | tail -6
timeout 80 python3 tools/profile_shim.py --tp TP1 --grid 1,8,64,512,2048 > "$OUT/shim7_grid.log" 2>&1
echo "shim grid rc=$? (${SECONDS} s)"; tail -n 9 "$OUT/shim7_grid.log"
NO_PLANT=1 IMPLS=triton PART_TIMEOUT=30 bash tools/gpu_memcheck_parts.sh > /dev/null 2>&1
echo "triton memcheck (${SECONDS} s)"; cat "$OUT/memcheck_summary.log"
mkdir -p "$OUT/memcheck_triton" && mv "$OUT"/memcheck_triton_*.log "$OUT/memcheck_triton/" 2>/dev/null
tar -C "$OUT" -czf "$OUT/memcheck_triton.tgz" memcheck_triton && rm -rf "$OUT/memcheck_triton"
timeout 50 python3 tools/profile_shim.py --tp TP1 --rows 1 > "$OUT/shim7_profile.log" 2>&1
echo "profile rc=$? (${SECONDS} s)"; grep -A40 "^shim host profile" "$OUT/shim7_profile.log" | head -40
