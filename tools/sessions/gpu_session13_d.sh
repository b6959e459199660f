#!/usr/bin/env bash
# Session 13, call d (about 6 min of device time): the jax-triton kernels keep rows and requests
# out of Triton's integer specialisation (do_not_specialize, as vLLM's kernels). Call c found the
# one-request variant of the split kernel spilling 308 B/thread at 0.30.0's TP4 512-row launch
# (vLLM's: 28 B), 374 vs 268 us; the CPU compile for sm_90 now gives 32 B.
#  1. tools/split_kernel_probe.py TP4 512 rows, 512- and 4000-page pools;
#  2. the shim's GPU tests of the direct launch (cached launch, bit identity with the JAX route,
#     capture), since the compiled kernels' parameter lists changed;
#  3. tools/profile_shim.py --grid 1,8,64,512,2048, default route × the originals, bf16 (× 0.30.0)
#     and fp8 (× 0.34.0), TP4 and TP1.
# Prediction: 1. triton-torch's split kernel ~268-300 us (0.30.0's), same bits; 2. pass;
# 3. TP4 bf16 512 from 1.38 to <= 1.0, the other cells as in calls a/b (TP1 bf16 2048 ~1.0,
# fp8 TP4 2048 ~1.0-1.05: the kernel at 0.34.0's tiling was 4-7% slower there, not this cause).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session13_d.sh
source tools/gpu_env.sh
set -o pipefail
timeout 90 python3 tools/split_kernel_probe.py --tp TP4 --rows 512 --pages 512,4000 2>&1 | grep -v -i warn \
  | tee "$OUT/probe.log"
timeout -s INT 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short tests/test_shim_direct.py \
  > "$OUT/gpu_tests_direct.log" 2>&1
echo "direct gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests_direct.log" | tail -6
for kv in bf16 fp8; do
  for tp in TP4 TP1; do
    timeout 90 python3 tools/profile_shim.py --grid 1,8,64,512,2048 --tp $tp --kv-dtype $kv \
      --columns "shim default route" > "$OUT/grid_${kv}_$tp.log" 2>&1
    echo "grid $kv $tp rc=$?"; grep -E "^\| (rows|[0-9])|worst" "$OUT/grid_${kv}_$tp.log" | tail -7
  done
done
