#!/usr/bin/env bash
# Next device call after session 8 (not yet run; about 8 min of device time):
#  1. fp8 buckets session 8 did not time with jax-triton: the library's choice (implementation=
#     None: Pallas at 8-128 and 4096 programs, jax-triton at 129-2048) and jax-triton at the same
#     table tiling, against 0.34.0, TP1/TP4 at 8, 32, 128, 512 and 4096 programs (decides whether
#     config.sparse_attention_order's rule and JAX_TRITON_FP8_MAX_PROGRAMS should widen or narrow);
#  2. every fp8 GPU test (parity of every implementation against 0.34.0 and exact, TP1/TP2/TP4,
#     with the final 2-warp jax-triton merge; the knob bit-identity cases);
#  3. compute-sanitizer memcheck of the jax-triton kernels including their new fp8 part.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session9_a.sh
source tools/gpu_env.sh
set -o pipefail
timeout 150 python3 tools/fp8_kernel_ab.py --impl auto --programs 8,32,128,512,4096 --geometries TP1,TP4 \
  --configs table --out "$OUT/ab_auto" 2>&1 | grep -v -i warning | tee "$OUT/ab.log" | tail -20
timeout 150 python3 tools/fp8_kernel_ab.py --impl triton --programs 8,32,128,512,4096 --geometries TP1,TP4 \
  --configs table --out "$OUT/ab_triton" 2>&1 | grep -v -i warning | tee -a "$OUT/ab.log" | tail -20
tar -C "$OUT" -czf "$OUT/ab.tgz" ab_auto ab_triton 2>/dev/null && rm -rf "$OUT/ab_auto" "$OUT/ab_triton"
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_fp8.py > "$OUT/fp8_gpu.log" 2>&1
echo "fp8 gpu tests rc=$?"; tail -2 "$OUT/fp8_gpu.log"
NO_PLANT=1 IMPLS=triton PARTS="sparse0 fp8" PART_TIMEOUT=60 timeout 130 bash tools/gpu_memcheck_parts.sh > /dev/null 2>&1
cat "$OUT/memcheck_summary.log"
