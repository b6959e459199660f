#!/usr/bin/env bash
# Everything that proves correctness on the lent GPU, in one call:
#   tests that need a GPU (parity of every implementation and of the shim with the
#   originals, goldens through the GPU kernels), the shim swap-in script, and
#   compute-sanitizer memcheck of the kernels on adversarial metadata.
# Usage (device tool, carry .whl and .cache/originals): bash tools/gpu_check.sh
source tools/gpu_env.sh
set -o pipefail
python3 -m pytest -q -s -p no:cacheprovider -rfE \
  tests/test_gpu_parity.py tests/test_golden.py tests/test_shim.py tests/test_pallas.py tests/test_triton.py \
  2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|FAILED|ERROR" | tail -25
grep "^PARITY" "$OUT/gpu_tests.log" > "$OUT/parity_summary.log" || true
python3 tools/swap_in_check.py 2>&1 | tee "$OUT/swap_in.log" | tail -12
bash tools/gpu_memcheck_parts.sh > "$OUT/memcheck.log" 2>&1
echo "compute-sanitizer memcheck:"; grep MEMCHECK "$OUT/memcheck.log"
