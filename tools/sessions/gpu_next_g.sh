#!/usr/bin/env bash
# Prepared in session 23 for the next lent GPU, two calls of <= 600 s each (carry .whl
# .cache/originals): bash tools/sessions/gpu_next_g.sh tests   then   ... gpu_next_g.sh targets
# Session 23 turned the jax-triton kernel's fp16 q.K^T on at TP1's one-split launches
# (config.triton_fp8_keys_f16_dot) on CPU evidence plus its first H100 call; the GPU tests of
# that default never ran (the machine was lost, then none was lent).
# tests (any card): tests/test_fp8.py's GPU tests -- prediction: all pass, the knob bit-identical
#   at the one-warp one-split launch too -- and the torch launch of the new default against the
#   knob forced off, TP1 fp8 512-4096 rows (prediction: -0.4..-1.3%, i.e. not slower).
# targets: on an H200 (issue 13's card) gpu_next_e.sh (one split vs 2 at 520-8192 programs, the
#   bf16/fp8 grid at 512-4096 rows; predictions in its header), then the decode rows (1 / 8 / 64
#   / 256) against 0.34.0 (prediction: fp8 and bf16 0.8-1.1x of 0.34.0, as bf16 was against
#   0.30.0 in the H200 grids); on another card the grid at 512-4096 rows alone (prediction: TP1
#   fp8 0.5-1% closer to copy bandwidth than session 21's 89.4-94.0% on the H100).
source tools/gpu_env.sh
set -o pipefail
part=${1:?tests or targets}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
dir="$OUT/$(echo "$card" | tr 'A-Z ' 'a-z-')_$(date +%F)"
echo "card: $card, part: $part"
if [[ "$part" == tests ]]; then
  timeout -s INT 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_fp8.py > "$OUT/gpu_fp8.log" 2>&1
  echo "gpu fp8 tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_fp8.log" | tail -10
  timeout -s INT 150 python3 tools/triton_torch_ab.py --rows 512,1024,2048,4096 --tp TP1 --kv fp8 --f16-dot off \
    --out "$OUT/torch_f16_dot" > "$OUT/torch_f16_dot.log" 2>&1
  echo "torch f16 dot rc=$?"; grep -E "^\| [0-9]+ \| (original|triton-torch default)" "$OUT/torch_f16_dot.log" | tail -16
elif [[ "$card" == *H200* ]]; then
  bash tools/sessions/gpu_next_e.sh
  timeout -s TERM 130 python3 -m bench.run --op sparse --impl original034,auto --kv-dtype bf16,fp8 \
    --rows 1,8,64,256 --no-progress --out "${dir}_decode" --tp TP1,TP4 > "$OUT/decode.log" 2>&1
  echo "decode grid rc=$?"; rm -f "${dir}_decode/results.partial.json"; tail -n 2 "$OUT/decode.log"
else
  timeout -s TERM 240 python3 -m bench.run --op sparse --impl original,original034,auto \
    --kv-dtype bf16,fp8 --rows 512,1024,2048,4096 --n-calls 10 --eager-calls 5 --no-progress \
    --out "$dir" --tp TP1,TP4 > "$OUT/grid.log" 2>&1
  echo "grid rc=$?"; rm -f "$dir/results.partial.json"; tail -n 2 "$OUT/grid.log"
fi
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
true
