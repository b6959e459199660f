#!/usr/bin/env bash
# Session 34, call b (carry .whl .cache/originals; <= 300 s; any Hopper): the card-independent half of call a
# (gpu_session34_a.sh, written for an H200; four H200 starts were refused), on the H100 that came instead.
# 0. tools/gather_roofline.py (call a's part 1): the bandwidth a pure gather of the attention's K/V bytes
#    reaches on this card, against the library's own fp8 and bf16 calls and the copy. Prediction (H100,
#    where the one-warp fp8 kernel ran at 90-97% of copy, session 24): the best gather at 95-100% of copy
#    on fp8, the library's fp8 within ~5% of it.
# 1. tests/test_gluon.py's GPU tests (call a's part 4): the runner refactored in session 33 (811d19c) after
#    their last GPU run. Prediction: all pass.
source tools/gpu_env.sh
set -o pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout -k 10 -s INT 150 python3 tools/gather_roofline.py --variants 16/1/0,32/1/0,32/1/1,32/4/0,32/4/1,64/8/1 --out "$OUT/roofline" > "$OUT/roofline.log" 2>&1
echo "roofline rc=$?"; grep -vE "^\s*$|Warning|warn" "$OUT/roofline.log" | tail -60 | cut -c1-160
timeout -k 10 -s INT 120 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/test_gluon.py > "$OUT/gluon_tests.log" 2>&1
echo "gluon gpu tests rc=$?"; grep -E "passed|failed|Error" "$OUT/gluon_tests.log" | tail -5 | cut -c1-200
true
