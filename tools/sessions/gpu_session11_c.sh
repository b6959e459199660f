#!/usr/bin/env bash
# Session 11, call c (about 6 min of device time): checks after the changes that calls a and b
# motivated -- the jax-triton index prefetch off (config.triton_prefetch), H200_FP8 entries at
# 0.34.0's one-warp tiling for 33-512 programs (jax-triton), and triton-torch's cached
# compiled-kernel launch (hooks: Triton 3.6's empty HookChain counts as none).
#  1. GPU tests: triton-torch (tests/test_shim_direct.py), jax-triton (tests/test_triton.py) and
#     fp8 parity against 0.34.0 and exact (tests/test_fp8.py);
#  2. fp8, the library's choice against 0.34.0 at 32-512 programs (TP1, TP4);
#  3. triton-torch against both originals (TP1, bf16 and fp8): kernel and eager time.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session11_c.sh
source tools/gpu_env.sh
set -o pipefail
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/test_shim_direct.py tests/test_triton.py \
  tests/test_fp8.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -12
timeout 100 python3 tools/fp8_kernel_ab.py --geometries TP1,TP4 --impl auto --programs 32,64,128,256,512 \
  --configs table --out "$OUT/fp8_auto" 2>&1 | grep -v -i warning | tee "$OUT/fp8_auto.log" | grep -E "x\) err"
timeout 200 python3 tools/triton_torch_ab.py --rows 1,8,64,512,2048 --tp TP1 --kv bf16,fp8 \
  --out "$OUT/triton_torch" 2>&1 | grep -v -i warning > "$OUT/triton_torch.log"
echo "triton_torch rc=$?"; grep -E "^\||^TP|launches|Error" "$OUT/triton_torch.log" | grep -v -- "---" | tail -60
