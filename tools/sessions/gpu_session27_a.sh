#!/usr/bin/env bash
# Session 27, call a (carry .whl .cache/originals; <= 590 s). Asked for as kind nvidia-h200:
# - on an H200 (issue 13's card, not lent since session 17): session 23's prepared targets,
#   `gpu_next_g.sh targets` (predictions there).
# - on an H100:
#   1. Is session 26's "the 1.03x at TP1 fp8 8 / 32 rows is on the JAX side" right? Its evidence
#      compared the JAX route on bench.run's fresh input sets (call c) with the torch launch in
#      tools/triton_torch_ab.py, which times one input set over and over: 16.8 MB of fp8 K/V at
#      8 rows stays in the H100's 50 MB L2. Here the shim's triton-torch route (the same kernels
#      launched by torch) is traced beside the JAX default and 0.34.0 in one bench.run, on the
#      same fresh sets (`bench.measure` traces the shims since this session). Prediction: shim-tt
#      within 1% of auto's busy time at 8 and 32 rows, both ~1.02-1.03x of 0.34.0: the gap is the
#      kernel on cold K/V rows, not JAX's launch.
#   2. XLA's buffer assignment of that JAX call (TP1 fp8 8 rows, jax-triton): the offsets of the
#      split kernel's partials, for the alignment question should shim-tt be faster after all.
#   3. fp8 GPU parity at the new GPU_ROWS (1, 2, 16, 32, 64, 264, 2048: every distinct sm_90 fp8
#      tiling at some TP), TP1 / TP2 / TP4. Prediction: 9 passed.
#   4. memcheck of the fp8 part through jax-triton, now also at the 25-32-program one-warp tiling
#      forced on shapes 0 and 2 (session 26's entry, not memchecked yet). Prediction: control
#      reports errors, the part 0 errors, 8 launches agree.
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$card" == *H200* ]]; then
  exec bash tools/sessions/gpu_next_g.sh targets
fi
source tools/gpu_env.sh
set -o pipefail
dir="$OUT/$(echo "$card" | tr 'A-Z ' 'a-z-')_$(date +%F)_decode_shim"
timeout -s TERM 200 python3 -m bench.run --op sparse --impl original,original034,auto,shim-tt --shim-graph \
  --kv-dtype fp8,bf16 --rows 4,8,16,32,64 --trace-rows 64 --n-calls 10 --eager-calls 5 \
  --no-progress --no-plot --out "$dir" --tp TP1,TP4 > "$OUT/decode_shim.log" 2>&1
echo "decode+shim rc=$?"; rm -f "$dir/results.partial.json"; tail -n 2 "$OUT/decode_shim.log"

mkdir -p "$OUT/xla_dump"
XLA_FLAGS="--xla_dump_to=$OUT/xla_dump" timeout 90 python3 - > "$OUT/xla_dump.log" 2>&1 <<'PY'
import jax, jax.numpy as jnp, numpy as np
import qsa_jax
from qsa_jax import arg_specs
from qsa_testing import cases as C
g = arg_specs.GEOMETRIES["TP1"]
rng = np.random.default_rng(8)
case = C.sparse_attention_case(rng, rows=8, num_query_heads=g.num_query_heads, num_kv_heads=g.num_kv_heads,
                               head_dim=g.head_dim, page_size=g.page_size, selection_blocks=arg_specs.SELECTION_BLOCKS,
                               context_tokens=65536, num_pages=64, make_cache=True)
kv = jnp.asarray((case.kv_cache.astype(np.float32) * 3).astype(C.E4M3))
f = jax.jit(lambda *a: qsa_jax.sparse_attention(*a, implementation="triton", k_scale=0.5, v_scale=2.0))
out = f(case.q, kv, case.logical_indices, case.block_table, case.token_to_req, case.output_gate)
print("finite", bool(jnp.isfinite(out.astype(jnp.float32)).all()), out.shape)
PY
echo "xla dump rc=$?"; tail -n 2 "$OUT/xla_dump.log"
cp "$OUT"/xla_dump/*jit__lambda*after_optimizations-buffer-assignment.txt "$OUT/xla_buffers.txt" 2>/dev/null
grep -E "^allocation|custom-call" "$OUT/xla_buffers.txt" | head -24

timeout -s INT 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s tests/test_fp8.py -k gpu_fp8_parity \
  > "$OUT/gpu_fp8_parity.log" 2>&1
echo "fp8 parity rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_fp8_parity.log" | tail -5

IMPLS=triton PARTS=fp8 PART_TIMEOUT=120 bash tools/gpu_memcheck_parts.sh

echo "== busy (TP, rows, 0.30 busy, 0.34 busy, auto busy, x, shim-tt busy, x)"
python3 tools/busy_table.py "$dir/results.md" | cut -d'|' -f3,4,6,7,15,16,17,18
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz --exclude=xla_dump . 2>/dev/null
true
