#!/usr/bin/env bash
# Session 27, call c (carry .whl .cache/originals; <= 300 s), any card.
# Call b: Triton's ptxas (12.8) and XLA's (13.0) turn jax-triton's PTX into the same SASS, so the
# 2-4% the split kernel loses at TP1 fp8 under JAX's launch is not the assembler. Next: is the
# PTX itself the same? Both launchers take the same LaunchPlan (constexprs, warps, stages), but
# Triton's JIT specialises the arguments itself (16-byte-aligned pointers, integers divisible by
# 16 or equal to 1) and jax-triton does its own. Here one process runs TP1 fp8 16 rows (32
# programs, the one-warp 16-split entry) through the shim's triton-torch and JAX routes on the same
# tensors, dumps both split kernels' PTX (jax-triton's JAX_TRITON_DUMP_DIR; the shim's cached
# CompiledKernel), and compares PTX, registers/spills and SASS. Prediction: the PTX differs in
# the specialisation of some argument (a divisibility or constant), and the SASS with it.
source tools/gpu_env.sh
set -o pipefail
mkdir -p /tmp/jt_dump
JAX_TRITON_DUMP_DIR=/tmp/jt_dump timeout 150 python3 - "$OUT" > "$OUT/dump.log" 2>&1 <<'PY'
import os, sys
import torch
sys.path.insert(0, "tools")
import qsa_torch_shim as S
from qsa_torch_shim import _direct
from qsa_jax import arg_specs
import triton_torch_ab as T

out = sys.argv[1]
geo = arg_specs.GEOMETRIES["TP1"]
base = torch.randn((64, geo.num_kv_heads, geo.page_size, 2 * geo.head_dim), device="cuda")
pool = (base * 2).to(torch.float8_e4m3fn)
del base
args, gate = T._inputs(geo, 16, pool, seed=23)
got = {}
for impl in ("triton-torch", "jax"):
    args[7].fill_(float("nan"))
    S.qsa_sparse_paged_attention(*args, 0.5, 2.0, output_gate=gate, implementation=impl)
    torch.cuda.synchronize()
    got[impl] = args[7].clone()
print("bit-identical:", torch.equal(got["triton-torch"], got["jax"]),
      "finite:", bool(torch.isfinite(got["jax"].float()).all()))
for key, entry in _direct._SIGNATURES.items():
    if not entry or entry[3] is None:
        continue
    split = entry[3][0]
    for ckey, (ck, values) in (split.compiled or {}).items():
        open(f"{out}/torch_split.ptx", "w").write(ck.asm["ptx"])
        open(f"{out}/torch_split.cubin", "wb").write(ck.asm["cubin"])
        md = ck.metadata
        print("torch split:", "n_regs", ck.n_regs, "n_spills", ck.n_spills, "shared", md.shared,
              "num_warps", md.num_warps, "alignment key", ckey)
        print("torch scalar args:", [v for v in values if not isinstance(v, torch.Tensor)][:8])
PY
echo "dump rc=$?"; cat "$OUT/dump.log" | grep -v Warning | tail -6
jt=$(ls /tmp/jt_dump/*/sparse_attention_split_kernel*.ptx | head -1)
cp "$jt" "$OUT/jax_split.ptx"; cp "$(dirname "$jt")/config" "$OUT/jax_split_config.txt" 2>/dev/null
strip() { grep -vE '^\s*(//|\.loc|\.file|\$L__|\.section|\.b8|\.b32|\.debug)' "$1" | sed -E 's/[ \t]+/ /g'; }
strip "$OUT/jax_split.ptx" > /tmp/a.ptx; strip "$OUT/torch_split.ptx" > /tmp/b.ptx
echo "PTX lines (stripped): jax $(wc -l < /tmp/a.ptx), torch $(wc -l < /tmp/b.ptx); differing lines: $(diff /tmp/a.ptx /tmp/b.ptx | grep -c '^[<>]')"
diff /tmp/a.ptx /tmp/b.ptx | head -120 > "$OUT/ptx_diff.txt"; head -40 "$OUT/ptx_diff.txt"
grep -E "^\.visible|\.param" "$OUT/jax_split.ptx" | head -30 > "$OUT/jax_params.txt"
grep -E "^\.visible|\.param" "$OUT/torch_split.ptx" | head -30 > "$OUT/torch_params.txt"
echo "== params jax vs torch"; paste -d'|' "$OUT/jax_params.txt" "$OUT/torch_params.txt" | head -30
TRITON_PTXAS=$(python3 -c "import os, triton; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin/ptxas'))")
"$TRITON_PTXAS" -v -O3 --gpu-name=sm_90a "$OUT/jax_split.ptx" -o /tmp/jax_split.cubin 2>&1 | grep -E "registers|spill" | head -3
for c in /tmp/jax_split.cubin "$OUT/torch_split.cubin"; do
  echo "$c sass: $(cuobjdump -sass "$c" | grep -cE '^\s+/\*[0-9a-f]{4}\*/')"
done
true
