#!/usr/bin/env bash
# Session 8, call A (about 6 min of device time):
#  1. tools/sessions/gpu_shim7.sh with the fresh-activation imports merged (branch shimfresh): the
#     shim's GPU stream-order / in-place tests on both out= routes, the eager grid against
#     the originals (same tensors and new q/gate objects each call), the host profile;
#  2. the token-major backward (order="inverted") against the default at TP1 1024 rows
#     (tests/test_gpu_backward.py, never run on a GPU before);
#  3. compute-sanitizer memcheck of the jax-triton kernels (changed since their last run).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session8_a.sh
bash tools/sessions/gpu_shim7.sh
source tools/gpu_env.sh > /dev/null
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rA -s tests/test_gpu_backward.py \
  -k "variants_agree and inverted" > "$OUT/backward_inverted_gpu.log" 2>&1
echo "inverted gpu test rc=$?"; grep -E "GRAD|passed|failed" "$OUT/backward_inverted_gpu.log" | tail -6
NO_PLANT=1 IMPLS=triton PART_TIMEOUT=30 timeout 160 bash tools/gpu_memcheck_parts.sh > /dev/null 2>&1
echo "triton memcheck (${SECONDS} s)"; cat "$OUT/memcheck_summary.log"
mkdir -p "$OUT/memcheck_triton" && mv "$OUT"/memcheck_triton_*.log "$OUT/memcheck_triton/" 2>/dev/null
tar -C "$OUT" -czf "$OUT/memcheck_triton.tgz" memcheck_triton && rm -rf "$OUT/memcheck_triton"
