#!/usr/bin/env bash
# Session 8, call F (about 5 min of device time): call E's runs with the jax-triton merge on
# 2 warps for D whole (TRITON_MERGE_WARPS_WHOLE_D), and the parity cases call E's timeouts cut:
#  1. implementation=None against 0.34.0 on fp8, TP1/TP4, 256 / 1024 / 2048 programs;
#  2. fp8 parity at TP2/TP4 bf16 and TP1 e4m3 (every implementation), then the bf16 parity
#     of every implementation against 0.30.0 (tests/test_gpu_parity.py).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session8_f.sh
source tools/gpu_env.sh
set -o pipefail
timeout 110 python3 tools/fp8_kernel_ab.py --impl auto --programs 256,1024,2048 --geometries TP1,TP4 \
  --configs table --out "$OUT/ab_auto" 2>&1 | grep -v -i warning | tee "$OUT/ab_auto.log" | tail -12
tar -C "$OUT" -czf "$OUT/ab_auto.tgz" ab_auto 2>/dev/null && rm -rf "$OUT/ab_auto"
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rA -s tests/test_fp8.py \
  -k "gpu_fp8_parity and (bf16-TP2 or bf16-TP4 or e4m3-TP1)" \
  > "$OUT/fp8_parity.log" 2>&1; echo "fp8 parity rc=$?"; grep -E "passed|failed" "$OUT/fp8_parity.log" | tail -3
timeout 190 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_gpu_parity.py -k "sparse_attention" \
  > "$OUT/parity030.log" 2>&1; echo "0.30 parity rc=$?"; tail -2 "$OUT/parity030.log"
