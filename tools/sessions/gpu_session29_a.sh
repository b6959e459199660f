#!/usr/bin/env bash
# Session 29 call a (was gpu_next_i.sh, prepared in session 28 as gpu_session28_f.sh; its two starts failed) for the next lent GPU, asked
# for as kind nvidia-h200 (carry .whl .cache/originals; <= 420 s on an H200, <= 300 s on an H100).
# Any card (on an H200 last, in what time is left): the GPU tests of the Triton-image hook, which
# passed on an H100 in session 28's call g (4 passed).
# On an H200 (issue 13's card, last lent in session 17): first the targets -- the grid at 1024,
# 2048 and 4096 rows (fp8 over bf16 throughput, copy bandwidth; 0.30.0 / 0.34.0 / auto) and decode
# against 0.34.0 at 1 / 8 / 64 rows, TP1 and TP4. JAX's route now runs Triton's own cubins.
# Predictions (gpu_next_e.sh, gpu_next_g.sh): fp8/bf16 >= 1.8x at >= 1024 programs, 90-97% of copy
# bandwidth, auto <= 1.0x of 0.34.0 but for a few decode cases within 2%.
# On an H100 (session 29): gpu_session29_a_merge_sweep.sh (was gpu_next_k.sh) instead (the merge layouts at 96-256 pairs); the tests
# and the Gluon memcheck already passed on an H100 in session 28.
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card; $(date -u +%FT%TZ)"
source tools/gpu_env.sh
set -o pipefail
run_tests() {
  timeout -s INT "$1" python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_triton_images.py \
    tests/test_shim_direct.py -k "triton_images or jax_route_runs_the_torch_routes_cubins" \
    > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " "$OUT/gpu_tests.log" | head -20
}
if [[ "$card" != *H200* ]]; then
  bash tools/sessions/gpu_session29_a_merge_sweep.sh
  exit 0
fi
slug=$(echo "$card" | tr 'A-Z ' 'a-z-')_$(date +%F)
timeout -s TERM 180 python3 -m bench.run --op sparse --impl original,original034,auto \
  --kv-dtype bf16,fp8 --rows 1024,2048,4096 --n-calls 10 --eager-calls 3 --no-progress --no-plot \
  --out "$OUT/${slug}_grid" --tp TP1,TP4 > "$OUT/grid.log" 2>&1
echo "grid rc=$?"; [ -f "$OUT/${slug}_grid/results.json" ] && rm -f "$OUT/${slug}_grid/results.partial.json"; tail -n 2 "$OUT/grid.log"
timeout -s TERM 100 python3 -m bench.run --op sparse --impl original034,auto --kv-dtype bf16,fp8 \
  --rows 1,8,64 --n-calls 10 --eager-calls 3 --no-progress --no-plot --out "$OUT/${slug}_decode" \
  --tp TP1,TP4 > "$OUT/decode.log" 2>&1
echo "decode rc=$?"; [ -f "$OUT/${slug}_decode/results.json" ] && rm -f "$OUT/${slug}_decode/results.partial.json"; tail -n 2 "$OUT/decode.log"
for d in grid decode; do
  echo "== $d (where | rows | 0.30 busy | 0.34 busy | auto busy | x)"
  python3 tools/busy_table.py "$OUT/${slug}_$d/results.md" | cut -d'|' -f3,4,6,7,15,16
done
grep -E "^\| (TP1|TP4)" "$OUT/${slug}_grid/results.md" | head -30
run_tests 90
true
