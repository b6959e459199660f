#!/usr/bin/env bash
# Session 12, call c (about 6 min of device time): call b's one failure,
# test_gpu_sparse_matches_original_identical_call[TP2-16-None] (the default route, triton-torch,
# against vLLM 0.30.0 at 0.30.0's tiling: 16 programs, 64 splits); TP1-16 and TP4-16 passed.
#  1. tools/route_diff.py at TP2 16 rows (0.30.0's table, then the library's), TP4 16 as the
#     control: each route's fidelity to 0.30.0, NaNs, the vectors off, repeat determinism.
#  2. the shim GPU tests call b's time limit cut off (TP4 strided q / in place / memory, store
#     and compress), and the swap-in check with a longer limit.
# Prediction: triton-torch differs from jax-triton through JAX ("triton") at TP2 16 rows, i.e.
# a launch-level difference of the direct route (an output buffer or a split left unwritten),
# not the kernel; the other tests pass.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session12_c.sh
source tools/gpu_env.sh
set -o pipefail
for spec in "--tp TP2 --rows 16" "--tp TP2 --rows 16 --table None" "--tp TP4 --rows 16"; do
  timeout 90 python3 tools/route_diff.py $spec 2>&1 | grep -v -i warn | tee -a "$OUT/route_diff.log" | tail -6
done
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short tests/test_shim.py \
  -k "(TP4 and (strided_q or in_place or torch_keeps)) or store_and or (TP2-16 and identical_call)" \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Error|assert" "$OUT/gpu_tests.log" | tail -12
timeout 150 python3 tools/swap_in_check.py --quick > "$OUT/swap_in.log" 2>&1
echo "swap-in rc=$?"; grep -c ^PASS "$OUT/swap_in.log"; grep -v "^PASS" "$OUT/swap_in.log" | tail -4
