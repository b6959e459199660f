#!/usr/bin/env bash
# Device call for the single-launch decode (notes/pallas.md, "Session 6"), one H200, < 10 min:
#   main:   GPU tests of the fused merge (tests/test_fused_merge.py), then bench.fused_decode at the
#           table's tiling (TP1 1/2/4/8 rows, TP4 1/4/16 rows; separate vs fused beside vLLM 0.30.0
#           and 0.34.0) -> $OUT/fused_decode/
#   splits: bench.fused_decode on fewer splits with whole-D merge steps (where a serial merge could
#           pay) -> $OUT/fused_decode_splits/
# Usage (device tool; carry .whl .cache/originals): bash tools/gpu_fused_decode.sh main|splits
source tools/gpu_env.sh
set -o pipefail
part="${1:-main}"
if [ "$part" = main ]; then
  timeout "${TESTS_TIMEOUT:-180}" python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_fused_merge.py \
    > "$OUT/gpu_tests_fused_merge.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_fused_merge.log" | tail -8
  timeout "${BENCH_TIMEOUT:-200}" python3 -m bench.fused_decode --out "$OUT/fused_decode" > "$OUT/fused_decode.log" 2>&1
  echo "fused_decode rc=$?"; cat "$OUT/fused_decode/fused_decode.md" 2>/dev/null || tail -n 30 "$OUT/fused_decode.log"
else
  timeout "${BENCH_TIMEOUT:-200}" python3 -m bench.fused_decode --out "$OUT/fused_decode_splits" \
    --cases "${SPLIT_CASES:-TP4:1@16/256,TP4:1@8/256,TP4:16@8/256,TP1:1@16/128}" > "$OUT/fused_decode_splits.log" 2>&1
  echo "fused_decode splits rc=$?"
  cat "$OUT/fused_decode_splits/fused_decode.md" 2>/dev/null || tail -n 30 "$OUT/fused_decode_splits.log"
fi
