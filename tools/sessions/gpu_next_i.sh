#!/usr/bin/env bash
# Ran in session 32 on an H200 as call b: bench/results/nvidia-h200_2026-12-06/session32/call_b/ (its README: outcome).
# For the next lent H200 (issue 13's card; last lent in session 17), asked for as kind nvidia-h200;
# carry .whl .cache/originals; <= 420 s (H100: <= 330 s). Runs the H200 branch of session 29's call a (which got an
# H100): the grid at 1024 / 2048 / 4096 rows (fp8 over bf16 throughput, copy bandwidth; 0.30.0 /
# 0.34.0 / auto, TP1 and TP4), decode against 0.34.0 at 1 / 8 / 64 rows, then the GPU tests of
# the Triton-image hook. Since session 30 both merges take their layout from
# config.TRITON_MERGE_LAYOUTS / PALLAS_MERGE_LAYOUTS (1 warp at small batches): run gpu_next_j.sh
# (their GPU parity and memcheck) first on whatever card comes.
# Predictions: fp8/bf16 >= 1.8x at >= 1024 programs, 90-97% of copy bandwidth, auto <= 1.0x of
# 0.34.0 but for a few decode cases within 1-2%.
# On an H100 (the grid there: session 24): the decode standing after sessions 28-29 (Triton's own
# cubins for JAX's jax-triton launches, the jax-triton merge's D whole from 129 pairs), as session
# 26's call c (whose H100 branch this runs): 1-256 rows, bf16 and fp8, auto against 0.30.0 and
# 0.34.0, busy time. Prediction: auto <= 1.01x of the faster original at every row of both dtypes
# (session 26: up to 1.03x).
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$card" == *H200* ]]; then
  exec bash tools/sessions/gpu_session29_a.sh
fi
exec bash tools/sessions/gpu_session26_c.sh
