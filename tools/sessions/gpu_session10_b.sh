#!/usr/bin/env bash
# After session 9 (not yet run; about 4 min of device time): the shim's
# implementation="triton-torch" (qsa_torch_shim/_direct.py: qsa_jax's jax-triton kernels launched by
# Triton on torch's stream, no JAX dispatch, no fence), built and checked in Triton's interpreter
# on CPU only. Prediction: the eager call within +-10% of the originals' at 1-2048 rows (the same
# launcher, two launches, plus the originals' checks and a cached plan), against 1.06-2.2x for the
# JAX route (session 8).
#  1. its GPU tests: same bits as implementation="triton" at TP1 1/64/1024/2049 rows, bf16 and e4m3,
#     NaN in unreferenced pages and in out; stream order with writes after a sleep on a side stream;
#  2. the eager grid against the originals (tools/profile_shim.py --grid, triton-torch columns).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session10_b.sh
source tools/gpu_env.sh
set -o pipefail
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/test_shim_direct.py \
  > "$OUT/direct_gpu_tests.log" 2>&1
echo "direct gpu tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/direct_gpu_tests.log" | tail -12
timeout 150 python3 tools/profile_shim.py --tp TP1 --grid 1,8,64,512,2048 > "$OUT/direct_grid.log" 2>&1
echo "grid rc=$?"; tail -n 10 "$OUT/direct_grid.log"
