#!/usr/bin/env bash
# Session 36, call d (carry .whl .cache/originals; <= 300 s), whichever card comes. The bf16 table's new
# bands (config.H200_BF16 from calls a and c: 3 splits at 529-660 programs, 2 at 661-792), checked on the
# GPU (the device time left after refused starts allows little more than this).
# 1. tests/test_gpu_parity.py at its two new rows (300 and 360: TP1's 600 and 720 programs, the two new
#    bands; TP2 / TP4 run them at one split): every implementation against 0.30.0 and exact attention.
#    Prediction: 6 passed.
# 2. The table's launch (Pallas) beside its old one (one split) and 0.34.0 at 600 and 720 programs, TP1
#    and TP4 (the band's middles, on whichever card came). Prediction: the table <= 0.95x of 0.34.0 and
#    8-15% faster than one split.
source tools/gpu_env.sh > /dev/null
set -o pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
QSA_PARITY_ROWS=300,360 timeout -k 10 -s INT 170 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rfE \
  "tests/test_gpu_parity.py::test_sparse_attention_matches_original" > "$OUT/parity.log" 2>&1
echo "parity rc=$?"; grep -E "passed|failed|Error" "$OUT/parity.log" | tail -3 | cut -c1-200
grep -E "^PARITY" "$OUT/parity.log" | cut -c1-170 | head -20
timeout -k 5 -s INT 70 python3 tools/fp8_kernel_ab.py --kv-dtype bf16 --impl pallas \
  --configs table,32/1/2/3 --programs 600,720 --geometries TP1,TP4 \
  --runs 2 --n-sets 6 --out "$OUT/bf16" > "$OUT/bf16.log" 2>&1
echo "bf16 rc=$?"; grep -hE "programs|pallas" "$OUT/bf16.log" | sed 's/ \[.*//; s/ knob=off//; s/ err .*//' | paste - - - | cut -c1-200
true
