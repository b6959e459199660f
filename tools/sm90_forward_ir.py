"""Dump the Triton IR and launch attributes of the forward Pallas kernels, lowered for sm_90.

    python tools/sm90_forward_ir.py OUT_DIR [--device h200|none]

Runs on a machine without a GPU: JAX's GPU query is patched to sm_90 and, with
``--device h200`` (default), ``config.device_capability`` to (9, 0), so the
default launch is the one an H200 gets (measured table, Hopper warps/stages);
``--device none`` keeps the off-GPU choice. For each case the Triton IR text of
every kernel and each kernel's ``num_warps``/``num_stages`` are written to
``OUT_DIR/<case>.txt``. Two dumps of the same cases compare with ``diff -r``: a
refactor of the launch code that changes no launch leaves them byte-identical.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

# (name, rows, query heads, KV heads, kv layout, cache format, config=, launch= or None)
CASES = (
    ("tp1_r1_splitk", 1, 24, 2, "fused", "bf16", None, None),
    ("tp1_r2_splitk", 2, 24, 2, "fused", "bf16", None, None),
    ("tp1_r64_stages3", 64, 24, 2, "fused", "bf16", None, None),
    ("tp1_r600_onesplit_stages3", 600, 24, 2, "fused", "bf16", None, None),
    ("tp1_r1100_large", 1100, 24, 2, "fused", "bf16", None, None),
    ("tp4_r4_splitk", 4, 6, 1, "fused", "bf16", None, None),
    ("tp4_r100_stages3", 100, 6, 1, "fused", "bf16", None, None),
    ("tp1_r4_split_cache", 4, 24, 2, "split", "bf16", None, None),
    ("tp4_r300_split_cache", 300, 6, 1, "split", "bf16", None, None),
    ("tp1_r4_vllm034", 4, 24, 2, "fused", "bf16", "vllm-0.34", None),
    ("tp1_r600_vllm030_one_warp", 600, 24, 2, "fused", "bf16", "vllm-0.30", None),
    ("tp1_r2_explicit", 2, 24, 2, "fused", "bf16", (32, 1, 65, 8), None),
    ("tp4_r8_explicit_onesplit", 8, 6, 1, "fused", "bf16", (64, 4, 33, 1), None),
    ("tp1_r2_fp8_bytes", 2, 24, 2, "fused", "e4m3_bytes", None, None),
    ("tp4_r64_fp8_split", 64, 6, 1, "split", "e4m3", None, None),
)


def lower_case(name, rows, heads, hk, layout, fmt, config, launch=None, *, grad=False) -> str:
    """The dump text of one case (the patches of ``patch_for_sm90`` must be in place)."""
    import qsa_jax
    from qsa_testing import cases as C

    captured.clear()
    case = C.sparse_attention_case(
        np.random.default_rng(rows), rows=rows, num_query_heads=heads, num_kv_heads=hk, head_dim=256,
        page_size=64, selection_blocks=512, context_tokens=4096, num_requests=2, make_cache=False)
    li, bt, tr = (jnp.asarray(x) for x in (case.logical_indices, case.block_table, case.token_to_req))
    dtype = {"bf16": jnp.bfloat16, "e4m3": jnp.float8_e4m3fn, "e4m3_bytes": jnp.uint8}[fmt]
    nb, hk_, p, d2 = case.kv_shape
    q = jax.ShapeDtypeStruct(case.q.shape, jnp.bfloat16)
    if layout == "fused":
        kv = jax.ShapeDtypeStruct(case.kv_shape, dtype)
    else:
        kv = (jax.ShapeDtypeStruct((nb, p, hk_, d2 // 2), dtype),) * 2
    scales = dict(k_scale=0.5, v_scale=2.0) if fmt != "bf16" else {}
    extra = {} if launch is None else dict(launch=launch)

    def attention(q, kv, g):
        return qsa_jax.sparse_attention(q, kv, li, bt, tr, g, implementation="pallas", config=config,
                                        **scales, **extra)

    fn = attention
    if grad:
        fn = jax.grad(lambda q, kv, g: jnp.sum(attention(q, kv, g).astype(jnp.float32)), argnums=(0, 2))
    checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    module = jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(q, kv, q).mlir_module()
    attrs = re.findall(r'name = "(\w+)", num_stages = (\d+) : i32, num_warps = (\d+)', module)
    lines = [f"{n}: num_stages={s} num_warps={w}" for n, s, w in attrs]
    return "\n".join(lines) + "\n\n" + "\n\n".join(captured) + "\n"


captured: list[str] = []


def patch_for_sm90(device: str = "h200", set_attr=setattr) -> None:
    """Lower Pallas for CUDA sm_90 here; ``device="h200"`` also makes the launch choice an H200's.

    ``set_attr``: how to patch (a test passes ``monkeypatch.setattr`` to undo it afterwards).
    """
    from jax._src.pallas.triton import pallas_call_registration as registration

    import qsa_jax.config as config
    from qsa_jax.ops.sparse_attention import backward_pallas, pallas

    set_attr(registration.gpu_info_lib, "get_gpu_info", lambda: types.SimpleNamespace(compute_capability=90))
    set_attr(pallas, "interpret", lambda: False)
    set_attr(backward_pallas, "interpret", lambda: False)
    if device == "h200":
        set_attr(config, "device_capability", lambda: (9, 0))
        set_attr(config, "device_sm_count", lambda: 132)  # the measured table's card
    lower = registration.lowering.lower_jaxpr_to_triton_module

    def capture(*args, **kwargs):
        result = lower(*args, **kwargs)
        captured.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    set_attr(registration.lowering, "lower_jaxpr_to_triton_module", capture)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--device", choices=("h200", "none"), default="h200")
    ap.add_argument("--grad", action="store_true", help="also lower jax.grad of the first two cases")
    a = ap.parse_args()
    patch_for_sm90(a.device)
    os.makedirs(a.out, exist_ok=True)
    todo = [(c, False) for c in CASES] + ([(c, True) for c in CASES[:2]] if a.grad else [])
    for c, grad in todo:
        text = lower_case(*c, grad=grad)
        with open(os.path.join(a.out, c[0] + ("_grad" if grad else "") + ".txt"), "w") as f:
            f.write(text)
        print(c[0], "grad" * grad, text.split("\n\n")[0].replace("\n", "; "), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
