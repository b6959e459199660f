#!/usr/bin/env bash
# Session 37, call c (any 132-SM Hopper; carry .whl .cache/originals; <= 330 s; 450 s on an H200), after the table change of
# calls a and b (fp8: 3 splits at 529-704 programs, one to 1056, 4 to 1260, 2 to 1584, one to 2048; bf16:
# 2 splits at 1057-1320).
# 1. compute-sanitizer memcheck of tools/memcheck.py --part fp8, which now also forces the 4-split tiling
#    of 1057-1260 programs (and whose 600-program shape takes the new 3 splits by default), Pallas and
#    jax-triton. Prediction: 0 errors, 20 launches agreeing with XLA per implementation.
# 2. The final table's own launch ("table") beside one split at 600, 700 (3 splits now), 1700 and 1800
#    (one split; call b's table runs there launched the provisional 2 splits). Prediction: the table run
#    within 1% of call b's explicit run of the same tiling, 0.87-0.97x of 0.34.0.
# 3. Only on an H200 (owed since session 34; gpu_next_m.sh's first half): tools/gather_roofline.py, the
#    bandwidth a pure gather of the fp8 K/V bytes reaches there. Prediction (gpu_next_m.sh): 95-105% of copy.
source tools/gpu_env.sh > /dev/null
set -o pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
NO_PLANT=1 PARTS=fp8 PART_TIMEOUT=120 bash tools/gpu_memcheck_parts.sh > /dev/null 2>&1
cat "$OUT/memcheck_summary.log"
timeout -k 5 -s INT 100 python3 tools/fp8_kernel_ab.py --impl triton --configs table,32/1/1/2 \
  --programs 600,700,1700,1800 --geometries TP1,TP4 --runs 2 --n-sets 6 --out "$OUT/fp8" > "$OUT/fp8.log" 2>&1
echo "fp8 rc=$?"
grep -hE "programs|table|triton 32" "$OUT/fp8.log" | sed 's/ \[.*//; s/ knob=off//; s/ us / /' | paste - - - | cut -c1-220
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$card" == *H200* ]]; then
  timeout -k 10 -s INT 120 python3 tools/gather_roofline.py --variants 16/1/0,32/1/0,32/1/1,32/4/1 --out "$OUT/roofline" \
    > "$OUT/roofline.log" 2>&1
  echo "roofline rc=$?"; grep -vE "^\s*$|Warning|warn" "$OUT/roofline.log" | tail -30 | cut -c1-160
fi
true
