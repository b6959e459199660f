#!/usr/bin/env bash
# Session 10, after making order="inverted" (dq walk at 2 warps) the backward's default and
# giving H200_FP8's 5-24-program buckets a jax-triton entry at 0.34.0's tiling (about 9 min):
#  1. fp8 at 4-32 programs, the library's choice against 0.34.0, and Pallas at the new entry's
#     tiling (what runs where jax-triton is not installed);
#  2. the GPU gradient tests (real shapes now on the inverted walk; "selection" as a variant);
#  3. compute-sanitizer memcheck of the backward part (now the inverted kernels);
#  4. bench.backward at TP1 1024 rows with jax.grad of the XLA reference (the >= 5x target).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session10_d.sh
source tools/gpu_env.sh
set -o pipefail
{
  timeout 70 python3 tools/fp8_kernel_ab.py --geometries TP1,TP4 --impl auto --programs 4,8,16,24,32 \
    --configs table --out "$OUT/fp8_auto"
  timeout 60 python3 tools/fp8_kernel_ab.py --geometries TP1,TP4 --impl pallas --programs 8,16,24 \
    --configs 64/33/2/2 --out "$OUT/fp8_pallas"
} 2>&1 | grep -v -i warning | tee "$OUT/fp8.log" | grep -E "programs|x\) err"
timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider -rA -s tests/test_gpu_backward.py \
  > "$OUT/gpu_backward_tests.log" 2>&1
echo "gpu backward tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_backward_tests.log" | tail -8
grep -E "^GRAD" "$OUT/gpu_backward_tests.log" | sort -t' ' -k8 | tail -4
PARTS=backward IMPLS=pallas NO_PLANT=1 PART_TIMEOUT=90 bash tools/gpu_memcheck_parts.sh
timeout 110 python3 -m bench.backward --tp TP1 --rows 1024 --requests 0 --reps 3 --no-acq-rel --variants selection \
  --out "$OUT/bwd_xla" 2>&1 | grep -v -i warning | grep "^|"
