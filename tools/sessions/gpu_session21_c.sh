#!/usr/bin/env bash
# Session 21, call c (any H100/H200; carry .whl .cache/originals): bash tools/sessions/gpu_session21_c.sh
# After the one-split table (call b: TP1 fp8 at 89-94% of copy bandwidth, TP4 93-97%), does the
# fp16 q.K^T (config.triton_fp8_keys_f16_dot, on only where G <= 8, i.e. TP4) pay at TP1 now?
# Session 17 measured it at the 2-split launch on the H200: -1 to -2% through JAX, +3 to +6%
# through the shim's torch launch. Prediction: -1 to -3% at 2048-8192 programs through JAX,
# bit-identical (its contract).
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 150 python3 tools/fp8_kernel_ab.py --impl triton --programs 2048,4096,8192 --geometries TP1 \
  --configs table --runs 2 --n-sets 6 --knob triton_fp8_keys_f16_dot --out "$OUT/f16_dot" > "$OUT/f16_dot.log" 2>&1
echo "f16 dot ab rc=$?"; grep -E "programs|knob=|bit-identical" "$OUT/f16_dot.log" | sed 's/ err .*\[/ [/' | tail -12
true
