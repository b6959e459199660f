#!/usr/bin/env bash
# Session 11, call b (about 8 min of device time), after call a (gpu_session11_a.sh) found:
# jax-triton at 0.34.0's own tiling beats the library at fp8 64-512 programs only with its index
# prefetch off, and triton-torch's kernels are 1.0-1.7x the originals' at the same tilings.
#  1. the shim's triton-torch GPU tests, now with the cached compiled-kernel launch
#     (_private_api.TritonLaunch): same bits as the jit launch, torch's stream, alignment keys;
#  2. tools/triton_torch_ab.py --prefetch-off (now --prefetch-on: the default became off): kernel and eager time of triton-torch at each tiling
#     table, with the prefetch as today and off, against both originals;
#  3. fp8 at the one-warp jax-triton entries (256-4096 programs): the library's choice with the
#     prefetch off (knob off) and on (today's default there).
# Prediction: the cached launch cuts triton-torch's host enqueue by 10-30 us per call (two
# JITFunction.run lookups); prefetch off brings jax-triton at the originals' tiling within +-3% of
# their kernel time, and helps the one-warp fp8 entries at TP1.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session11_b.sh
source tools/gpu_env.sh
set -o pipefail
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/test_shim_direct.py \
  > "$OUT/direct_gpu_tests.log" 2>&1
echo "direct gpu tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|Error" "$OUT/direct_gpu_tests.log" | tail -16
timeout 150 python3 tools/fp8_kernel_ab.py --geometries TP1,TP4 --impl auto --programs 256,1024,2048,4096 \
  --configs table --knob triton_prefetch --out "$OUT/fp8_prefetch" 2>&1 | grep -v -i warning \
  | tee "$OUT/fp8_prefetch.log" | grep -E "programs|x\) err|rc="
timeout 330 python3 tools/triton_torch_ab.py --rows 1,8,64,512,2048 --tp TP1,TP4 --kv bf16,fp8 --prefetch-on \
  --out "$OUT/triton_torch" 2>&1 | grep -v -i warning > "$OUT/triton_torch.log"
echo "triton_torch rc=$?"; grep -E "^\||^TP|launches|Error" "$OUT/triton_torch.log" | grep -v -- "---" | tail -150
