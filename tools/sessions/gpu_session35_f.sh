#!/usr/bin/env bash
# Session 35, call f (carry .whl .cache/originals; <= 560 s), whichever card comes. Issue 13: the fp8 table's
# wave-filling split counts (config.H200_FP8, 25-528 programs: the largest of 16 / 8 / 6 / 4 / 3 / 2 splits
# with splits x programs <= 1056, from calls d and e) checked on the GPU before they land.
# 1. The library's own call (implementation=None) beside 0.34.0 at 40-1024 programs, TP1 and TP4, the run
#    recording the entry it took. Prediction: <= 1.01x of 0.34.0 everywhere (calls d/e: 0.72-1.01x at these
#    counts), where the old buckets were 1.07-1.10x at 132 programs.
# 2. The band's low end, 40 and 48 programs (16 splits fill 61-73% of a wave where 8 filled 30-36%):
#    jax-triton at 8 and 16 splits. Prediction: 16 within 3% of the faster, faster than 8 at 40.
# 3. Pallas (where jax-triton is missing, or asked for) at the new counts with its 2 warps, against its old
#    entry's: 64 (16 vs 8 splits), 100 / 132 (8 vs 4). Prediction: no slower than the old entry (the same
#    wave arithmetic at 2 warps), within 5%.
# 4. GPU parity of every implementation against 0.34.0 and exact attention at tests/test_fp8.py's GPU_ROWS,
#    now with 150 rows (TP2/TP4 150 programs: 6 splits; TP1 300: 3 splits). Prediction: all pass.
source tools/gpu_env.sh
set -o pipefail
timeout -k 10 -s INT 110 python3 tools/fp8_kernel_ab.py --impl auto --configs table \
  --programs 40,64,100,132,150,170,200,300,396,512,528,1024 --geometries TP1,TP4 --runs 2 --n-sets 6 \
  --out "$OUT/auto" > "$OUT/auto.log" 2>&1
echo "auto rc=$?"; grep -hE "programs|table" "$OUT/auto.log" | sed 's/ \[.*//; s/ knob=off//' | paste - - | cut -c1-120
timeout -k 10 -s INT 60 python3 tools/fp8_kernel_ab.py --impl triton --configs table,32/8/1/2,32/16/1/2 \
  --programs 40,48 --geometries TP1,TP4 --runs 2 --n-sets 6 --out "$OUT/low" > "$OUT/low.log" 2>&1
echo "low rc=$?"; grep -hE "programs|triton" "$OUT/low.log" | sed 's/ \[.*//; s/ knob=off//' | cut -c1-100
timeout -k 10 -s INT 90 python3 tools/fp8_kernel_ab.py --impl pallas --configs table,32/16/2/2,32/8/2/2,32/4/2/2 \
  --programs 64,100,132 --geometries TP1,TP4 --runs 2 --n-sets 6 --out "$OUT/pallas" > "$OUT/pallas.log" 2>&1
echo "pallas rc=$?"; grep -hE "programs|pallas" "$OUT/pallas.log" | sed 's/ \[.*//; s/ knob=off//' | cut -c1-100
timeout -k 10 -s INT 250 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE tests/test_fp8.py::test_gpu_fp8_parity \
  > "$OUT/parity.log" 2>&1
echo "parity rc=$?"; grep -E "passed|failed|Error" "$OUT/parity.log" | tail -5 | cut -c1-200
grep -E "FP8PARITY .*rows=150" "$OUT/parity.log" | cut -c1-160 | head -12
true
