#!/usr/bin/env bash
# One device call that re-records the goldens and runs the GPU tests of every feature,
# within the 10-minute command limit:
#   1. tools/record_goldens.py: vLLM 0.30.0's goldens (poison that shows) and 0.34.0's
#      (e4m3, bytes, bf16 with scales) -> $OUT/golden.tgz (unpack into tests/golden)
#   2. GPU tests: parity with both contracts, fp8 against 0.34.0 and exact attention, the
#      Pallas kernels, the shim (0.30 and 0.34 surfaces), gradients at the real shapes
#   3. bench.backward: busy time and peak memory of the backward -> $OUT/backward/
# Usage (device tool; carry .whl .cache/originals): bash tools/gpu_verify.sh
source tools/gpu_env.sh
set -o pipefail
mkdir -p "$OUT/golden"
timeout "${GOLDEN_TIMEOUT:-150}" python3 tools/record_goldens.py --out "$OUT/golden" > "$OUT/goldens.log" 2>&1
echo "goldens rc=$?"; tail -n 6 "$OUT/goldens.log"
tar -C "$OUT" -czf "$OUT/golden.tgz" golden && rm -rf "$OUT/golden"
QSA_PARITY_IMPLS=${QSA_PARITY_IMPLS:-pallas,triton} QSA_PARITY_ROWS=${QSA_PARITY_ROWS:-1,64,4096} \
QSA_GRAD_ROWS=${QSA_GRAD_ROWS:-1,1024} \
  timeout "${TESTS_TIMEOUT:-330}" python3 -m pytest -q -s -m gpu -p no:cacheprovider -rfE \
  tests/test_gpu_parity.py tests/test_fp8.py tests/test_pallas.py tests/test_shim.py \
  tests/test_shim_vllm034.py tests/test_gpu_backward.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests.log" | tail -25
timeout -s TERM "${BENCH_TIMEOUT:-100}" python3 -m bench.backward --tp TP1 --rows "${BWD_ROWS:-1024}" \
  --autodiff --out "$OUT/backward" > "$OUT/bench_backward.log" 2>&1
echo "bench.backward rc=$?"; grep -E "^\| TP" "$OUT/bench_backward.log" | tail -12
