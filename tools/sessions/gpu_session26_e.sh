#!/usr/bin/env bash
# Session 26, call e (carry .whl .cache/originals; <= 590 s). Asked for as kind nvidia-h200:
# - on an H200 (issue 13's card): `gpu_next_g.sh targets` (session 23's prepared targets).
# - on an H100: the GPU tests of the shim, jax-triton, Pallas, Gluon, the strided query and the
#   fused merge at this session's HEAD (the bf16 5-8-program entry, the host scales' type check).
#   Prediction: all pass.
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$card" == *H200* ]]; then
  exec bash tools/sessions/gpu_next_g.sh targets
fi
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 480 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_shim.py tests/test_shim_direct.py \
  tests/test_shim_vllm034.py tests/test_shim_layout.py tests/test_triton.py tests/test_pallas.py tests/test_gluon.py \
  tests/test_strided_query.py tests/test_fused_merge.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -12
true
