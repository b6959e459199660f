#!/usr/bin/env bash
# Session 27, call f (carry .whl .cache/originals), asked for as kind nvidia-h200 with the ~500 s
# of device time left. On an H200 (issue 13's card, not lent since session 17): the two
# measurements issue 13's targets need most, trimmed to fit -- the grid (bf16 and fp8, 0.30.0 /
# 0.34.0 / auto, 512-4096 rows: fp8 throughput over bf16 and copy bandwidth; predictions in
# gpu_next_e.sh) and the decode rows against 0.34.0 (1 / 8 / 64 / 256; prediction in
# gpu_next_g.sh); session 21's one-split A/B (gpu_next_e.sh part 1) is left for a longer call.
# On an H100 it names the card and stops.
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
[[ "$card" == *H200* ]] || exit 0
source tools/gpu_env.sh
set -o pipefail
slug=$(echo "$card" | tr 'A-Z ' 'a-z-')_$(date +%F)
timeout -s TERM 250 python3 -m bench.run --op sparse --impl original,original034,auto \
  --kv-dtype bf16,fp8 --rows 512,1024,2048,4096 --n-calls 10 --eager-calls 5 --no-progress --no-plot \
  --out "$OUT/${slug}_grid" --tp TP1,TP4 > "$OUT/grid.log" 2>&1
echo "grid rc=$?"; rm -f "$OUT/${slug}_grid/results.partial.json"; tail -n 2 "$OUT/grid.log"
timeout -s TERM 130 python3 -m bench.run --op sparse --impl original034,auto --kv-dtype bf16,fp8 \
  --rows 1,8,64,256 --n-calls 10 --eager-calls 5 --no-progress --no-plot --out "$OUT/${slug}_decode" \
  --tp TP1,TP4 > "$OUT/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$OUT/${slug}_decode/results.partial.json"; tail -n 2 "$OUT/decode.log"
python3 tools/busy_table.py "$OUT/${slug}_decode/results.md" | cut -d'|' -f3,4,7,15,16
true
