#!/usr/bin/env bash
# Prepared in session 21 for the next lent H200 (any H100/H200 runs it; carry .whl
# .cache/originals): bash tools/sessions/gpu_next_e.sh
# Session 21 moved the sm_90 fp8 table to one split from 529 programs on an H100's evidence
# (bench/results/nvidia-h100_2026-12-05/session21/). The issue-13 targets name the H200:
# 1. One split against 2 splits at 520 / 768 / 1024 / 4096 / 8192 programs, 0.34.0 with the
#    prefill flag. Prediction: as on the H100 (one split 2-7% faster from 768, 2 splits
#    faster at 520), since both cards have 132 SMs and the same 8 one-warp programs per SM.
# 2. The grid, bf16 and fp8, original / original034 / auto, 512-4096 rows. Prediction: fp8
#    >= 1.8x bf16 from 1024 programs; copy bandwidth lower than the H100's 89-97% (4.8 TB/s
#    leaves less time per byte for the same instructions); prefill rows 1.00x of 0.34.0.
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')
timeout -s INT 200 python3 tools/fp8_kernel_ab.py --impl triton --prefill --programs 520,768,1024,4096,8192 \
  --geometries TP1,TP4 --configs table,32/2/1/2,32/1/1/2 --runs 2 --n-sets 6 --out "$OUT/one_split" \
  > "$OUT/one_split.log" 2>&1
echo "one split ab rc=$?"; grep -E "programs|knob=" "$OUT/one_split.log" | sed 's/ err .*\[/ [/' | tail -40
timeout -s TERM 240 python3 -m bench.run --op sparse --impl original,original034,auto \
  --kv-dtype bf16,fp8 --rows 512,1024,2048,4096 --n-calls 10 --eager-calls 5 --no-progress \
  --out "$OUT/${card}_$(date +%F)" --tp TP1,TP4 > "$OUT/grid.log" 2>&1
echo "grid rc=$?"; rm -f "$OUT/${card}_$(date +%F)/results.partial.json"; tail -n 2 "$OUT/grid.log"
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
true
