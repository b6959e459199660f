#!/usr/bin/env bash
# Session 13, call i (about 3 min of device time): the split kernel takes the largest valid request
# id (last_request = requests - 1) instead of the count, so that no launcher hands it the constant 1
# for one request: jax_triton.triton_call makes any scalar 1 a constant whatever do_not_specialize
# says (CPU compile for sm_90, jax-triton's rule, TP4 64/4/2: 308 -> 32 B of spills; fp8 one-warp
# launches at TP1 44 -> 20 B).
#  1. tools/split_kernel_probe.py --jax: 0.30.0, triton-torch, and "triton" through JAX at 0.30.0's
#     tiling, TP4 512 rows, one request;
#  2. the shim's direct-launch GPU tests (the kernel's arguments changed);
#  3. tests/test_gpu_parity.py for "triton" at 1 / 16 / 512 / 2048 rows (0.30.0's bits).
# Prediction: 1. all three ~264-270 us on the small pool, relative difference 0; 2-3 pass, triton
# bit-identical to 0.30.0.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session13_i.sh
source tools/gpu_env.sh
set -o pipefail
timeout 100 python3 tools/split_kernel_probe.py --tp TP4 --rows 512 --pages 512,4000 --jax 2>&1 | grep -v -i warn \
  | tee "$OUT/probe.log"
timeout -s INT 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short tests/test_shim_direct.py \
  > "$OUT/gpu_tests_direct.log" 2>&1
echo "direct gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests_direct.log" | tail -6
QSA_PARITY_IMPLS=triton QSA_PARITY_ROWS=1,16,512,2048 timeout -s INT 110 python3 -m pytest -q -m gpu \
  -p no:cacheprovider -rfE -s tests/test_gpu_parity.py -k "sparse_attention" > "$OUT/parity030_triton.log" 2>&1
echo "0.30 parity (triton) rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/parity030_triton.log" | tail -4
grep -o "impl=triton TP[0-9] rows=[0-9]* prefill=[A-Za-z]* cfg=([0-9, ]*) fidelity rel_err=[0-9.e+-]*" "$OUT/parity030_triton.log"
