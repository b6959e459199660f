#!/usr/bin/env bash
# Ran once (H100, 2026-12-05, bench/results/nvidia-h100_2026-12-05/session20/call_a/). The knob
# triton_fp8_gluon_values_early was removed after it (no faster, not bit-identical): the A/B's
# second --knob no longer exists.
# Session 20, call a (device tool; carry .whl .cache/originals). Issue 13.
# 1. The Gluon fp8 split kernel (gluon_kernels.py; config.triton_fp8_gluon_split, V loads after
#    or before q.K^T: triton_fp8_gluon_values_early) against the Triton kernel at the table's
#    launch, 2048/4096 programs, TP1/TP4, through JAX (jax-triton + _gluon_support's hook):
#    bits compared with the Triton kernel's, busy time per call.
#    Prediction: bit-identical; sm_90 loop 2184 -> 1687 (TP1), 1735 -> 1354 (TP4), same shared
#    memory, no spills, the next tile's K in flight during compute: -15 to -30% at TP1 and TP4.
# 2. tests/test_gluon.py's GPU cases: bits against the Triton kernel at 9 launches, edge rows and
#    poison (448 K, NaN V in every unreferenced row). Prediction: all pass.
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 250 python3 tools/fp8_kernel_ab.py --impl triton --programs 2048,4096 --geometries TP1,TP4 \
  --configs table --runs 2 --n-sets 6 --knob triton_fp8_gluon_split \
  --knob triton_fp8_gluon_split+triton_fp8_gluon_values_early \
  --out "$OUT/gluon_ab" > "$OUT/gluon_ab.log" 2>&1
echo "gluon ab rc=$?"; grep -E "programs|knob=|bit-identical|Error|error" "$OUT/gluon_ab.log" | sed 's/ err .*\[/ [/' | tail -30
timeout -s INT 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_gluon.py > "$OUT/gpu_gluon.log" 2>&1
echo "gpu gluon tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_gluon.log" | tail -12
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
