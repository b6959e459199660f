#!/usr/bin/env bash
# One device call (third session): the Pallas decode variants, the GPU tests of the
# strided-q / prefetch / shim work, the shim's host profile and the swap-in script.
#   1. bench.decode_floor at TP1/TP2/TP4 x rows 1..64 (variants: prefetch, 65 splits,
#      strided q) -> $OUT/decode_floor.md
#   2. GPU tests: tests/test_strided_query.py, the shim's and the Pallas kernels' GPU tests
#   3. tools/swap_in_check.py --quick (now also vLLM's strided q; copies are failures)
#   4. tools/profile_shim.py (does the export wait for JAX's launch?)
# Usage (device tool; carry .whl .cache/originals): bash tools/gpu_decode_and_shim.sh
source tools/gpu_env.sh
set -o pipefail
timeout "${DECODE_TIMEOUT:-230}" python3 -m bench.decode_floor --tp TP1,TP2,TP4 \
  --rows "${DECODE_ROWS:-1,4,16,32,64}" --out "$OUT/decode_floor.md" > "$OUT/decode_floor.log" 2>&1
echo "decode_floor rc=$?"
timeout "${TESTS_TIMEOUT:-170}" python3 -m pytest -q -s -m gpu -p no:cacheprovider -rfE \
  tests/test_strided_query.py tests/test_shim.py tests/test_pallas.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests.log" | tail -12
timeout "${SWAP_TIMEOUT:-120}" python3 tools/swap_in_check.py --quick > "$OUT/swap_in.log" 2>&1
echo "swap-in rc=$?"; grep -c "^PASS" "$OUT/swap_in.log"; grep -v "^PASS" "$OUT/swap_in.log" | tail -n 8
timeout "${PROFILE_TIMEOUT:-60}" python3 tools/profile_shim.py --tp TP1 --rows 1 > "$OUT/profile_shim.log" 2>&1
echo "profile rc=$?"; tail -n 24 "$OUT/profile_shim.log"
echo; cat "$OUT/decode_floor.md" 2>/dev/null || tail -n 30 "$OUT/decode_floor.log"
