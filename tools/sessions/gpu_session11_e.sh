#!/usr/bin/env bash
# Session 11, call e (about 6 min of device time):
#  1. triton-torch's GPU tests again, after the cached launch stopped holding the compiling call's
#     tensors (a weakref check added);
#  2. the benchmark with its new shim-tt implementation (the shim's implementation="triton-torch"),
#     TP1 and TP4, bf16 and fp8, beside both originals and the shim's default route: the main
#     job's path on the GPU, with the eager ratios;
#  3. jax-triton bf16 at 4096 programs (TP1 2048 rows) at tilings other than (64, 1, 2), where
#     triton-torch measured 1.03x of the original (calls c/d): is any of them faster?
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session11_e.sh
source tools/gpu_env.sh
set -o pipefail
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/test_shim_direct.py > "$OUT/direct_gpu_tests.log" 2>&1
echo "direct gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/direct_gpu_tests.log" | tail -8
timeout 240 python3 -m bench.run --impl original,original034,shim,shim-tt --op sparse --tp TP1,TP4 \
  --rows 1,64,512,2048 --kv-dtype bf16,fp8 --out "$OUT/bench_shim" > "$OUT/bench_shim.log" 2>&1
echo "bench rc=$?"; tail -n 30 "$OUT/bench_shim.log" | grep -v -i warn
timeout 90 python3 tools/fp8_kernel_ab.py --kv-dtype bf16 --geometries TP1 --impl triton --programs 4096 \
  --configs original,64/1/2/3,32/1/1/2,64/1/4/2 --out "$OUT/bf16_4096" 2>&1 | grep -v -i warning \
  | tee "$OUT/bf16_4096.log" | grep -E "programs|x\) err"
