#!/usr/bin/env bash
# Ran in session 32 on an H200 as call a: bench/results/nvidia-h200_2026-12-06/session32/call_a/ (its README: outcome).
# For the next lent GPU, any card (carry .whl .cache/originals; <= 570 s; then gpu_next_k.sh): GPU proof of session
# 30's merge layouts (config.TRITON_MERGE_LAYOUTS, PALLAS_MERGE_LAYOUTS: 1 warp with 32- or
# 64-wide D chunks at small batches), which session 30's call e timed and held to the fidelity
# contract against the previous default, but did not run through the parity tests:
#   1. test_gpu_fp8_parity, TP1/TP2/TP4, e4m3, e4m3 bytes and bf16 with scales (its GPU_ROWS give
#      6-48 pairs at 1-2 rows and 96-768 at 16-32 rows: both 1-warp layouts), every implementation
#      against 0.34.0 and exact attention;
#   2. test_gpu_parity.py sparse attention, pallas and triton at 1 / 4 / 8 rows (TP1 24 / 96 / 192
#      pairs, TP4 6 / 24 / 48), against 0.30.0 and exact;
#   3. test_gpu_backward.py at 1 row (the Pallas merge that also writes the backward's residuals
#      runs the 1-warp layouts there);
#   4. session 31's shim changes that need a GPU: fp16/fp32 gates on the direct triton-torch
#      launch (test_gpu_triton_torch_float_gates), and the direct route against JAX's at 1 / 64
#      rows (the merge layouts through torch's launch).
# Prediction: all pass. Memcheck of the new layouts and the decode standing: gpu_next_k.sh.
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s tests/test_fp8.py \
  -k "gpu_fp8_parity" > "$OUT/gpu_fp8_parity.log" 2>&1
echo "fp8 parity rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_fp8_parity.log" | tail -8
QSA_PARITY_IMPLS=pallas,triton QSA_PARITY_ROWS=1,4,8 timeout -s INT 150 python3 -m pytest -q -m gpu -s \
  -p no:cacheprovider -rfE tests/test_gpu_parity.py -k sparse_attention > "$OUT/gpu_parity.log" 2>&1
echo "bf16 parity rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_parity.log" | tail -8
QSA_GRAD_ROWS=1 timeout -s INT 110 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE \
  tests/test_gpu_backward.py > "$OUT/gpu_backward.log" 2>&1
echo "backward rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_backward.log" | tail -8
timeout -s INT 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_shim_direct.py \
  -k "float_gates or (equals_the_jax_route and (1- or 64-))" > "$OUT/gpu_shim.log" 2>&1
echo "shim rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_shim.log" | tail -8
true
