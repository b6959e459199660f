#!/usr/bin/env bash
# Session 26, call h (carry .whl .cache/originals; ~200 s, any Hopper), after the CPU change it
# checks: config.H200_FP8's 25-32-program band from the Pallas sweep's (32, 16, 2 warps, 2 stages)
# to (32, 16, 1 warp, 2, "triton", Pallas keeping 2 warps) -- call g measured jax-triton (and the
# shim's default fp8 route, triton-torch) at 1.19-1.31x of 0.34.0 on the old entry.
# 1. fp8 GPU parity TP1 and TP4 (every implementation; e4m3, bytes, bf16 with scales). Prediction: pass.
# 2. triton-torch against 0.34.0 at TP1 16 rows and TP4 32 rows (32 programs), fp8. Prediction:
#    the default 0.89-1.00x (was 1.31 / 1.37x).
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 170 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_fp8.py \
  -k "gpu_fp8_parity and (TP1 or TP4)" > "$OUT/gpu_fp8.log" 2>&1
echo "gpu fp8 rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_fp8.log" | tail -5
for tp in TP1 TP4; do
  rows=16; [ $tp = TP4 ] && rows=32
  timeout -s INT 60 python3 tools/triton_torch_ab.py --rows $rows --tp $tp --kv fp8 --out "$OUT/tt_$tp" \
    > "$OUT/tt_$tp.log" 2>&1
  echo "triton-torch $tp rc=$?"; grep -E "^\| [0-9]+ \| (original|triton-torch default)" "$OUT/tt_$tp.log"
done
true
