#!/usr/bin/env bash
# Cold vs warm first-call cost per implementation: two fresh processes each, sharing
# one JAX persistent cache folder (the first fills it, the second loads from it).
# Usage (device tool): source tools/gpu_env.sh; bash tools/gpu_compile_cost.sh
set -u
for impl in ${IMPLS:-pallas triton}; do
  dir=$(mktemp -d /tmp/qsa_xla_cache.XXXX)
  for label in cold warm; do
    timeout 120 python3 -m bench.compile_cost --impl "$impl" --cache-dir "$dir" --rows "${ROWS:-3,24,96}" \
      --label "$label" 2>>"$OUT/compile_cost.err" | tee -a "$OUT/compile_cost.jsonl"
  done
done
