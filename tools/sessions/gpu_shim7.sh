#!/usr/bin/env bash
# Session 7, shim host cost (issue 17 item 6; notes/shim.md "Session 7"): the GPU tests
# that guard stream order and in-place writes on both out= routes, then the eager grid of
# the originals against the shim's routes (TP1 at 1, 8, 64, 512, 2048 rows), then the
# single-shape profile (TP1 1 row) with the new pieces. About 3 minutes.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_shim7.sh
source tools/gpu_env.sh
set -o pipefail
timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_shim*.py \
  -k "(race or identity) and TP1 or fast_import_route" > "$OUT/shim7_gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/shim7_gpu_tests.log" | tail -12
timeout 120 python3 tools/profile_shim.py --tp TP1 --grid 1,8,64,512,2048 > "$OUT/shim7_grid.log" 2>&1
echo "grid rc=$?"; tail -n 12 "$OUT/shim7_grid.log"
timeout 60 python3 tools/profile_shim.py --tp TP1 --rows 1 > "$OUT/shim7_profile.log" 2>&1
echo "profile rc=$?"; grep -A45 "^shim host profile" "$OUT/shim7_profile.log"
