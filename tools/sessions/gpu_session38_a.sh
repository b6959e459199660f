#!/usr/bin/env bash
# Session 38, call a (carry .whl .cache/originals; <= 480 s on an H200). Starts were refused first, so the
# parts run in order of what issue 13 needs, the most owed first.
# On an H200 (predictions as in gpu_next_m.sh and the gpu_next_p.sh of session 37):
# 1. tools/gather_roofline.py: is the fp8 kernel's 82-89% of copy (session 32) the access pattern's or
#    the kernel's? Prediction: the best gather at 95-105% of copy.
# 2. The Gluon split kernel (V through shared memory) against the Triton kernel at the fp8 table's
#    one-split launch, 2048 / 4096 programs, TP1 / TP4. Prediction: 3-8% faster if the loop's issue time
#    binds on the H200, within +-2% if not.
# 3. Sessions 36-37's split bands (measured on H100s only), TP1: fp8 (jax-triton) 1-4 splits at 600-1700
#    programs, bf16 (Pallas) at 600-1450. Prediction: the table's count within 3% of the fastest.
# On an H100 (what ran: the H100 branch gpu_next_p.sh had then):
# 4. fp8 past 2048 programs, where the table had one entry (one split): jax-triton 1-4 splits at 2112-3300
#    programs, TP1 / TP4. Prediction: one split 5-15% slower than the best of 2-4 at 2200-2400, within 3% at
#    2112, 2700 and 3168.
# 5. Pallas fp8 at session 37's bands (one warp, 1-4 splits at 600, 1100, 1450, TP1). Prediction: the
#    entry's count within 5% of Pallas's fastest.
set -o pipefail
source tools/gpu_env.sh > /dev/null
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$card"
if [[ "$card" != *H200* ]]; then
  timeout -k 5 -s INT 150 python3 tools/fp8_kernel_ab.py --impl triton \
    --configs table,32/1/1/2,32/2/1/2,32/3/1/2,32/4/1/2 --programs 2112,2200,2400,2700,3168,3300 \
    --geometries TP1,TP4 --runs 2 --n-sets 6 --out "$OUT/fp8" > "$OUT/fp8.log" 2>&1
  echo "fp8 rc=$?"
  timeout -k 5 -s INT 120 python3 tools/fp8_kernel_ab.py --impl pallas \
    --configs table,32/1/1/2,32/2/1/2,32/3/1/2,32/4/1/2 --programs 600,1100,1450 \
    --geometries TP1 --runs 2 --n-sets 6 --out "$OUT/fp8_pallas" > "$OUT/fp8_pallas.log" 2>&1
  echo "fp8 pallas rc=$?"
  exit 0
fi
timeout -k 10 -s INT 110 python3 tools/gather_roofline.py --variants 16/1/0,32/1/0,32/1/1,32/4/1 --out "$OUT/roofline" \
  > "$OUT/roofline.log" 2>&1
echo "roofline rc=$?"; grep -vE "^\s*$|Warning|warn" "$OUT/roofline.log" | tail -30 | cut -c1-160
GLUON=triton_fp8_gluon_split+triton_fp8_gluon_values_shared
timeout -k 5 -s INT 140 python3 tools/fp8_kernel_ab.py --impl triton --programs 2048,4096 --geometries TP1,TP4 \
  --configs table --runs 2 --n-sets 6 --knob $GLUON --out "$OUT/gluon" > "$OUT/gluon.log" 2>&1
echo "gluon rc=$?"
grep -hE "programs|knob=|bit-identical" "$OUT/gluon.log" | sed 's/ \[.*//' | cut -c1-150
timeout -k 5 -s INT 100 python3 tools/fp8_kernel_ab.py --impl triton \
  --configs table,32/1/1/2,32/2/1/2,32/3/1/2,32/4/1/2 --programs 600,700,1100,1260,1450,1700 \
  --geometries TP1 --runs 2 --n-sets 6 --out "$OUT/fp8" > "$OUT/fp8.log" 2>&1
echo "fp8 rc=$?"
timeout -k 5 -s INT 130 python3 tools/fp8_kernel_ab.py --kv-dtype bf16 --impl pallas \
  --configs table,32/1/2/3,32/2/2/3,32/3/2/3,32/4/2/3 --programs 600,720,1100,1320,1450 --geometries TP1 \
  --runs 2 --n-sets 6 --out "$OUT/bf16" > "$OUT/bf16.log" 2>&1
echo "bf16 rc=$?"
for f in fp8 bf16; do
  [ -f "$OUT/$f.log" ] || continue
  grep -hE "programs|(triton|pallas) 32" "$OUT/$f.log" | sed 's/ \[.*//; s/ knob=off//; s/ err .*//; s/ us / /' | paste - - - - - | cut -c1-200
done
true
