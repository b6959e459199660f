#!/usr/bin/env bash
# Session 7 (issue 16): the token-major dK/dV backward, order="inverted", on the GPU; one
# device call of at most ~4 minutes plus start-up:
#   1. tests/test_gpu_backward.py -k "variants_agree and inverted": order="inverted"
#      against the default at TP1 1024 rows with shared pages,
#      edge rows and NaN in every unreferenced row (which must get exactly 0)
#   2. bench.backward at TP1, 1024 rows, for 1024 requests (random shared pages of a 1 GB
#      pool) and for 1 request (one long sequence): forward, backward (default, selection
#      walk), backward inverted (32 and 64 lanes), grad pallas (default) and grad pallas with order=inverted
#      -> $OUT/<card>_<date>/backward7/{backward.json,backward.md,bench_backward.log,gpu_tests.log}
# Usage (device tool; no carry needed): bash tools/sessions/gpu_backward7.sh
# Knobs: BWD7_TESTS=0 skips 1; BWD_VARIANTS (default inverted,inverted:16:8:0:64: 32 and 64 lanes),
# BWD_ARGS (extra bench flags); TESTS_TIMEOUT / BENCH_TIMEOUT (default 80 / 150 s).
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')
res="$OUT/${card}_$(date +%F)/backward7"  # two folders down: what the device tool returns
mkdir -p "$res"
if [ "${BWD7_TESTS:-1}" != 0 ]; then
  timeout "${TESTS_TIMEOUT:-80}" python3 -m pytest -q -s -m gpu -p no:cacheprovider -rfE \
    -k "variants_agree and inverted" tests/test_gpu_backward.py > "$res/gpu_tests.log" 2>&1
  echo "gpu variant tests rc=$?"; grep -E "GRAD|passed|failed|FAILED|ERROR" "$res/gpu_tests.log" | tail -20
fi
timeout -s TERM "${BENCH_TIMEOUT:-150}" python3 -m bench.backward --tp TP1 --rows 1024 --requests 0,1 \
  --no-acq-rel --no-xla --variants "${BWD_VARIANTS:-inverted,inverted:16:8:0:64}" --grad-orders inverted \
  --out "$res" ${BWD_ARGS:-} > "$res/bench_backward.log" 2>&1
echo "bench.backward rc=$?"; grep -E "^\| TP" "$res/bench_backward.log" | tail -20
