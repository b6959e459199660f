#!/usr/bin/env bash
# Session 23 (any H100/H200; carry .whl .cache/originals): bash tools/sessions/gpu_next_f.sh
# On an H200: session 21's prepared run, tools/sessions/gpu_next_e.sh (issue 13's targets on the
# card they name; predictions in its header).
# On any other card (so far always an H100, where session 21 already ran gpu_next_e's content),
# three questions that card can answer:
# 1. The one-split boundary between 520 and 768 fp8 programs (config.H200_FP8: 2 splits up to
#    528, one from 529, argued from 132 SMs x 8 one-warp programs, measured only at 520 and
#    768). Prediction: 2 splits faster at 528, one split faster from 576 (>= 1.09 waves of 2
#    splits, so the 2-split launch pays a second, mostly empty wave).
# 2. TP1's fp16 q.K^T through the shim's torch launch now that TP1 runs one split from 529
#    programs. Session 21: -0.4..-1.3% through JAX; session 17 (2 splits, H200): +3..+6% through
#    torch. Prediction: -1..+2% through torch at 1024-4096 rows: no case for changing the default.
# 3. The Pallas fallback at its table entry (one split from 529 programs) against 2 splits,
#    never timed. Prediction: one split within +-5% of 2 splits (its loop has no merge to skip
#    but the same wave argument).
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
if [[ "$card" == *H200* ]]; then exec bash tools/sessions/gpu_next_e.sh; fi
timeout -s INT 170 python3 tools/fp8_kernel_ab.py --impl triton --prefill --programs 528,576,640,704 \
  --geometries TP1,TP4 --configs table,32/2/1/2,32/1/1/2 --runs 2 --n-sets 6 --out "$OUT/boundary" \
  > "$OUT/boundary.log" 2>&1
echo "boundary ab rc=$?"; grep -E "programs|knob=|bit" "$OUT/boundary.log" | sed 's/ err .*\[/ [/' | tail -40
timeout -s INT 150 python3 tools/triton_torch_ab.py --rows 1024,2048,4096 --tp TP1 --kv fp8 --f16-dot on \
  --out "$OUT/torch_f16_dot" > "$OUT/torch_f16_dot.log" 2>&1
echo "torch f16 dot rc=$?"; grep -E "^\| |split .* vs" "$OUT/torch_f16_dot.log" | tail -20
timeout -s INT 150 python3 tools/fp8_kernel_ab.py --impl pallas --programs 1024,4096 --geometries TP1,TP4 \
  --configs table,32/2/1/2 --runs 1 --n-sets 6 --out "$OUT/pallas_one_split" > "$OUT/pallas_one_split.log" 2>&1
echo "pallas one split ab rc=$?"; grep -E "programs|knob=|bit" "$OUT/pallas_one_split.log" | sed 's/ err .*\[/ [/' | tail -16
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
true
