#!/usr/bin/env bash
# For the next session (carry .whl .cache/originals; <= 420 s; about 330 on an H100). Written in session 37, whose device time
# ran out after its three calls (three refused starts cost ~450 s).
# On an H200: 1. the owed H200 half of gpu_next_m.sh first (tools/gather_roofline.py; prediction there:
#    the gather at 95-105% of copy), then 2. the H200 check of sessions 36-37's split bands, measured on
#    H100s only (the same 132 SMs and registers per program, so the same waves, but 1.4x the bandwidth):
#    fp8 (jax-triton) 1-4 splits at 600, 700, 1100, 1260, 1450 and 1700 programs, bf16 (Pallas) at 600,
#    720, 1100, 1320 and 1450, TP1. Prediction: the table's count within 3% of the fastest at each, as on
#    the H100 (the waves, not the bandwidth, set the boundaries).
# On an H100: 3. fp8 past 2048 programs, where the table has one entry (the large-batch one, one split)
#    however many waves it fills: jax-triton at 1-4 splits at 2112 (two whole waves), 2200, 2400, 2700,
#    3168 (three) and 3300, TP1 / TP4. Prediction, from 1080-1260 (one split just past a whole wave
#    16-26% slower than 4 splits): one split 5-15% slower than the best of 2-4 at 2200-2400 (2.1-2.3
#    waves), within 3% at 2112, 2700 and 3168. A gap that size would need bands above
#    LARGE_BATCH_PROGRAMS, where today the prefill flag picks the entry (config.TilingTable).
#    4. Pallas fp8 at the new bands, which it runs where jax-triton is missing (the entries name no
#    pallas_warps / pallas_splits, so one warp and the entry's count): 1-4 splits at 600, 1100 and 1450
#    programs, TP1. Prediction: the entry's count within 5% of Pallas's fastest (its one-warp kernel has
#    the same 8 programs per SM, session 35 call g); else the entries need pallas_splits.
source tools/gpu_env.sh > /dev/null
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$card"
if [[ "$card" == *H200* ]]; then
  timeout -k 10 -s INT 120 python3 tools/gather_roofline.py --variants 16/1/0,32/1/0,32/1/1,32/4/1 --out "$OUT/roofline" \
    > "$OUT/roofline.log" 2>&1
  echo "roofline rc=$?"; grep -vE "^\s*$|Warning|warn" "$OUT/roofline.log" | tail -30 | cut -c1-160
  timeout -k 5 -s INT 100 python3 tools/fp8_kernel_ab.py --impl triton \
    --configs table,32/1/1/2,32/2/1/2,32/3/1/2,32/4/1/2 --programs 600,700,1100,1260,1450,1700 \
    --geometries TP1 --runs 2 --n-sets 6 --out "$OUT/fp8" > "$OUT/fp8.log" 2>&1
  echo "fp8 rc=$?"
  timeout -k 5 -s INT 150 python3 tools/fp8_kernel_ab.py --kv-dtype bf16 --impl pallas \
    --configs table,32/1/2/3,32/2/2/3,32/3/2/3,32/4/2/3 --programs 600,720,1100,1320,1450 --geometries TP1 \
    --runs 2 --n-sets 6 --out "$OUT/bf16" > "$OUT/bf16.log" 2>&1
  echo "bf16 rc=$?"
else
  timeout -k 5 -s INT 150 python3 tools/fp8_kernel_ab.py --impl triton \
    --configs table,32/1/1/2,32/2/1/2,32/3/1/2,32/4/1/2 --programs 2112,2200,2400,2700,3168,3300 \
    --geometries TP1,TP4 --runs 2 --n-sets 6 --out "$OUT/fp8" > "$OUT/fp8.log" 2>&1
  echo "fp8 rc=$?"
  timeout -k 5 -s INT 120 python3 tools/fp8_kernel_ab.py --impl pallas \
    --configs table,32/1/1/2,32/2/1/2,32/3/1/2,32/4/1/2 --programs 600,1100,1450 \
    --geometries TP1 --runs 2 --n-sets 6 --out "$OUT/fp8_pallas" > "$OUT/fp8_pallas.log" 2>&1
  echo "fp8 pallas rc=$?"
fi
for f in fp8 bf16 fp8_pallas; do
  [ -f "$OUT/$f.log" ] || continue
  grep -hE "programs|(triton|pallas) 32" "$OUT/$f.log" | sed 's/ \[.*//; s/ knob=off//; s/ err .*//; s/ us / /' | paste - - - - - | cut -c1-200
done
true
