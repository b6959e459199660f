#!/usr/bin/env bash
# Session 25 call b (any Hopper; carry .whl .cache/originals): bash tools/sessions/gpu_session25_b.sh
# Call a (gpu_session25_a.sh, H100) swept the split merge's D chunk and warps at decode: the
# jax-triton merge's 64-wide chunks ran 4 warps (an early choice) and 2 warps was faster at
# 48-192 (row, head) pairs (merge 2.4-3.4 against 2.6-4.1 us), the same at 24; the chunk width
# mattered less; the Pallas merge (64-wide chunks on 2 warps already) was at its best. Now
# config.TRITON_MERGE_WARPS = 2 everywhere.
# 1. Decode rows against vLLM 0.34.0, busy time per kernel. Prediction: jax-triton at TP1 fp8 8
#    rows from 1.08x (session 24) to <= 1.04x of 0.34.0 (merge ~3.4 against 3.2 us, the split
#    kernel +3%); TP4 fp8 16 rows and TP1 fp8 4 rows <= 1.02x; bf16 jax-triton rows alike.
# 2. GPU tests: fp8 parity (every implementation, TP1/TP2/TP4, against 0.34.0 and exact), the
#    bf16 parity of jax-triton at decode rows, and the shim's 0.34 surface on the GPU (its JAX
#    route now hands qsa_jax KVScales). Prediction: all pass.
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
dir="$OUT/$(echo "$card" | tr 'A-Z ' 'a-z-')_$(date +%F)_decode"
timeout -s TERM 210 python3 -m bench.run --op sparse --impl original034,triton,auto \
  --kv-dtype bf16,fp8 --rows 1,2,4,8,16,32 --trace-rows 32 --n-calls 10 --eager-calls 5 \
  --no-progress --no-plot --out "$dir" --tp TP1,TP4 > "$OUT/decode.log" 2>&1
echo "decode grid rc=$?"; rm -f "$dir/results.partial.json"; tail -n 2 "$OUT/decode.log"
timeout -s INT 170 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s tests/test_fp8.py \
  -k "gpu_fp8_parity" > "$OUT/gpu_fp8.log" 2>&1
echo "gpu fp8 tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_fp8.log" | tail -5
QSA_PARITY_IMPLS=triton QSA_PARITY_ROWS=1,4,16 timeout -s INT 90 python3 -m pytest -q -m gpu \
  -p no:cacheprovider -rfE -s tests/test_gpu_parity.py -k sparse > "$OUT/gpu_parity.log" 2>&1
echo "gpu parity rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_parity.log" | tail -5
timeout -s INT 60 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_shim_vllm034.py \
  > "$OUT/gpu_shim034.log" 2>&1
echo "gpu shim 0.34 rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_shim034.log" | tail -5
python3 tools/busy_table.py "$dir/results.md"
true
