#!/usr/bin/env bash
# Session 11, call d (about 4 min of device time): triton-torch as changed after call c -- a bf16
# cache on the shim's default table launches vLLM 0.30.0's tiling (_direct.BF16_DEFAULT_TABLE) --
# its GPU tests (bit-identical to implementation="triton" at that table, torch's stream, the cached
# launch) and the eager grid against the original (tools/profile_shim.py, TP1).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session11_d.sh
source tools/gpu_env.sh
set -o pipefail
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/test_shim_direct.py > "$OUT/direct_gpu_tests.log" 2>&1
echo "direct gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/direct_gpu_tests.log" | tail -8
timeout 200 python3 tools/profile_shim.py --tp TP1 --grid 1,8,64,512,2048 > "$OUT/grid_tp1.log" 2>&1
echo "grid rc=$?"; grep -v -i warn "$OUT/grid_tp1.log" | tail -n 9
