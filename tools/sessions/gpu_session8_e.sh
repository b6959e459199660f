#!/usr/bin/env bash
# Session 8, call E (about 6 min of device time): the jax-triton merge with D whole and
# jax-triton first for an fp8 cache on Hopper (config.sparse_attention_order), proven:
#  1. implementation=None (the library's choice) against 0.34.0 on fp8, TP1/TP4,
#     256 / 1024 / 2048 programs; the jax-triton merge's warps (1 / 2 / 4) at TP1;
#  2. GPU parity: fp8/bf16 against 0.34.0 (every implementation, TP1/TP2/TP4, scales 0.5/2.0),
#     bf16 against 0.30.0 (every implementation), the shim's GPU tests on 0.34's surface.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session8_e.sh
source tools/gpu_env.sh
set -o pipefail
timeout 150 python3 tools/fp8_kernel_ab.py --impl auto --programs 256,1024,2048 --geometries TP1,TP4 \
  --configs table --out "$OUT/ab_auto" 2>&1 | grep -v -i warning | tee "$OUT/ab_auto.log" | tail -12
timeout 90 python3 tools/fp8_kernel_ab.py --impl triton --programs 256,2048 --geometries TP1 \
  --configs 32/4/1/2/256/1,32/4/1/2/256/2,32/4/1/2/256/4 \
  --out "$OUT/ab_mwarps" 2>&1 | grep -v -i warning | tee -a "$OUT/ab_auto.log" | tail -8
tar -C "$OUT" -czf "$OUT/ab_auto.tgz" ab_auto ab_mwarps 2>/dev/null && rm -rf "$OUT/ab_auto" "$OUT/ab_mwarps"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rA -s tests/test_fp8.py -k "gpu_fp8_parity" \
  > "$OUT/fp8_parity.log" 2>&1; echo "fp8 parity rc=$?"; grep -E "FP8PARITY.*impl=triton|passed|failed" "$OUT/fp8_parity.log" | tail -12
timeout 130 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_gpu_parity.py -k "sparse_attention" \
  > "$OUT/parity030.log" 2>&1; echo "0.30 parity rc=$?"; tail -2 "$OUT/parity030.log"
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_shim_vllm034.py \
  > "$OUT/shim034.log" 2>&1; echo "shim 0.34 rc=$?"; tail -2 "$OUT/shim034.log"
