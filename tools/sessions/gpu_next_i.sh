#!/usr/bin/env bash
# For the next lent H200 (issue 13's card; last lent in session 17), asked for as kind nvidia-h200;
# carry .whl .cache/originals; <= 420 s. Runs the H200 branch of session 29's call a (which got an
# H100): the grid at 1024 / 2048 / 4096 rows (fp8 over bf16 throughput, copy bandwidth; 0.30.0 /
# 0.34.0 / auto, TP1 and TP4), decode against 0.34.0 at 1 / 8 / 64 rows, then the GPU tests of
# the Triton-image hook. Since session 29 the jax-triton merge keeps D whole from 129 pairs.
# Predictions: fp8/bf16 >= 1.8x at >= 1024 programs, 90-97% of copy bandwidth, auto <= 1.0x of
# 0.34.0 but for a few decode cases within 1-2%.
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$card" != *H200* ]]; then
  echo "card: $card -- this script's targets are set on an H200; nothing run"
  exit 0
fi
bash tools/sessions/gpu_session29_a.sh
