#!/usr/bin/env bash
# Session 26, call f (carry .whl .cache/originals; <= 590 s). Asked for as kind nvidia-h200 with the
# device time left (~630 s): on an H200 (issue 13's card) `gpu_next_g.sh targets`; on an H100 it
# only names the card and stops (the H100 work of this session is done: calls a-e).
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
if [[ "$card" == *H200* ]]; then
  exec bash tools/sessions/gpu_next_g.sh targets
fi
true
