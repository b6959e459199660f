#!/usr/bin/env bash
# For the next session, any Hopper with 132 SMs (carry .whl .cache/originals; <= 520 s). Written in session 36,
# whose device time ran out (refused starts) before its call d.
# 1. Owed by session 36's bf16 table (3 splits at 529-660 programs, 2 at 661-792): tests/test_gpu_parity.py
#    at its rows 300 and 360 (TP1's 600 and 720 programs, the new bands; TP2 / TP4 at one split), every
#    implementation against 0.30.0 and exact attention. Prediction: 6 passed (the A/Bs of calls a and c
#    measured these tilings 2.73-2.80e-3 from exact, one split 2.76-2.82e-3).
# 2. The same question for fp8 (jax-triton, one warp, 8 programs per SM: 1056 per wave): one split from 529
#    programs runs its second wave from 1057, unmeasured there (session 23: one split 1.00-1.01x of 0.34.0
#    at 576-704 programs, where 2 splits, 1.09 waves, ran 1.07-1.16x). 1-4 splits at 600-1584 programs.
#    Prediction, by the bf16 outcome: one split at >= 1.05x of 0.34.0 just past 1056 (1100, 1200), where 3
#    splits run 8-15% faster; 2 splits fastest near 1320-1450; one split again by 1584 (1.5 waves); below
#    1056 one split within 3% of the fastest (at 600 maybe 3-4 splits, 1.7-2.3 waves, by a few %).
# 3. (session 37) compute-sanitizer memcheck of the same bf16 bands: tools/memcheck.py --part bf16_bands
#    (3 and 2 splits forced on its poisoned, adversarial cases; Pallas and jax-triton, fused and split
#    caches). Prediction: 0 errors, 8 launches agreeing with XLA per implementation.
source tools/gpu_env.sh > /dev/null
set -o pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
QSA_PARITY_ROWS=300,360 timeout -k 10 -s INT 170 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE \
  "tests/test_gpu_parity.py::test_sparse_attention_matches_original" > "$OUT/parity.log" 2>&1
echo "parity rc=$?"; grep -E "passed|failed|Error" "$OUT/parity.log" | tail -3 | cut -c1-200
grep -E "^PARITY" "$OUT/parity.log" | cut -c1-170 | head -20
timeout -k 5 -s INT 140 python3 tools/fp8_kernel_ab.py --impl triton \
  --configs table,32/1/1/2,32/2/1/2,32/3/1/2,32/4/1/2 --programs 1100,1200,1320,1450,1584,600,800,1000 \
  --geometries TP1,TP4 --runs 2 --n-sets 6 --out "$OUT/fp8" > "$OUT/fp8.log" 2>&1
echo "fp8 rc=$?"; grep -hE "programs|triton" "$OUT/fp8.log" | sed 's/ \[.*//; s/ knob=off//; s/ err .*//' | paste - - - - - - | cut -c1-220
NO_PLANT=1 PARTS=bf16_bands PART_TIMEOUT=90 bash tools/gpu_memcheck_parts.sh > /dev/null 2>&1
cat "$OUT/memcheck_summary.log"
true
