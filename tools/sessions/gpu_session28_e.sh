#!/usr/bin/env bash
# Session 28, call e (any H100/H200; carry .whl .cache/originals; <= 300 s), after the review of
# the Triton-image hook: a fallback when assembling fails, install() wrapping the rule in place,
# the cache keyed by Triton's ptxas settings, and a GPU test that compares the carried image with
# the torch route's own cubin (the first version compared it with the cache it came from).
# 1. tests/test_triton_images.py (GPU) and the new test in tests/test_shim_direct.py (bf16, e4m3).
#    Prediction: all pass; the PTX jax-triton lowers equals the torch route's (session 27 call c
#    saw it for the split kernel after stripping debug lines; here unstripped) and the images equal
#    its cubins byte for byte.
# 2. memcheck of the Gluon fp8 part through jax-triton, which ran out of call d's 45 s (11 launches
#    checked by then). Prediction: 0 errors.
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_triton_images.py \
  tests/test_shim_direct.py -k "triton_images or jax_route_runs_the_torch_routes_cubins" \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " "$OUT/gpu_tests.log" | head -20
IMPLS=triton PARTS=fp8_gluon NO_PLANT=1 PART_TIMEOUT=150 bash tools/gpu_memcheck_parts.sh
true
