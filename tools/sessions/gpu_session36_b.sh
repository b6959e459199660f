#!/usr/bin/env bash
# Session 36, call b (carry .whl .cache/originals; <= 560 s), whichever card comes. The checks session 35
# owed its wave-filling fp8 split counts (config.H200_FP8, 25-528 programs):
# 1. compute-sanitizer memcheck of tools/memcheck.py's fp8 part, jax-triton and Pallas, now with the
#    table's 6- and 3-split tilings forced on its adversarial, poisoned cases (unreferenced K rows large,
#    V rows NaN; -1 / out-of-range indices, counts, block-table entries and request ids), where the merges
#    mask a split block of 8 / 4 rows down to 6 / 3; the planted control first.
#    Prediction: 0 errors, 16 launches each agreeing with XLA; the control reports.
# 2. tests/test_shim_direct.py::test_gpu_jax_route_runs_the_torch_routes_cubins (its form after session
#    35's closing tidy, not rerun on a GPU since). Prediction: 3 passed.
# 3. The bf16 parameter sets of the fp8 GPU parity at TP2 / TP4 (not rerun with the new bands; the change
#    does not touch bf16). Prediction: 2 passed.
source tools/gpu_env.sh > /dev/null
set -o pipefail
PARTS=fp8 PART_TIMEOUT=150 bash tools/gpu_memcheck_parts.sh > "$OUT/memcheck.out" 2>&1
echo "memcheck rc=$?"; cat "$OUT/memcheck_summary.log" | cut -c1-150
timeout -k 10 -s INT 120 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE \
  tests/test_shim_direct.py::test_gpu_jax_route_runs_the_torch_routes_cubins > "$OUT/cubins.log" 2>&1
echo "cubins rc=$?"; grep -E "passed|failed|Error" "$OUT/cubins.log" | tail -3 | cut -c1-200
timeout -k 10 -s INT 150 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE "tests/test_fp8.py::test_gpu_fp8_parity" \
  -k "bf16 and (TP2 or TP4)" > "$OUT/parity_bf16.log" 2>&1
echo "parity rc=$?"; grep -E "passed|failed|Error" "$OUT/parity_bf16.log" | tail -3 | cut -c1-200
true
