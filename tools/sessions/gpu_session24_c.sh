#!/usr/bin/env bash
# Session 24 call c (H100; carry .whl .cache/originals): the decode rows against vLLM 0.34.0 on
# today's defaults, with GPU busy time for every implementation (session 21 traced Pallas only,
# and found it up to 1.11x 0.34.0's busy time at TP4 bf16 8 rows, 1.07x at TP4 fp8 64 rows).
# Prediction: Pallas as in session 21 (0.70-1.11x); jax-triton at 0.34.0's own tilings within
# +-3% of 0.34.0 (the same kernel family, compiled by Triton 3.6 from another source), so
# auto's fp8 picks (jax-triton at 5-24 programs and the one-warp entries) not slower than 0.34.0.
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
dir="$OUT/$(echo "$card" | tr 'A-Z ' 'a-z-')_$(date +%F)_decode"
timeout -s TERM 420 python3 -m bench.run --op sparse --impl original,original034,pallas,triton \
  --kv-dtype bf16,fp8 --rows 1,2,4,8,16,32,64,128,256 --trace-rows 256 --n-calls 10 --eager-calls 5 \
  --no-progress --no-plot --out "$dir" --tp TP1,TP4 > "$OUT/decode.log" 2>&1
echo "decode grid rc=$?"; rm -f "$dir/results.partial.json"; tail -n 2 "$OUT/decode.log"
python3 - "$dir/results.md" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith("## GPU busy time"))
for l in lines[start:]:
    if l.startswith("## All cases"):
        break
    if l.startswith("| sparse_attention"):
        print(l)
PY
true
