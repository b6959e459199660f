#!/usr/bin/env bash
# Session 26, call c (carry .whl .cache/originals; <= 590 s). Asked for as kind nvidia-h200, which
# may bring an H100 or an H200:
# - on an H200 (issue 13's card, not lent since session 17): session 23's prepared targets,
#   `gpu_next_g.sh targets` (one split vs 2, the grid at 512-4096 rows, decode; predictions there).
# - on an H100: the decode standing after sessions 25-26 (the 2-warp merge, the bf16 5-8-program
#   entry), 1-256 rows, bf16 and fp8, the library's default (auto) against 0.30.0 and 0.34.0, busy
#   time. Prediction: auto <= 1.02x of the faster original at every row of both dtypes (session 24:
#   bf16 up to 1.09x, fp8 up to 1.08x).
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$card" == *H200* ]]; then
  exec bash tools/sessions/gpu_next_g.sh targets
fi
source tools/gpu_env.sh
set -o pipefail
dir="$OUT/$(echo "$card" | tr 'A-Z ' 'a-z-')_$(date +%F)_decode"
timeout -s TERM 300 python3 -m bench.run --op sparse --impl original,original034,auto \
  --kv-dtype bf16,fp8 --rows 1,2,4,8,16,32,64,128,256 --trace-rows 256 --n-calls 10 --eager-calls 5 \
  --no-progress --no-plot --out "$dir" --tp TP1,TP4 > "$OUT/decode.log" 2>&1
echo "decode grid rc=$?"; rm -f "$dir/results.partial.json"; tail -n 2 "$OUT/decode.log"
python3 tools/busy_table.py "$dir/results.md" | cut -d'|' -f3,4,6,7,15,16
true
