#!/usr/bin/env bash
# Session 34: whichever card comes. An H200 runs call a (gpu_session34_a.sh); another card runs call b
# (gpu_session34_b.sh: the roofline and the Gluon GPU tests) and call a's Nsight Compute part.
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$card" == *H200* ]]; then exec bash tools/sessions/gpu_session34_a.sh; fi
bash tools/sessions/gpu_session34_b.sh
source tools/gpu_env.sh >/dev/null
ONLY=triton_fp8,triton_bf16 NCU_TIMEOUT=90 bash tools/gpu_fp8_ncu.sh 2048 | grep -E "^NCU|ncu rc" | cut -c1-1500
rm -f "$OUT/ncu_2048.err"
true
