#!/usr/bin/env bash
# Session 29 call a ran this on an H100 (was gpu_next_k.sh). Prepared in session 28 (any H100/H200; carry .whl .cache/originals; <= 300 s).
# TP1 fp8 8 rows is the one decode case where the default stays above 0.34.0 on the H100 with the
# Triton images (call c: 1.019x; merge 3.44 against 0.34.0's 3.25 µs). 0.34.0's merge keeps D whole
# on 2 warps (one program per (row, head)); ours splits D in 64-wide chunks up to
# config.MERGE_SPLIT_D_MAX_PAIRS = 256 pairs. Session 25's sweep had whole D on 2 warps ahead at
# 192 pairs in both cases it timed (TP1 8 rows 3.3 against 3.4 µs, TP4 32 rows 2.5 against 2.7)
# and level at 96, behind at 24-48. Here the merge layouts at 96-256 pairs (TP1 4 / 8 / 10 rows, TP4
# 16 / 32 / 40), jax-triton with fp8 and bf16, then Pallas bf16 (the shared rule). Prediction: whole D
# on 2 warps 0.1-0.2 µs faster from 192 pairs in every case, level at 96; if so, lower
# MERGE_SPLIT_D_MAX_PAIRS to 128 and run the fp8 GPU parity (the merge's last bits may move).
source tools/gpu_env.sh
set -o pipefail
for spec in "triton fp8" "triton bf16" "pallas bf16"; do
  set -- $spec
  timeout -s TERM 90 python3 -m bench.decode_sweep --impl "$1" --kv "$2" --variants merge \
    --cases TP1:4,TP1:8,TP1:10,TP4:16,TP4:32,TP4:40 --out "$OUT/merge_$1_$2.md" > "$OUT/merge_$1_$2.log" 2>&1
  echo "merge $1 $2 rc=$?"; grep -E "^\| TP" "$OUT/merge_$1_$2.log" | cut -d'|' -f2-9,11 | head -42
done
true
