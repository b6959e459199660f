#!/usr/bin/env bash
# Session 35, call g (carry .whl .cache/originals; <= 300 s), whichever card comes. After call f, Pallas keeps
# its own split counts at the wave-filling bands (Tiling.pallas_splits: its sweep's bucket winners, 8 / 4 / 4 / 2
# at 33-66 / 67-176 / 265-352 programs), which call f's parity run did not launch.
# 1. Pallas's count against the neighbours at the bands call f did not time: 150 and 170 programs (4 against
#    6), 300 (2 against 3 and 4), TP1 and TP4. Prediction: its count within 5% of the fastest Pallas tiling.
# 2. GPU parity of every implementation against 0.34.0 and exact attention, e4m3 caches, TP1/TP2/TP4 at
#    GPU_ROWS (150 rows: Pallas at 4 and 2 splits where jax-triton runs 6 and 3). Prediction: all pass.
source tools/gpu_env.sh
set -o pipefail
timeout -k 10 -s INT 60 python3 tools/fp8_kernel_ab.py --impl pallas --configs table,32/2/1/2,32/3/1/2,32/4/1/2,32/6/1/2 \
  --programs 150,170,300 --geometries TP1,TP4 --runs 2 --n-sets 6 --out "$OUT/pallas" > "$OUT/pallas.log" 2>&1
echo "pallas rc=$?"; grep -hE "programs|pallas" "$OUT/pallas.log" | sed 's/ \[.*//; s/ knob=off//' | cut -c1-100
timeout -k 10 -s INT 200 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE tests/test_fp8.py::test_gpu_fp8_parity \
  -k "e4m3 and not bytes" > "$OUT/parity.log" 2>&1
echo "parity rc=$?"; grep -E "passed|failed|Error" "$OUT/parity.log" | tail -5 | cut -c1-200
grep -E "FP8PARITY .*impl=pallas rows=150" "$OUT/parity.log" | cut -c1-160
true
