#!/usr/bin/env bash
# Gradients on the GPU (issue 16), one device call under the 10-minute limit:
#   1. tests/test_gpu_backward.py: the Pallas backward against an fp32 reference of the
#      exact gradient at the real shapes (TP1/TP4, D = 256, W = 2051, pages 1600/800)
#   2. the toy training example on the GPU (loss must fall)
#   3. bench.backward: busy time and memory of forward, backward, jax.grad (pallas, xla,
#      JAX autodiff of the XLA forward), the backward with acq_rel atomics (the old default) and launch variants
#      -> $OUT/<card>_<date>/backward/{backward.json,backward.md}
# Usage (device tool; no carry needed): bash tools/gpu_backward.sh
# Knobs: QSA_GRAD_ROWS (tests, default 1,64,1024,2048), BWD_ROWS (bench, default
# 64,1024,2048), BWD_VARIANTS (default 32:4,16:4,16:8,64:8), BWD_ARGS (extra bench flags).
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')
res="$OUT/${card}_$(date +%F)/backward"
timeout "${TESTS_TIMEOUT:-250}" python3 -m pytest -q -s -m gpu -p no:cacheprovider -rfE \
  tests/test_gpu_backward.py > "$OUT/gpu_backward_tests.log" 2>&1
echo "gpu backward tests rc=$?"; grep -E "GRAD|passed|failed|FAILED|ERROR" "$OUT/gpu_backward_tests.log" | tail -40
timeout 60 python3 examples/train_toy.py --steps 300 --implementation pallas > "$OUT/train_toy.log" 2>&1
echo "train_toy rc=$?"; tail -n 2 "$OUT/train_toy.log"
timeout -s TERM "${BENCH_TIMEOUT:-260}" python3 -m bench.backward --tp TP1 \
  --rows "${BWD_ROWS:-64,1024,2048}" --variants "${BWD_VARIANTS:-32:4,16:4,16:8,64:8}" \
  --autodiff --out "$res" ${BWD_ARGS:-} > "$OUT/bench_backward.log" 2>&1
echo "bench.backward rc=$?"; grep -E "^\| TP" "$OUT/bench_backward.log" | tail -40
