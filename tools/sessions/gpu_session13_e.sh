#!/usr/bin/env bash
# Session 13, call e (about 3 min of device time): call d's fp8 grid put TP4 64/512 rows at
# 1.10/1.18 where call a had 0.75/0.88 -- the originals' eager call moved by 50 us between the two
# runs, and profile_shim times each column in its own block. tools/triton_torch_ab.py times the
# columns round-robin (7 rounds) and adds the kernels' busy time: TP4 and TP1, fp8 and bf16, 64 /
# 512 / 2048 rows, after call d's do_not_specialize change.
# Prediction: eager ratios (default route = "triton-torch default") <= 1.0 at every cell; busy
# within 0.95-1.07 of the faster original (fp8 at 0.34.0's tilings was 1.04-1.07 in call b).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session13_e.sh
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 300 python3 tools/triton_torch_ab.py --rows 64,512,2048 --tp TP4,TP1 --kv fp8,bf16 \
  --out "$OUT/ab" 2>&1 | grep -v -i warn | tee "$OUT/ab.log" | grep -E "^\||^TP" | grep -v "vllm-0" | tail -40
