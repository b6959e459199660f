#!/usr/bin/env bash
# One device call: does the opt-in fp8 K conversion through f16/f32
# (config.pallas_fp8_keys_via_f16, notes/pallas.md "fp8 loads on sm_90") pay off? (Run in
# session 6: it did, 5-10%; the knob is now on by default and "off" sets it False.)
#   1. XLA's own Triton (not the venv's): the forward's PTX from --xla_dump_to, knob off
#      and on -- counts of the direct f16 -> bf16 conversions (cvt.bf16.f16) and of the
#      e4m3 ones, TP1 shapes at 2048 rows (block_n 64, 1 split, 2 warps).
#   2. The fp8 grid rows that were slow (TP1, rows 128..2048) for 0.34.0 and Pallas, knob
#      off then on, in $OUT/off and $OUT/on (results.md each).
#   3. The GPU bit-identity test of the knob.
# Usage (device tool; carry .whl .cache/originals): bash tools/gpu_fp8_keys.sh
# Knobs: ROWS (default 128,256,512,1024,2048), GRID_TIMEOUT (per grid, default 150; the whole call stays under 600 s).
source tools/gpu_env.sh
set -o pipefail
knob() { echo "import qsa_jax.config as c; c.pallas_fp8_keys_via_f16 = lambda: $1"; }  # on since session 6
for state in off on; do
  dump="$OUT/xla_dump_$state"
  XLA_FLAGS="--xla_dump_to=$dump" timeout 90 python3 - "$state" <<'PY' > "$OUT/dump_$state.log" 2>&1
import sys
import jax, jax.numpy as jnp, numpy as np
import qsa_jax, qsa_jax.config as c
from qsa_testing import cases as C
c.pallas_fp8_keys_via_f16 = lambda: sys.argv[1] == "on"
case = C.sparse_attention_case(np.random.default_rng(0), rows=2048, num_query_heads=24, num_kv_heads=2,
                               head_dim=256, page_size=64, selection_blocks=512, context_tokens=4096,
                               num_requests=8, make_cache=False)
kv = jnp.ones(case.kv_shape, jnp.uint8)
out = qsa_jax.sparse_attention(case.q, kv, case.logical_indices, case.block_table, case.token_to_req,
                               case.output_gate, implementation="pallas", config=(64, 2, 33, 1),
                               k_scale=0.5, v_scale=2.0)
print(sys.argv[1], out.shape, jax.block_until_ready(out).dtype)
PY
  echo "dump $state rc=$? ptx files: $(ls "$dump"/*.ptx 2>/dev/null | wc -l)" \
       "cvt.bf16.f16: $(cat "$dump"/*.ptx 2>/dev/null | grep -c 'cvt.bf16.f16')" \
       "e4m3x2: $(cat "$dump"/*.ptx 2>/dev/null | grep -c 'cvt.rn.f16x2.e4m3x2')" \
       "cvt.f32.f16: $(cat "$dump"/*.ptx 2>/dev/null | grep -c 'cvt.f32.f16')"
  tar -C "$OUT" -czf "$dump.tgz" "xla_dump_$state" && rm -rf "$dump"
done
grid() {  # $1: off|on
  local pre; pre="$(knob "$([ "$1" = on ] && echo True || echo False)"); "
  timeout -s TERM "${GRID_TIMEOUT:-150}" python3 -c "${pre}import runpy, sys; sys.argv = ['bench.run'] + sys.argv[1:]; runpy.run_module('bench.run', run_name='__main__')" \
    --op sparse --impl original034,pallas --kv-dtype fp8 --tp TP1 --rows "${ROWS:-128,256,512,1024,2048}" \
    --n-calls 10 --eager-calls 3 --no-progress --no-plot --out "$OUT/$1" > "$OUT/grid_$1.log" 2>&1
  echo "grid $1 rc=$?"; rm -f "$OUT/$1/results.partial.json"
  grep -E "^\| sparse_attention \| TP1 fp8 \| [0-9]+ \|  \| \(" "$OUT/$1/results.md" | cut -c1-140
}
grid off
grid on
timeout 90 python3 -m pytest -q -s -m gpu -p no:cacheprovider -rfE tests/test_fp8.py -k keys_via_f16 \
  > "$OUT/knob_tests.log" 2>&1
echo "knob gpu tests rc=$?"; grep -E "passed|failed|FAILED" "$OUT/knob_tests.log" | tail -4
