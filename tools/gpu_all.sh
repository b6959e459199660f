#!/usr/bin/env bash
# One device call that does everything, within the 10-minute command limit:
#   1. the full benchmark grid (bench/run.py) -> $OUT/<card>_<date>/
#   2. GPU tests: parity of the kernels and of the shim with the originals
#   3. the shim swap-in script
#   4. compute-sanitizer memcheck of the kernels on adversarial metadata (tools/gpu_memcheck_parts.sh)
# Time limits per step keep the whole call under the limit; the benchmark
# writes whatever it has finished when its limit ends it.
# Usage (device tool; carry .whl .cache/originals): QSA_GIT_COMMIT=<sha> bash tools/gpu_all.sh
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')
res="$OUT/${card}_$(date +%F)"
timeout -s TERM "${BENCH_TIMEOUT:-410}" python3 -m bench.run --out "$res" ${BENCH_ARGS:-} \
  > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
rm -f "$res/results.partial.json"  # the final files replace it
tail -n 4 "$OUT/bench.log"
# The benchmark already checked every implementation against the originals on
# every case; here: the shim's own GPU tests first, then the kernels' tests.
QSA_PARITY_IMPLS=${QSA_PARITY_IMPLS:-pallas,triton} QSA_PARITY_ROWS=${QSA_PARITY_ROWS:-1,64,4096} \
  timeout "${TESTS_TIMEOUT:-100}" python3 -m pytest -q -s -m gpu -p no:cacheprovider -rfE \
  tests/test_shim.py tests/test_pallas.py tests/test_triton.py tests/test_gpu_parity.py \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests.log" | tail -12
timeout 120 python3 tools/swap_in_check.py --quick > "$OUT/swap_in.log" 2>&1
echo "swap-in rc=$?"; tail -n 4 "$OUT/swap_in.log"
PART_TIMEOUT=${MEMCHECK_PART_TIMEOUT:-45} bash tools/gpu_memcheck_parts.sh > "$OUT/memcheck.log" 2>&1
echo "compute-sanitizer memcheck:"; grep MEMCHECK "$OUT/memcheck.log"
