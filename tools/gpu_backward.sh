#!/usr/bin/env bash
# Gradients on the GPU (issue 16), one device call of at most 300 s plus start-up:
#   1. tests/test_gpu_backward.py: the Pallas backward against an fp32 reference of the
#      exact gradient at the real shapes (TP1/TP4, D = 256, W = 2051, pages 1600/800), and
#      its variants (order="sorted", acq_rel atomics) against the default
#   2. the toy training example on the GPU (loss must fall)
#   3. bench.backward: busy time and memory of forward, backward (default: relaxed atomics,
#      selection order), the backward with acq_rel atomics (the default before session 6),
#      the backward variants (order="sorted" ...), jax.grad with the pallas and xla backwards,
#      at 1024 rows dealt to 1024 requests (random shared pages of a 1 GB pool, as in session 5)
#      and to 1 request (one long sequence, as in training: tokens shared across rows)
#      -> $OUT/<card>_<date>/backward/{backward.json,backward.md}
# Usage (device tool; no carry needed): bash tools/gpu_backward.sh
#   bench only (at most 280 s): BWD_TESTS=0 bash tools/gpu_backward.sh
# Knobs: QSA_GRAD_ROWS (tests, default 1,1024), BWD_ROWS (bench, default 1024), BWD_REQUESTS
# (default 0,1; 0 = one request per row),
# BWD_VARIANTS (default sorted,sorted:32:8:17), BWD_ARGS (extra bench flags, e.g. --autodiff),
# TESTS_TIMEOUT / BENCH_TIMEOUT (seconds, default 100 / 150, or 280 for the bench alone;
# the toy example gets 50). The bench writes its table after every step: a timeout keeps
# what was measured.
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')
res="$OUT/${card}_$(date +%F)/backward"
if [ "${BWD_TESTS:-1}" != 0 ]; then
  QSA_GRAD_ROWS="${QSA_GRAD_ROWS:-1,1024}" timeout "${TESTS_TIMEOUT:-100}" python3 -m pytest -q -s -m gpu \
    -p no:cacheprovider -rfE tests/test_gpu_backward.py > "$OUT/gpu_backward_tests.log" 2>&1
  echo "gpu backward tests rc=$?"; grep -E "GRAD|passed|failed|FAILED|ERROR" "$OUT/gpu_backward_tests.log" | tail -40
  timeout 50 python3 examples/train_toy.py --steps 300 --implementation pallas > "$OUT/train_toy.log" 2>&1
  echo "train_toy rc=$?"; tail -n 2 "$OUT/train_toy.log"
fi
# The bench alone may take the whole budget; after the tests and the toy example, 150 s.
bench_limit=$([ "${BWD_TESTS:-1}" = 0 ] && echo 280 || echo 150)
timeout -s TERM "${BENCH_TIMEOUT:-$bench_limit}" python3 -m bench.backward --tp TP1 \
  --rows "${BWD_ROWS:-1024}" --requests "${BWD_REQUESTS:-0,1}" --variants "${BWD_VARIANTS:-sorted,sorted:32:8:17}" \
  --out "$res" ${BWD_ARGS:-} > "$OUT/bench_backward.log" 2>&1
echo "bench.backward rc=$?"; grep -E "^\| TP" "$OUT/bench_backward.log" | tail -40
