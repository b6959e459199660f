#!/usr/bin/env bash
# Session 12, call e (about 2 min of device time): call d changed the merge alone and moved nothing (3.43e-4 -> 3.42e-4):
# the cause is config.tune_config_for_hopper (65 splits instead of 64), now applied only on the
# library's measured table (config.triton_tiling). The merge keeps call d's rule: it sums the splits as
# the originals do (D whole, 2 warps) wherever the tiling is not the library's measured table
# (config.triton_launch). Call c: at TP2 16 rows (64 splits) on 0.30.0's table, "triton" and
# triton-torch were 3.4e-4 from vLLM 0.30.0 (over the 3e-4 fidelity bar), Pallas 6.5e-6.
#  1. tools/route_diff.py, TP2 and TP4 at 16 rows, 0.30.0's table;
#  2. the shim-vs-original GPU tests at 16 rows on both routes, TP1/TP2/TP4, and triton-torch
#     against the JAX route and in a CUDA graph (its split + merge launch at 4 rows).
# Prediction: triton / triton-torch at TP2 and TP4 16 rows within a few ulps of 0.30.0 (like Pallas,
# rel ~1e-5); all the tests pass.
# The same steps as call d's script, after the change.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session12_e.sh
exec bash tools/sessions/gpu_session12_d.sh
