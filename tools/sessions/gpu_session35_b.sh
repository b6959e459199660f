#!/usr/bin/env bash
# Session 35, call b (carry .whl .cache/originals; <= 560 s), whichever card comes.
# Every card: the GPU tests of the register cap and of the image hook, with call a's failing test fixed
# (test_gpu_jax_route_runs_the_torch_routes_cubins[e4m3-200] now clears the shim's own jitted JAX route),
# the rest of tests/test_shim_direct.py's GPU tests, and every fp8 knob's bit-identity test. Prediction: all pass.
# An H200 then runs what is owed there since session 33/34 (gpu_next_m.sh): the gather roofline first
# (prediction: 95-105% of copy, so the H200's 82-89% is the kernel's), then the Gluon / lazy-rescaling
# A/B at the fp8 table's one-split launch (prediction: as on the H100, no gain of 3% or more).
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
timeout -k 10 -s INT 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/test_triton_images.py \
  tests/test_shim_direct.py tests/test_fp8.py::test_gpu_fp8_knob_is_bit_identical > "$OUT/cap_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$OUT/cap_tests.log" | tail -5 | cut -c1-200
[[ "$card" == *H200* ]] || exit 0
bash tools/sessions/gpu_next_m.sh
