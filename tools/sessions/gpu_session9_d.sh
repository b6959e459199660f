#!/usr/bin/env bash
# Session 9, third device call (about 8.5 min), after the order change (jax-triton first for an
# fp8 cache at every one-warp entry of the H200 fp8 table, 129 programs up, prefill included):
#  1. the library's choice (implementation=None) at 4096 and 8192 fp8 programs and the prefill
#     flag, against 0.34.0 (confirms the change end to end);
#  2. bf16: jax-triton at the measured H200 bf16 table against the library's choice (Pallas) and
#     0.34.0's bf16 path, 1024 and 4096 programs (does the fp8 finding carry over?);
#  3. every fp8 GPU test (parity of each implementation against 0.34.0 and exact, TP1/TP2/TP4).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session9_d.sh
source tools/gpu_env.sh
set -o pipefail
AB="timeout 90 python3 tools/fp8_kernel_ab.py"
{
  $AB --geometries TP1,TP4 --impl auto --programs 4096,8192 --configs table --out "$OUT/ab_a_big"
  $AB --geometries TP1 --prefill --impl auto --programs 4096 --configs table --out "$OUT/ab_a_pre"
  $AB --geometries TP1,TP4 --kv-dtype bf16 --impl triton --programs 1024,4096 --configs table --out "$OUT/ab_bf16_t"
  $AB --geometries TP1,TP4 --kv-dtype bf16 --impl auto --programs 1024,4096 --configs table --out "$OUT/ab_bf16_a"
} 2>&1 | grep -v -i warning | tee "$OUT/ab.log" | grep -E "programs|x\) err"
tar -C "$OUT" -czf "$OUT/ab.tgz" ab_a_big ab_a_pre ab_bf16_t ab_bf16_a 2>/dev/null && rm -rf "$OUT"/ab_*/
timeout 380 python3 -m pytest -m gpu -p no:cacheprovider -rA tests/test_fp8.py > "$OUT/fp8_gpu.log" 2>&1
echo "fp8 gpu tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/fp8_gpu.log" | tail -25
