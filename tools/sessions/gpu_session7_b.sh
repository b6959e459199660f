#!/usr/bin/env bash
# Session 7, call B: the fp8 GPU tests call A's timeout cut (bf16 TP4 parity, the K-conversion
# bit identity), then compute-sanitizer memcheck of every Pallas part (the measured H200
# tilings, fp8 caches, the single-launch merge, the relaxed-atomic backward) and the planted
# control. Usage (device tool): bash tools/sessions/gpu_session7_b.sh
source tools/gpu_env.sh
t0=$SECONDS
timeout 170 python3 -m pytest -q -rA -m gpu tests/test_fp8.py -p no:cacheprovider \
  -k "(gpu_fp8_parity and bf16-TP4) or gpu_pallas_fp8_keys_via_f16" > "$OUT/fp8_gpu_rest.log" 2>&1
echo "fp8 tests rc=$? ($((SECONDS - t0)) s)"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/fp8_gpu_rest.log" | tail -5
t0=$SECONDS
IMPLS=pallas PART_TIMEOUT=${PART_TIMEOUT:-45} bash tools/gpu_memcheck_parts.sh
echo "memcheck: $((SECONDS - t0)) s"
