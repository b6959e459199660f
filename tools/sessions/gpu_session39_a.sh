#!/usr/bin/env bash
# Session 39, call a, the H100 branch of gpu_next_p.sh (carry .whl .cache/originals; <= 220 s; the parts
# run in order, the owed first).
# 1. fp8 (jax-triton) at session 38's bands past 2048 programs, the table's own launch beside its explicit
#    twins (session 38 timed only the twins), and the untimed 3501-3695 between the last 2-split band and
#    the large-batch entry. TP1 / TP4, 2200-3650 programs. Predictions: table within 1% of its twin at
#    2200 / 2640 / 3300 (2 splits); at 3550 and 3650 one split (the table) within 2% of 2 splits.
# 2. bf16 (Pallas) past 2048 programs, where H200_BF16 has one entry (64-wide tiles, one split, 2 warps,
#    2 stages) and was never timed between 2048 and 4096. The bf16 kernel at 32-wide tiles, 2 warps,
#    3 stages holds 4 programs per SM (528 a wave), so the question is the fp8 one of session 38: does
#    a split count that fills the last wave's slots win just past a whole number of waves? Waves of 528:
#    2200 = 4.17, 3300 = 6.25, 2700 = 5.11, 2400 = 4.55 (timed in that order). Prediction: 2 or 3 splits
#    3-10% faster than one split at 2200, 2700 and 3300 (just past a whole wave), one split within 3% of
#    the fastest at 2400; the table's 64-wide entry within 3% of 32/1/2/3.
set -o pipefail
timeout -k 5 -s INT 100 python3 tools/fp8_kernel_ab.py --impl triton --configs table,32/1/1/2,32/2/1/2 \
  --programs 2200,2640,3300,3550,3650 --geometries TP1,TP4 --runs 2 --n-sets 6 --out "$OUT/fp8" \
  > "$OUT/fp8.log" 2>&1
echo "fp8 rc=$?"
timeout -k 5 -s INT 120 python3 tools/fp8_kernel_ab.py --kv-dtype bf16 --impl pallas \
  --configs table,32/1/2/3,32/2/2/3,32/3/2/3 --programs 2200,3300,2700,2400 --geometries TP1,TP4 \
  --runs 2 --n-sets 6 --out "$OUT/bf16" > "$OUT/bf16.log" 2>&1
echo "bf16 rc=$?"
for f in fp8 bf16; do
  [ -f "$OUT/$f.log" ] || continue
  grep -hE "programs|(triton|pallas)[ )]" "$OUT/$f.log" | sed 's/ \[.*//; s/ knob=off//; s/ err .*//; s/ us / /' \
    | cut -c1-90
done
true
