"""Compile the gradient's Pallas kernels for sm_90 on a machine without a GPU.

    python tools/sm90_compile_grad.py [--block-n 32] [--warps 8] [--inverted-warps 2] [--acq-rel-atomics]
        [--order sorted]

Lowers ``jax.grad`` of ``sparse_attention(implementation="pallas")`` for CUDA (as on
an H100/H200: JAX's GPU query is patched to sm_90), captures the Triton IR of every
kernel (the residual forward, the merge, the backward), compiles it with the venv's
Triton for ``GPUTarget("cuda", 90, 32)`` and runs the bundled ``ptxas -v``: registers,
spills, shared memory and the atomic instructions of each kernel: their PTX forms with
the number of PTX instructions, and the SASS forms (``cuobjdump -sass``: RED = an atomic
whose old value is not returned; MEMBAR/FENCE = the fences around
them) -- notes/backward.md. ``--acq-rel-atomics`` compiles the
backward with Pallas's own acquire-release atomics (``backward_pallas.RELAXED_ATOMICS``).
Shapes: D = 256 with TP1 and TP4 head groups, a split-K and a one-split row count.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import types

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block-n", type=int, default=None)
    ap.add_argument("--warps", type=int, default=None,
                    help="backward_pallas.DEFAULT_WARPS (the selection/sorted row walks) and, unless "
                         "--dq-warps is given, INVERTED_DQ_WARPS (the inverted order's dq walk; session 9's "
                         "tables ran it at --warps)")
    ap.add_argument("--dq-warps", type=int, default=None, help="backward_pallas.INVERTED_DQ_WARPS")
    ap.add_argument("--inverted-warps", type=int, default=None, help="backward_pallas.INVERTED_WARPS")
    ap.add_argument("--acq-rel-atomics", action="store_true")
    ap.add_argument("--order", default=None, help="backward_pallas.ORDERS (default: DEFAULT_WALK)")
    a = ap.parse_args()

    import numpy as np
    import triton
    from jax._src.pallas.triton import pallas_call_registration as registration
    from triton.backends.compiler import GPUTarget

    import qsa_jax
    import qsa_jax.config as config
    from sm90_ptx_fp8 import captured_triton_ir  # this script's folder is on sys.path
    from qsa_jax.ops.sparse_attention import backward_pallas, pallas
    from qsa_testing import cases as C

    registration.gpu_info_lib.get_gpu_info = lambda: types.SimpleNamespace(compute_capability=90)
    backward_pallas.interpret = pallas.interpret = lambda: False
    config.running_on_hopper = lambda: True
    if a.block_n:
        backward_pallas.DEFAULT_BLOCK_N = a.block_n
    if a.warps:
        backward_pallas.DEFAULT_WARPS = a.warps
        backward_pallas.INVERTED_DQ_WARPS = a.warps
    if a.dq_warps:
        backward_pallas.INVERTED_DQ_WARPS = a.dq_warps
    if a.inverted_warps:
        backward_pallas.INVERTED_WARPS = a.inverted_warps
    backward_pallas.RELAXED_ATOMICS = not a.acq_rel_atomics
    backward_pallas.DEFAULT_WALK = a.order or backward_pallas.DEFAULT_WALK
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    ptxas, cuobjdump = os.path.join(bin_dir, "ptxas"), os.path.join(bin_dir, "cuobjdump")
    checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    print("| rows | H | Hk | kernel | warps | registers | spill stores B | shared B | PTX atomics (count) | SASS |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with captured_triton_ir() as captured:
        for rows, heads, hk in ((2, 24, 2), (1100, 24, 2), (4, 6, 1), (1100, 6, 1)):
            captured.clear()
            case = C.sparse_attention_case(
                np.random.default_rng(rows), rows=rows, num_query_heads=heads, num_kv_heads=hk,
                head_dim=256, page_size=64, selection_blocks=64, context_tokens=1024, num_requests=2,
                make_cache=False)
            li, bt, tr = (jnp.asarray(x) for x in (case.logical_indices, case.block_table, case.token_to_req))
            q = jax.ShapeDtypeStruct(case.q.shape, jnp.bfloat16)
            kv = jax.ShapeDtypeStruct(case.kv_shape, jnp.bfloat16)

            def loss(q, kv, g):
                out = qsa_jax.sparse_attention(q, kv, li, bt, tr, g, implementation="pallas")
                return jnp.sum(out.astype(jnp.float32))

            def export():
                return jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=["cuda"],
                                         disabled_checks=checks)(q, kv, q).mlir_module()

            module = export()
            warps = dict(re.findall(r'name = "(\w+)", num_stages = \d+ : i32, num_warps = (\d+)', module))
            with tempfile.TemporaryDirectory() as tmp:
                for ttir in captured:
                    name = re.search(r"tt.func public @(\w+)", ttir).group(1)
                    path = os.path.join(tmp, name + ".ttir")
                    with open(path, "w") as f:
                        f.write(ttir)
                    kernel = triton.compile(path, target=GPUTarget("cuda", 90, 32),
                                            options=dict(num_warps=int(warps[name]), num_stages=2))
                    ptx = kernel.asm["ptx"]
                    with open(path + ".ptx", "w") as f:
                        f.write(ptx)
                    info = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", path + ".ptx", "-o", path + ".cubin"],
                                          capture_output=True, text=True).stderr
                    regs = re.search(r"Used (\d+) registers", info).group(1)
                    spills = re.search(r"(\d+) bytes spill stores", info).group(1)
                    ptx_atomics = re.findall(r"(?:atom|red)\.global\.[\w.]+", ptx)
                    forms = ", ".join(f"{f} x{ptx_atomics.count(f)}" for f in sorted(set(ptx_atomics)))
                    sass = subprocess.run([cuobjdump, "-sass", path + ".cubin"], capture_output=True,
                                          text=True).stdout
                    sass_atomics = re.findall(r"\b((?:REDG?|ATOMG?|MEMBAR|FENCE)\.[\w.]+)", sass)
                    sass_forms = ", ".join(f"{f} x{sass_atomics.count(f)}" for f in sorted(set(sass_atomics)))
                    print(f"| {rows} | {heads} | {hk} | {name} | {warps[name]} | {regs} | {spills} | "
                          f"{kernel.metadata.shared} | {forms} | {sass_forms} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
