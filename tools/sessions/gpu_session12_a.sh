#!/usr/bin/env bash
# Session 12, call a (about 9 min of device time): re-run on the H200 what session 11 changed
# after its last GPU check.
#  1. GPU tests: the cached triton-torch launch (counter before/after, fresh signature, weakref),
#     fp8 parity against 0.34.0 and exact (incl. Pallas at 2 warps on the 33-128-program fp8
#     jax-triton entries, Tiling.pallas_warps), the backward at real shapes (direct page writes),
#     the shim's 0.34 signatures, then the remaining shim and kernel GPU tests while time lasts.
#  2. compute-sanitizer memcheck: the Pallas backward (direct page writes into the zero-filled
#     gradient), the jax-triton and Pallas fp8 kernels, and the planted control.
# Prediction: every test passes; memcheck 0 errors on each part, the planted control reports
# its planted error.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session12_a.sh
source tools/gpu_env.sh
set -o pipefail
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --durations=12 \
  tests/test_shim_direct.py tests/test_fp8.py tests/test_gpu_backward.py tests/test_shim_vllm034.py \
  tests/test_shim.py tests/test_pallas.py tests/test_triton.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -12
PART_TIMEOUT=70 IMPLS=pallas PARTS="backward fp8" bash tools/gpu_memcheck_parts.sh > "$OUT/memcheck_pallas.log" 2>&1
NO_PLANT=1 PART_TIMEOUT=60 IMPLS=triton PARTS="fp8" bash tools/gpu_memcheck_parts.sh > "$OUT/memcheck_triton.log" 2>&1
echo "compute-sanitizer memcheck:"; grep -h MEMCHECK "$OUT"/memcheck_pallas.log "$OUT"/memcheck_triton.log
