#!/usr/bin/env bash
# Session 40, call b (H100 or H200; carry .whl .cache/originals; <= 250 s). Call a (gpu_next_p.sh on an
# H100) timed 3550 and 3650 programs, between session 38's last 2-split band (to 3500) and the
# large-batch entry: 2 splits were the fastest or within 0.9% there on TP1 and TP4, one split up to 3.5%
# behind (TP4 3550). config.H200_FP8 now runs 2 splits to 3695 (3.5 waves of 1056). This call checks the
# change through the table's own launch.
# 1. GPU parity (tests/test_fp8.py: every implementation, e4m3 / uint8 bytes / bf16, TP1/TP2/TP4) at 1800 rows: TP1's 3600
#    programs, inside the stretched band. Prediction: 9 passed.
# 2. jax-triton fp8, the table's launch beside 1 and 2 splits at 3450, 3600, 3690 (the stretched band)
#    and 3700 programs (the large-batch entry), TP1 / TP4. Predictions: the table within 1% of its
#    2-split twin at 3450-3690 and of one split at 3700; at 3450-3690 2 splits within 2% of the faster
#    of the two on each geometry.
source tools/gpu_env.sh > /dev/null
set -o pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
QSA_FP8_PARITY_ROWS=1800 timeout -k 10 -s INT 120 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE \
  "tests/test_fp8.py::test_gpu_fp8_parity" > "$OUT/fp8_parity.log" 2>&1
echo "fp8 parity rc=$?"; grep -E "passed|failed|Error" "$OUT/fp8_parity.log" | tail -3 | cut -c1-200
timeout -k 5 -s INT 110 python3 tools/fp8_kernel_ab.py --impl triton --configs table,32/1/1/2,32/2/1/2 \
  --programs 3450,3600,3690,3700 --geometries TP1,TP4 --runs 2 --n-sets 6 --out "$OUT/fp8" \
  > "$OUT/fp8.log" 2>&1
echo "fp8 rc=$?"
grep -hE "programs|triton[ )]" "$OUT/fp8.log" | sed 's/ \[.*//; s/ knob=off//; s/ err .*//; s/ us / /' | cut -c1-90
true
