#!/usr/bin/env bash
# Session 12, call d (about 4 min of device time): the jax-triton merge now sums the splits as
# the originals do (D whole, 2 warps) wherever the tiling is not the library's measured table
# (config.triton_launch). Call c: at TP2 16 rows (64 splits) on 0.30.0's table, "triton" and
# triton-torch were 3.4e-4 from vLLM 0.30.0 (over the 3e-4 fidelity bar), Pallas 6.5e-6.
#  1. tools/route_diff.py, TP2 and TP4 at 16 rows, 0.30.0's table;
#  2. the shim-vs-original GPU tests at 16 rows on both routes, TP1/TP2/TP4, and triton-torch
#     against the JAX route and in a CUDA graph (its split + merge launch at 4 rows).
# Prediction: triton / triton-torch at TP2 16 rows within a few ulps of 0.30.0 (Pallas-like,
# rel ~1e-5); all the tests pass.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session12_d.sh
source tools/gpu_env.sh
set -o pipefail
for spec in "--tp TP2 --rows 16" "--tp TP4 --rows 16"; do
  timeout 90 python3 tools/route_diff.py $spec 2>&1 | grep -v -i warn | tee -a "$OUT/route_diff.log" | tail -5
done
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short tests/test_shim.py tests/test_shim_direct.py \
  -k "(identical_call and -16-) or (equals_the_jax_route and 1-) or captures" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Error" "$OUT/gpu_tests.log" | tail -12
