#!/usr/bin/env bash
# Session 24 call d (H100; carry .whl .cache/originals): the split merge's layout at decode.
# Call c's traces: at 96-192 (row, head) pairs with 32-33 splits the merge of both kernels
# (64-wide D chunks there, config.merge_block_d) took 3.0-4.2 us against 2.8-3.2 us for vLLM
# 0.34.0's whole-D merge, e.g. TP1 fp8 8 rows: jax-triton 4.18, Pallas 3.39, 0.34.0 3.22 us.
# Prediction: whole D (256) beats the 64-wide chunks from ~96 pairs up, so the rule's
# MERGE_SPLIT_D_MAX_PAIRS (256) should come down to about 48-64; at 24 pairs the chunks win.
source tools/gpu_env.sh
set -o pipefail
cases=TP1:8,TP1:4,TP4:16,TP4:32,TP4:8,TP1:1
timeout -s INT 190 python3 -m bench.decode_sweep --impl triton --kv fp8 --variants merge --cases $cases \
  --out "$OUT/merge_triton_fp8.md" > "$OUT/merge_triton_fp8.log" 2>&1; echo "triton fp8 rc=$?"
timeout -s INT 70 python3 -m bench.decode_sweep --impl pallas --kv bf16 --variants merge --cases $cases \
  --out "$OUT/merge_pallas_bf16.md" > "$OUT/merge_pallas_bf16.log" 2>&1; echo "pallas bf16 rc=$?"
for f in "$OUT"/merge_*.log; do echo "== $f"; grep -E "^\| TP" "$f" | awk -F'|' '{printf "%s %s %s %s %s %s %s %s\n",$2,$4,$5,$7,$8,$9,$10,$11}'; done
true
