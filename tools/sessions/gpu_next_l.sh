#!/usr/bin/env bash
# Ran in session 32 on an H200 as call d: bench/results/nvidia-h200_2026-12-06/session32/call_d/ (its README: outcome).
# For a lent GPU after gpu_next_j.sh and gpu_next_k.sh (carry .whl .cache/originals; <= 560 s): the
# merge layouts where session 30's call e left gaps, `bench.decode_sweep --variants merge` (1 / 2 /
# 4 warps, 32-256-wide D; every differing output held to fidelity against the default):
#   1. Pallas bf16 at 96-384 pairs, TP4 included (call e's timeout cut it after TP4 8 rows): TP1
#      4 / 8 / 10 / 16 rows, TP4 16 / 32 / 48 / 64. There 128-wide on 1 warp was 0.45 / 0.39 µs
#      ahead of the (then) default at TP1 192 / 384 pairs; PALLAS_MERGE_LAYOUTS now has 64-wide on
#      1 warp to 256 pairs and D whole on 2 warps above.
#   2. jax-triton fp8 between 192 and 384 pairs, untimed so far: TP1 10 / 12 rows (240 / 288
#      pairs), TP4 40 / 48 rows (240 / 288). TRITON_MERGE_LAYOUTS has 64-wide on 1 warp to 192
#      and D whole on 2 warps above.
#   3. (session 31) the decode standing at 1 / 2 / 4 rows, TP1 and TP4, bf16 and fp8, once as
#      before and once with `bench.run --cold-l2` (each set its own requests, >= 4x the L2 per
#      unit): does the L2 hold a replayed unit's sets at these sizes, and does it move the ratios?
# Predictions: Pallas 128-wide on 1 warp fastest at 192-384 pairs at TP4 too, by 0.2-0.5 µs
# (then a row (384, 128, 1) for PALLAS_MERGE_LAYOUTS); jax-triton at 240-288 pairs within
# 0.1 µs between 64-wide on 1 warp and D whole on 2; with --cold-l2 every busy time at 1-2 rows
# 5-20% longer, the default / the faster original within ±0.03 of the warm run's.
source tools/gpu_env.sh
sweep() {  # sweep <name> <timeout> <impl> <kv> <cases>
  timeout -s TERM "$2" python3 -m bench.decode_sweep --impl "$3" --kv "$4" --variants merge \
    --cases "$5" --n-calls 20 --out "$OUT/$1.md" > "$OUT/$1.log" 2>&1
  echo "$1 rc=$?"
}
sweep pallas_bf16 170 pallas bf16 TP1:4,TP1:8,TP1:10,TP1:16,TP4:16,TP4:32,TP4:48,TP4:64
sweep triton_fp8 110 triton fp8 TP1:10,TP1:12,TP4:40,TP4:48
for name in pallas_bf16 triton_fp8; do
  echo "== $name (where | kv | rows | tiling | split warps | merge block_d | merge warps | busy µs)"
  grep -E "^\| TP" "$OUT/$name.log" | sort -u | cut -d'|' -f2-9
done
grep -c FAILS "$OUT"/*.log | tr '\n' ' '; echo
for mode in warm cold; do
  flag=(); [ "$mode" = cold ] && flag=(--cold-l2)
  timeout -s TERM 110 python3 -m bench.run --op sparse --impl original,original034,auto --kv-dtype bf16,fp8 \
    --rows 1,2,4 --tp TP1,TP4 --n-calls 20 --eager-calls 3 --trace-rows 4 "${flag[@]}" --no-progress --no-plot \
    --out "$OUT/standing_$mode" > "$OUT/standing_$mode.log" 2>&1
  echo "standing $mode rc=$?"; rm -f "$OUT/standing_$mode/results.partial.json"
done
for mode in warm cold; do
  echo "== standing $mode (busy time; see results.md for the columns)"
  python3 tools/busy_table.py "$OUT/standing_$mode/results.md" | cut -d'|' -f3,4,6,7,15,16
done
