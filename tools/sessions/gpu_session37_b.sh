#!/usr/bin/env bash
# Session 37, call b (any 132-SM Hopper; carry .whl .cache/originals; <= 560 s). Call a (gpu_session37_a.sh,
# H100) found the fp8 table's one split at 1.15-1.23x of 0.34.0 at 1100-1200 programs (1.04-1.14 waves of
# the one-warp kernel's 1056), 4 splits there at 0.98-0.99x, 2 splits fastest at 1320-1584 (0.92-0.99x),
# one split fastest at 800 and 1000, and at 600 3 splits faster (by 1% at TP1, 14% at TP4). Session 21:
# one split 4% faster than 2 at 2048. The working tree's fp8 table takes 4 splits at 1057-1260 programs
# and 2 at 1261-1850, provisionally (the "table" runs below time it). This call places the boundaries:
# 1. fp8, jax-triton, 1-4 splits at 1056 (one split is exactly one wave), 1080, 1150, 1260, 1380,
#    1700-2000, and at 560-750. Prediction: one split fastest at 1056, 4 splits from 1080 to ~1250, 2
#    splits to ~1850, one split again from ~1900 (1.8 waves); 3 splits fastest at 560-650.
# 2. The fp8 GPU parity (tests/test_fp8.py) at 560 and 700 rows (TP1's 1120 and 1400 programs: the
#    provisional 4- and 2-split bands), every implementation against 0.34.0 and exact attention.
#    Prediction: 9 passed.
# 3. bf16, Pallas (2 warps, 4 programs per SM, 528 per wave), 1-4 splits at 1100-1800: the same wave
#    arithmetic at 2.08-3.4 waves. Prediction: one split within 3% of the fastest everywhere except just
#    past 1056 (1100: 2.08 waves, where 2 or 3 splits win by 5-10%).
source tools/gpu_env.sh > /dev/null
set -o pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout -k 5 -s INT 170 python3 tools/fp8_kernel_ab.py --impl triton \
  --configs table,32/1/1/2,32/2/1/2,32/3/1/2,32/4/1/2 \
  --programs 1056,1080,1150,1260,1380,1700,1800,1900,2000,560,650,700,750 \
  --geometries TP1,TP4 --runs 2 --n-sets 6 --out "$OUT/fp8" > "$OUT/fp8.log" 2>&1
echo "fp8 rc=$?"
QSA_FP8_PARITY_ROWS=560,700 timeout -k 10 -s INT 150 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE \
  "tests/test_fp8.py::test_gpu_fp8_parity" > "$OUT/fp8_parity.log" 2>&1
echo "fp8 parity rc=$?"; grep -E "passed|failed|Error" "$OUT/fp8_parity.log" | tail -3 | cut -c1-200
grep -E "^FP8PARITY TP1" "$OUT/fp8_parity.log" | cut -c1-170 | head -12
timeout -k 5 -s INT 200 python3 tools/fp8_kernel_ab.py --kv-dtype bf16 --impl pallas \
  --configs table,32/1/2/3,32/2/2/3,32/3/2/3,32/4/2/3 --programs 1100,1200,1320,1450,1584,1800 --geometries TP1,TP4 \
  --runs 2 --n-sets 6 --out "$OUT/bf16" > "$OUT/bf16.log" 2>&1
echo "bf16 rc=$?"
for f in fp8 bf16; do
  grep -hE "programs|(triton|pallas) 32" "$OUT/$f.log" | sed 's/ \[.*//; s/ knob=off//; s/ err .*//; s/ us / /' | paste - - - - - | cut -c1-200
done
true
