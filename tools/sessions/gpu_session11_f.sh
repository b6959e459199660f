#!/usr/bin/env bash
# Session 11, call f (about 5 min of device time): the inverted backward with named pages writes
# them straight into the zero-filled, cache-shaped gradient (a masked store; padding pages write
# nothing), instead of XLA scattering the compacted pages into it afterwards (511-512 us at TP1,
# one 1024-token sequence, session 10).
#  1. the GPU gradient tests at the real shapes (float64 bars, NaN-poisoned unreferenced pages,
#     their gradient exactly zero);
#  2. bench.backward, TP1, one sequence (--requests 1) of 1024 tokens and 64, and 1024 rows with
#     one request per row (not compacted: the control).
# Prediction: the one-sequence backward at 1024 falls from 5.57 ms by ~0.5 ms (the scatter), the
# control unchanged (~5.0 ms).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session11_f.sh
source tools/gpu_env.sh
set -o pipefail
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -rA -s tests/test_gpu_backward.py -k real_shapes \
  > "$OUT/gpu_backward_tests.log" 2>&1
echo "gpu backward tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_backward_tests.log" | tail -8
timeout 130 python3 -m bench.backward --tp TP1 --rows 64,1024 --requests 1,0 --reps 3 --no-acq-rel --no-xla \
  --out "$OUT/bwd_one" 2>&1 | grep -v -i warning | grep "^|"
