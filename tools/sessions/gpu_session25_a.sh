#!/usr/bin/env bash
# Run as session 25 call a.
# Prepared in session 24 for the next lent GPU (carry .whl .cache/originals; ~300-450 s, any
# Hopper card): the split merge's layout at decode, bash tools/sessions/gpu_next_h.sh
# Session 24's traces (H100, bench/results/nvidia-h100_2026-12-05/session24/call_c/): at 96-192
# (row, head) pairs with 32-33 splits the merge of both kernels (64-wide D chunks there,
# config.merge_block_d) took 3.0-4.2 us against 2.8-3.2 us for vLLM 0.34.0's whole-D merge,
# e.g. TP1 fp8 8 rows: jax-triton 4.18, Pallas 3.39, 0.34.0 3.22 us; at 48 pairs the chunks won.
# Prediction: whole D (256) or 128-wide chunks beat the 64-wide ones from ~96 pairs up, so
# MERGE_SPLIT_D_MAX_PAIRS (256) should come down to about 48-64; at 24 pairs the chunks win
# (the H200's 1-row evidence). Session 24 ran out of device time before this ran.
source tools/gpu_env.sh
set -o pipefail
cases=TP1:8,TP4:16,TP1:4,TP4:8,TP4:32,TP1:1,TP1:16,TP4:64
timeout -s INT 300 python3 -m bench.decode_sweep --impl triton --kv fp8 --variants merge --cases $cases \
  --out "$OUT/merge_triton_fp8.md" > "$OUT/merge_triton_fp8.log" 2>&1; echo "triton fp8 rc=$?"
timeout -s INT 240 python3 -m bench.decode_sweep --impl pallas --kv bf16 --variants merge --cases $cases \
  --out "$OUT/merge_pallas_bf16.md" > "$OUT/merge_pallas_bf16.log" 2>&1; echo "pallas bf16 rc=$?"
for f in "$OUT"/merge_*.log; do echo "== $f"; grep -E "^\| TP" "$f" | awk -F'|' '{printf "%s %s %s %s %s %s %s %s\n",$2,$4,$5,$7,$8,$9,$10,$11}'; done
true
