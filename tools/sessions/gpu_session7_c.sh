#!/usr/bin/env bash
# Session 7, call C (one device call, <= ~9.7 min), in order of need:
#  1. the shim's GPU ordering / in-place tests on both out= routes (tools/sessions/gpu_shim7.sh step 1),
#  2. the fp8 kernel knobs against 0.34.0 at 256/1024/2048 programs, each output checked bit
#     for bit against the knobs off (tools/sessions/gpu_fp8_kernel7.sh step 2),
#  3. the shim's eager grid against the originals (tools/sessions/gpu_shim7.sh step 2),
#  4. bench.backward with order="inverted" (tools/sessions/gpu_backward7.sh step 2, plus the XLA
#     backward's jax.grad in the same run), with what time is left.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session7_c.sh
source tools/gpu_env.sh
set -o pipefail
left() { echo $(( ${1:-575} - SECONDS )); }
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/test_shim*.py \
  -k "(race or identity) and TP1 or fast_import_route" > "$OUT/shim7_gpu_tests.log" 2>&1
echo "shim gpu tests rc=$? (${SECONDS} s)"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/shim7_gpu_tests.log" | tail -6
timeout 170 python3 tools/fp8_kernel_ab.py --programs 256,1024,2048 --geometries TP1,TP4 --configs table \
  --knob pallas_fp8_value_pairs --knob pallas_fp8_value_pairs+pallas_fp8_keys_f16_dot \
  --out "$OUT/ab_table" 2>&1 | grep -v -i warning > "$OUT/ab_table.log"
echo "fp8 A/B rc=$? (${SECONDS} s)"; tail -24 "$OUT/ab_table.log"
timeout 110 python3 tools/profile_shim.py --tp TP1 --grid 1,8,64,512,2048 > "$OUT/shim7_grid.log" 2>&1
echo "shim grid rc=$? (${SECONDS} s)"; tail -n 12 "$OUT/shim7_grid.log"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')
res="$OUT/backward7"; mkdir -p "$res"
timeout -s TERM "$(left)" python3 -m bench.backward --tp TP1 --rows 1024 --requests 0,1 \
  --no-acq-rel --variants inverted --grad-orders inverted --out "$res" > "$res/bench_backward.log" 2>&1
echo "bench.backward rc=$? (${SECONDS} s)"; grep -E "^\| TP" "$res/bench_backward.log" | tail -16
tar -C "$OUT" -czf "$OUT/session7_c.tgz" ab_table backward7 2>/dev/null && rm -rf "$OUT/ab_table" "$OUT/backward7"
