#!/usr/bin/env bash
# Prepared in session 27 as gpu_next_h.sh; run in session 28 as call b (any H100/H200; carry .whl
# .cache/originals; <= 520 s: part 1 <= 280 s, part 2 <= 2 x 110 s). Call a ran the first version:
# part 1 failed at once (an empty TRITON_CACHE_DIR is an error in Triton 3.6, not "no cache"; now a
# fresh directory per variant), and part 2 had no unwrapped control in the same run (now it has).
# Session 27 found the JAX route's split kernel 1-4% slower than the same PTX launched by torch
# at TP1 fp8 decode (H100), and on the CPU (`tools/ptxas_ab.py`, `session27/ptxas_ab_cpu.md`) that
# Triton's bundled ptxas (12.8) and CUDA 13.0's schedule 572 of 3584 SASS lines of TP1's 16-64-row
# launches differently (same instructions), 0 lines at TP1 4-8 and 1024 rows, 2-28 at TP4 8-64.
# jaxlib assembles jax-triton's PTX with XLA's assembler (13.0 here); Triton's launcher with 12.8.
# The causal test, in ONE process on the same fresh sets, rounds in turn: the shim's triton-torch
# route assembled by Triton's ptxas and by /usr/local/cuda-13.0's (TRITON_PTXAS_PATH, the kernel
# caches cleared between), JAX's route (auto), and 0.34.0. Prediction: at TP1 16 / 32 / 64 rows
# torch-on-13.0 within 1% of JAX's and both 2-4% above torch-on-12.8; at TP1 8 and 1024 rows (no
# SASS difference) all three within 1%. The cubins' hashes are printed per variant, to show the
# two torch variants really differ where ptxas_ab says they should.
source tools/gpu_env.sh
set -o pipefail
SYS_PTXAS=${SYS_PTXAS:-/usr/local/cuda-13.0/bin/ptxas}
SYS_PTXAS="$SYS_PTXAS" timeout 280 python3 - > "$OUT/ptxas_causal.log" 2>&1 <<'PY'
import hashlib, os, tempfile
import jax, torch
import qsa_jax
import qsa_torch_shim as S
from qsa_torch_shim import _direct
from qsa_jax.ops.sparse_attention import triton_kernels as K
from bench import hopper_sweep as hs, inputs, kernel_trace
from bench.timing import sequential_calls
from qsa_testing import originals

mods = {"0.34.0": originals.load("0.34.0")}
sync = lambda _: torch.cuda.synchronize()
sys_ptxas = os.environ["SYS_PTXAS"]


def use_ptxas(path):
    """Triton's launcher assembles with ``path`` (None: its bundled ptxas) from the next compile.

    Each variant gets a fresh disk cache: Triton's cache key holds the ptxas version it read
    first (an lru_cache), so a shared cache would hand the second variant the first one's cubin.
    """
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_cache_")
    if path is None:
        os.environ.pop("TRITON_PTXAS_PATH", None)
    else:
        os.environ["TRITON_PTXAS_PATH"] = path
    _direct._SIGNATURES.clear()
    for fn in (K.sparse_attention_split_kernel, K.sparse_attention_merge_kernel):
        fn.device_caches.clear()


def cubin_hash():
    for entry in _direct._SIGNATURES.values():
        if entry and entry[3] is not None:
            for ck, _ in (entry[3][0].compiled or {}).values():
                return hashlib.md5(ck.asm["cubin"]).hexdigest()[:10]


for geo_name, rows in (("TP1", 8), ("TP1", 16), ("TP1", 32), ("TP1", 64), ("TP1", 1024), ("TP4", 32)):
    geo = inputs.geometry(geo_name, cpu=False, pool_gb=2.0)
    pools = {geo_name: (geo,) + inputs.make_pool(geo, gpu=True, seed=11, fp8=True)}
    c = hs.Case(geo_name, rows, 10, pools, mods, seed=rows + 3, scales=hs.FP8_SCALES)
    q, kv, idx, bt, t2r, gate = c.args
    chained = jax.jit(lambda q, kv, idx_sets, bt, t2r, gate: sequential_calls(
        lambda i: qsa_jax.sparse_attention(q, kv, i, bt, t2r, gate, k_scale=hs.FP8_SCALES[0],
                                           v_scale=hs.FP8_SCALES[1]), idx_sets))
    jax.block_until_ready(chained(q, kv, idx, bt, t2r, gate))
    orig_run, _ = c.original_calls("0.34.0", False)
    orig_run(); torch.cuda.synchronize()  # 0.34.0 compiled now, by Triton's own ptxas
    out_t = torch.empty_like(c.tq)

    def torch_tt():
        for i in c.tidx:
            S.qsa_sparse_paged_attention(c.tq, c.k, c.v, i, c.tbt, c.tt2r, False, out_t, *hs.FP8_SCALES,
                                         output_gate=c.tgate, implementation="triton-torch")
        return out_t
    for rnd in range(2):
        for name, path in (("torch, Triton's ptxas", None), ("torch, CUDA 13.0 ptxas", sys_ptxas),
                           ("jax (auto)", None), ("0.34.0", None)):
            if name.startswith("torch"):
                use_ptxas(path)
                torch_tt(); torch.cuda.synchronize()
                fn, wait, tag = torch_tt, sync, f" cubin {cubin_hash()}"
            elif name == "0.34.0":
                os.environ.pop("TRITON_PTXAS_PATH", None)
                fn, wait, tag = orig_run, sync, ""
            else:
                os.environ.pop("TRITON_PTXAS_PATH", None)
                fn, wait, tag = (lambda: chained(q, kv, idx, bt, t2r, gate)), jax.block_until_ready, ""
            s = kernel_trace.trace_runs(fn, runs=3, calls_per_run=10, wait=wait)
            split = next(v for k, v in s.mean_us_by_kernel.items() if "split" in k or "gqa" in k)
            print(f"RESULT {geo_name} rows={rows:5d} round={rnd} {name:24s} busy {s.busy_us_per_call:8.2f} "
                  f"split {split:8.2f} us{tag}", flush=True)
    use_ptxas(None)
    del c, pools
PY
echo "causal rc=$?"; grep -E "^RESULT|Error" "$OUT/ptxas_causal.log" | head -60

# Part 2: can JAX's route be put on Triton's ptxas from outside, as a user could? A wrapper ptxas
# first in XLA's search (--xla_gpu_cuda_data_dir and PATH) sends every assembly whose input holds
# our kernels to Triton's ptxas and the rest to CUDA 13.0's (session 27's call b matched on a
# ".ptx" suffix and caught none of ours; here any existing file argument is read). Prediction:
# if jaxlib's assembly goes through the ptxas binary, our kernels reach the wrapper and JAX's
# split kernel runs level with torch's (ratio 1.00 +- 0.01 at TP1 16 / 64 rows); if it goes
# through the linked compiler library, the log shows none of ours and the ratio stays 1.02-1.04.
# Call a (no control) saw 4 of our assemblies reach the wrapper and ratios 1.004 / 0.994; the
# control now runs first in the same call. Prediction for it: plain 1.01-1.04 at 16-64 rows and
# within 1% at 8 and 1024 rows (no SASS difference there); wrapped within 1% at every row count.
TRITON_PTXAS=$(python3 -c "import os, triton; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin/ptxas'))")
FAKE=/tmp/fakecuda; mkdir -p "$FAKE/bin"; ln -sfn "$(dirname "$(dirname "$SYS_PTXAS")")/nvvm" "$FAKE/nvvm"
cat > "$FAKE/bin/ptxas" <<SH
#!/bin/bash
for a in "\$@"; do
  if [[ -f "\$a" ]] && grep -q "sparse_attention_" "\$a" 2>/dev/null; then
    echo "triton" >> "$OUT/wrapper.log"; exec "$TRITON_PTXAS" "\$@"
  fi
done
echo "system \${*:0:3}" | cut -c1-120 >> "$OUT/wrapper.log"; exec "$SYS_PTXAS" "\$@"
SH
chmod +x "$FAKE/bin/ptxas"
for variant in plain wrapped; do
  if [[ $variant == wrapped ]]; then env_run=(env PATH="$FAKE/bin:$PATH" XLA_FLAGS="--xla_gpu_cuda_data_dir=$FAKE"); else env_run=(env); fi
  "${env_run[@]}" timeout 110 python3 -m bench.run --op sparse --impl auto,shim-tt --shim-graph --kv-dtype fp8 \
    --rows 8,16,32,64,1024 --tp TP1 --trace-rows 1024 --n-calls 10 --eager-calls 3 --no-progress --no-plot \
    --out "$OUT/$variant" > "$OUT/$variant.log" 2>&1
  echo "$variant rc=$?"
done
echo "wrapper: $(grep -c '^triton' "$OUT/wrapper.log" 2>/dev/null) to Triton's ptxas, $(grep -c '^system' "$OUT/wrapper.log" 2>/dev/null) to 13.0's"
python3 - "$OUT" <<'PY2'
import json, sys
for variant in ("plain", "wrapped"):
    try:
        res = json.load(open(f"{sys.argv[1]}/{variant}/results.json"))["results"]
    except OSError as e:
        print(variant, "no results:", e); continue
    split = {(r["rows"], r["impl"]): next((v for k, v in (r.get("busy_kernels_us") or {}).items() if "split" in k), None)
             for r in res}
    for rows in sorted({k[0] for k in split}):
        a, t = split.get((rows, "auto")), split.get((rows, "shim-tt"))
        a, t = a or float("nan"), t or float("nan")
        print(f"TABLE {variant:7s} TP1 fp8 rows={rows:5d}: JAX split {a:8.2f} us, torch split {t:8.2f} us, "
              f"JAX/torch {a / t:.3f}")
PY2
true
