#!/usr/bin/env bash
# Session 12, call g -- NOT RUN: the session's device time was spent (a start was refused). For the
# next session (about 2 min of device time): after the review of calls a-f.
#  1. the capture test again, now also checking that a call whose layout needs the JAX route
#     raises inside a capture (and skipping on the route's own conditions: CUDA, sm_80+, not ROCm);
#  2. the default route against vLLM 0.30.0 at 1 row (2-4 programs, whose launch call e's fix
#     changed: 64 splits, not 65), each call counted as a direct launch.
# Prediction: all pass, the 1-row cases bit-identical or within a few ulps of 0.30.0.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session12_g.sh
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 110 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short tests/test_shim_direct.py \
  tests/test_shim.py -k "captures or (identical_call and -1-None)" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Error" "$OUT/gpu_tests.log" | tail -12
