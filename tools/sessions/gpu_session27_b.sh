#!/usr/bin/env bash
# Session 27, call b (carry .whl .cache/originals; <= 590 s), any card.
# Call a found the split kernel 1.6-3.9% slower at TP1 fp8 8-64 rows when JAX launches it than
# when torch launches it (the shim's triton-torch route), on the same fresh input sets; TP4 level.
# XLA's buffers for the partials are 256-byte aligned, so not that. The one other difference:
# who assembles the PTX. Triton's launcher runs Triton's own bundled ptxas; jax-triton hands the
# PTX to jaxlib, which assembles it with XLA's ptxas (stream_executor::CompileGpuAsm, another
# CUDA release). TP1's kernels sit at 255 registers with spills, where ptxas versions differ most.
# Prediction: the two ptxas give different register/spill counts or SASS lengths for TP1's split
# kernel and the same or nearly for TP4's; the torch route assembled with XLA's ptxas
# (TRITON_PTXAS_PATH) loses the 2-4% at TP1, and the JAX route assembled with Triton's ptxas
# (a wrapper first in XLA's search, routing only our kernels to it) gains it.
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
slug=$(echo "$card" | tr 'A-Z ' 'a-z-')_$(date +%F)
TRITON_PTXAS=$(python3 -c "import os, triton; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin/ptxas'))")
echo "== ptxas on this machine"
for p in "$TRITON_PTXAS" $(find / -xdev -name ptxas -type f 2>/dev/null | grep -v "$TRITON_PTXAS" | head -5); do
  echo "$p: $("$p" --version 2>&1 | grep -o 'release [0-9.]*, V[0-9.]*')"
done | tee "$OUT/ptxas_versions.txt"
SYS_PTXAS=$(grep -v "^$TRITON_PTXAS:" "$OUT/ptxas_versions.txt" | head -1 | cut -d: -f1)

echo "== 1. the jax-triton PTX of the default launches (TP1 fp8 8/16/32/64 rows, TP4 fp8 32), each ptxas"
mkdir -p "$OUT/jt_dump"
JAX_TRITON_DUMP_DIR="$OUT/jt_dump" timeout 120 python3 - > "$OUT/jt_dump.log" 2>&1 <<'PY'
import jax.numpy as jnp, numpy as np
import qsa_jax
from qsa_jax import arg_specs
from qsa_testing import cases as C
for tp, rows in (("TP1", 8), ("TP1", 16), ("TP1", 32), ("TP1", 64), ("TP4", 32)):
    g = arg_specs.GEOMETRIES[tp]
    case = C.sparse_attention_case(np.random.default_rng(rows), rows=rows, num_query_heads=g.num_query_heads,
                                   num_kv_heads=g.num_kv_heads, head_dim=g.head_dim, page_size=g.page_size,
                                   selection_blocks=arg_specs.SELECTION_BLOCKS, context_tokens=65536,
                                   num_requests=1, make_cache=True)
    kv = jnp.asarray((case.kv_cache.astype(np.float32) * 3).astype(C.E4M3))
    out = qsa_jax.sparse_attention(case.q, kv, case.logical_indices, case.block_table, case.token_to_req,
                                   case.output_gate, implementation="triton", k_scale=0.5, v_scale=2.0)
    print(tp, rows, bool(jnp.isfinite(out.astype(jnp.float32)).all()))
PY
echo "dump rc=$?"; tail -n 5 "$OUT/jt_dump.log"
for ptx in "$OUT"/jt_dump/*/sparse_attention_split_kernel*.ptx; do
  h=$(basename "$(dirname "$ptx")")
  for which in triton system; do
    bin=$TRITON_PTXAS; [ "$which" = system ] && bin=$SYS_PTXAS
    "$bin" -v -O3 --gpu-name=sm_90a "$ptx" -o "$OUT/${h}_$which.cubin" > "$OUT/${h}_$which.ptxas.txt" 2>&1
    n=$(cuobjdump -sass "$OUT/${h}_$which.cubin" 2>/dev/null | grep -cE '^\s+/\*[0-9a-f]{4}\*/')
    echo "$h $which: $(grep -oE 'Used [0-9]+ registers|[0-9]+ bytes spill stores|[0-9]+ bytes spill loads' "$OUT/${h}_$which.ptxas.txt" | tr '\n' ' ') sass=$n"
  done
  grep -m1 -oE "num_warps[^,]*|BLOCK_N[^,]*" "$(dirname "$ptx")/config" 2>/dev/null | tr '\n' ' '; echo
done | tee "$OUT/ptxas_compare.txt"

run_bench() {  # run_bench <name> [env assignments...]
  local name=$1; shift
  env "$@" timeout -s TERM 110 python3 -m bench.run --op sparse --impl original034,auto,shim-tt --shim-graph \
    --kv-dtype fp8 --rows 8,16,32,64 --trace-rows 64 --n-calls 10 --eager-calls 3 --no-progress --no-plot \
    --out "$OUT/${slug}_$name" --tp TP1 > "$OUT/bench_$name.log" 2>&1
  echo "bench $name rc=$?"; rm -f "$OUT/${slug}_$name/results.partial.json"
}
echo "== 2. busy time, TP1 fp8: default / torch route on the system ptxas / JAX route on Triton's ptxas"
run_bench default
run_bench torch_sys_ptxas TRITON_PTXAS_PATH="$SYS_PTXAS"
FAKE=/tmp/fakecuda; mkdir -p "$FAKE/bin"
ln -sfn "$(dirname "$(dirname "$SYS_PTXAS")")/nvvm" "$FAKE/nvvm"
cat > "$FAKE/bin/ptxas" <<SH
#!/bin/bash
# Our split and merge kernels to Triton's ptxas, everything else (XLA's own fusions) to $SYS_PTXAS.
for a in "\$@"; do
  if [[ "\$a" == *.ptx && -f "\$a" ]] && grep -q "sparse_attention_" "\$a"; then
    echo "triton \$*" >> "$OUT/ptxas_wrapper_calls.log"; exec "$TRITON_PTXAS" "\$@"
  fi
done
echo "system \$*" >> "$OUT/ptxas_wrapper_calls.log"; exec "$SYS_PTXAS" "\$@"
SH
chmod +x "$FAKE/bin/ptxas"
run_bench jax_triton_ptxas PATH="$FAKE/bin:$PATH" XLA_FLAGS="--xla_gpu_cuda_data_dir=$FAKE"
echo "wrapper calls: $(grep -c '^triton' "$OUT/ptxas_wrapper_calls.log" 2>/dev/null) to Triton's ptxas, $(grep -c '^system' "$OUT/ptxas_wrapper_calls.log" 2>/dev/null) to the system's"

echo "== split-kernel busy µs (0.34.0 / auto / shim-tt) per run"
python3 - "$OUT" "$slug" <<'PY'
import json, sys, pathlib
out, slug = sys.argv[1:]
for name in ("default", "torch_sys_ptxas", "jax_triton_ptxas"):
    p = pathlib.Path(out) / f"{slug}_{name}" / "results.json"
    if not p.exists():
        print(name, "no results"); continue
    rows = {}
    for r in json.loads(p.read_text())["results"]:
        k = r.get("busy_kernels_us") or {}
        split = next((v for n, v in k.items() if "split" in n or "gqa" in n), None)
        rows.setdefault(r["rows"], {})[r["impl"]] = (split, r.get("busy_s"))
    for n, v in sorted(rows.items()):
        cells = " ".join(f"{i}={v[i][0]:.2f}/{v[i][1] * 1e6:.2f}" if i in v and v[i][0] else f"{i}=-"
                         for i in ("original034", "auto", "shim-tt"))
        print(f"{name:17s} rows={n:3d} split/busy: {cells}")
PY
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz --exclude='*.cubin' . 2>/dev/null
true
