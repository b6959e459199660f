"""Compile the jax-triton split kernel and vLLM's at the same launch for sm_90, no GPU needed.

    python tools/sm90_split_kernel_ab.py [--geometry TP4] [--rows 512] [--launch 64/4/2] [--launch ...]
        [--kv bf16|fp8] [--vllm .cache/originals/vllm-0.30.0/qsa.py] [--out DIR] [--rule jit|jax-triton]

Why (session 13): on the H200, at TP4 512 rows (512 programs) and vLLM 0.30.0's tiling
(block_n 64, 4 splits, 2 warps, 2 stages), ``sparse_attention_split_kernel`` took 366 µs
against 0.30.0's 266 µs for the same tiles (session 11, call b), while at one split the two
were within 1%. This compiles both kernels with the venv's Triton for
``GPUTarget("cuda", 90, 32)`` at the constexprs each launcher passes (the fused
``[NB, Hk, P, 2D]`` cache, bf16), and prints per kernel: registers and spills (``ptxas -v``),
shared memory, and the tile loop's SASS by instruction class (``tools/sm90_ptx_fp8.py``'s
counters) -- so a difference in the compiled loop shows before any device time is spent.
A ``--launch`` is ``block_n/splits/warps`` (2 stages, as both launch).

``--kv fp8`` (session 31) compiles both for an e4m3 cache with the k/v scales: ours with its
scales read from memory, vLLM's (0.34.0 or later: 0.30.0 has no fp8 path) with its two float
arguments. Where every split takes one tile (e.g. TP1 8 rows at 0.34.0's decode launch 64/33/2)
the kernel has no loop, so the table also gives the whole kernel's length and classes.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import sm90_ptx_fp8 as P  # noqa: E402  (the counters and ptxas helpers)

PAGE, W = 64, 2051
# What the probe on the GPU launched (tools/split_kernel_probe.py: one request whose table
# names every page of a 512-page pool). Triton's JIT makes an int argument equal to 1 a
# constant, which changes register allocation: at 1025 pages and 512 requests our kernel
# compiled with 32 B of spills, at the probe's values with 308 B (the cubin the GPU ran).
BTW = NUM_PAGES = 512
REQUESTS = 1


def _signature(fn, pointers, constexprs, ints, rule, floats=()):
    """ASTSource's signature and the specialisation of the int arguments, by ``rule``:
    "jit" as Triton's JIT launches it (the triton-torch route, vLLM): an int equal to 1
    becomes a constant, one divisible by 16 gets the hint, except the parameters the kernel
    names in ``do_not_specialize``; "jax-triton" as ``jax_triton.triton_call`` compiles it:
    an int equal to 1 becomes a constant whatever the kernel says, no int gets a hint.
    Pointers are 16-byte aligned either way; ``floats`` name fp32 arguments (0.34.0's scales)."""
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in pointers:
            signature[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in constexprs:
            signature[name] = "constexpr"
        elif name in floats:
            signature[name] = "fp32"
        elif ints[name] == 1 and (rule == "jax-triton" or not fn.params[i].do_not_specialize):
            signature[name] = "constexpr"
            constexprs[name] = 1
        else:
            signature[name] = "i32"
            if rule == "jit" and ints[name] % 16 == 0 and not fn.params[i].do_not_specialize:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, attrs


def ours(geo, rows, block_n, splits, warps, rule, *, fp8=False, requests=None, stages=2, induction=None,
         qk_fp16=None, v_staged=None, lazy=None):
    """Our split kernel compiled for sm_90 at one launch (bf16 cache, or e4m3 with the k/v
    scales when ``fp8``; ``requests`` defaults to ``REQUESTS``; ``induction``: the tile loop's
    form, default ``config.triton_tile_induction``'s choice; ``qk_fp16``: fp8's q.K^T in fp16,
    default ``config.triton_fp8_keys_f16_dot(group, splits)``; ``v_staged``: fp8's V converted before its
    layout change, default ``config.triton_fp8_values_f16_staged()``; ``lazy``: fp8's lazy rescaling, default
    ``config.triton_fp8_lazy_rescale()``)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from qsa_jax import config
    from qsa_jax.ops.sparse_attention import triton_kernels as K
    from qsa_jax.ops.sparse_attention.base import F16_QUERY_MAX_SHIFT, F16_QUERY_TOP_EXPONENT

    fn = K.sparse_attention_split_kernel
    d, group, heads, hk = geo.head_dim, geo.num_query_heads // geo.num_kv_heads, geo.num_query_heads, geo.num_kv_heads
    out = "*bf16" if splits == 1 else "*fp32"
    cache = "*fp8e4nv" if fp8 else "*bf16"
    pointers = dict(q_ptr="*bf16", k_ptr=cache, v_ptr=cache, idx_ptr="*i32", bt_ptr="*i32",
                    req_ptr="*i32", gate_ptr="*bf16", scale_ptr="*fp32" if fp8 else "*i32", o_ptr=out,
                    lse_ptr="*fp32")
    constexprs = dict(W=W, PAGE=PAGE, BTW=BTW, GROUP=group, HEADS=heads, D=d, Q_ROW_STRIDE=heads,
                      Q_HEAD_STRIDE=1, Q_OFFSET=0, STRIDE_PAGE=hk * PAGE * 2 * d, STRIDE_TOKEN=2 * d,
                      STRIDE_HEAD=PAGE * 2 * d, V_OFFSET=d, BLOCK_M=triton.next_power_of_2(group),
                      BLOCK_N=block_n, NUM_TILES=-(-W // block_n), NUM_SPLITS=splits, PREFETCH=False,
                      TILE_INDUCTION=config.triton_tile_induction(-(-W // block_n), splits) if induction is None
                      else induction,
                      SCALED=fp8, FP8=fp8, KV_BYTES=False,
                      QK_FP16=fp8 and (config.triton_fp8_keys_f16_dot(group, splits) if qk_fp16 is None else qk_fp16),
                      V_F16_STAGED=fp8 and (config.triton_fp8_values_f16_staged() if v_staged is None
                                            else v_staged),
                      LAZY_RESCALE=(config.LAZY_RESCALE_LOG2 if fp8 and (config.triton_fp8_lazy_rescale()
                                                                          if lazy is None else lazy) else 0.0),
                      F16_TOP_EXPONENT=F16_QUERY_TOP_EXPONENT, F16_MAX_SHIFT=F16_QUERY_MAX_SHIFT)
    # A kernel without TILE_INDUCTION (before session 13's loop forms) takes the others.
    constexprs = {k: v for k, v in constexprs.items() if k in fn.arg_names}
    requests = REQUESTS if requests is None else requests
    # num_requests: what the split kernel took before session 13's last_request (git history).
    ints = dict(num_rows=rows, last_request=requests - 1, num_requests=requests, num_pages=NUM_PAGES)
    signature, attrs = _signature(fn, pointers, constexprs, ints, rule)
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))


def gluon(geo, rows, block_n, splits, *, qk_fp16=None, v_shared=False, requests=None, kc=64, page=PAGE,
          lazy=False):
    """The Gluon fp8 split kernel (``gluon_kernels``, session 20) compiled for sm_90 at one launch
    (one warp; e4m3 cache with the k/v scales), specialised as jax-triton's route specialises it
    (``_gluon_support.compile_for_jax_triton``); ``qk_fp16`` defaults to
    ``config.triton_fp8_keys_f16_dot(group, splits)``, ``v_shared`` is its V_SHARED, ``lazy`` its
    LAZY_RESCALE; ``page``: the page size (default this tool's probe value, as ``ours``). The notes' Gluon numbers (notes/triton.md
    "Session 20") come from this with ``compiled_numbers`` at 2048 rows."""
    from qsa_jax import config
    from qsa_jax.ops import _gluon_support
    from qsa_jax.ops.sparse_attention import gluon_kernels
    from qsa_jax.ops.sparse_attention.base import F16_QUERY_MAX_SHIFT, F16_QUERY_TOP_EXPONENT

    fn = gluon_kernels.sparse_attention_split_kernel_fp8_gluon
    d, group, heads, hk = geo.head_dim, geo.num_query_heads // geo.num_kv_heads, geo.num_query_heads, geo.num_kv_heads
    out = "*bf16" if splits == 1 else "*fp32"
    dtypes = ["*bf16", "*fp8e4nv", "*fp8e4nv", "*i32", "*i32", "*i32", "*bf16", "*fp32", "i32", "i32", "i32",
              out, "*fp32"]
    requests = REQUESTS if requests is None else requests
    scalars = [(8, "i32", rows), (9, "i32", requests - 1), (10, "i32", NUM_PAGES)]
    meta = dict(W=W, PAGE=page, BTW=BTW, GROUP=group, HEADS=heads, D=d, Q_ROW_STRIDE=heads, Q_HEAD_STRIDE=1,
                Q_OFFSET=0, STRIDE_PAGE=hk * page * 2 * d, STRIDE_TOKEN=2 * d, STRIDE_HEAD=page * 2 * d, V_OFFSET=d,
                BLOCK_N=block_n, NUM_TILES=-(-W // block_n), NUM_SPLITS=splits,
                QK_FP16=config.triton_fp8_keys_f16_dot(group, splits) if qk_fp16 is None else qk_fp16,
                F16_TOP_EXPONENT=F16_QUERY_TOP_EXPONENT, F16_MAX_SHIFT=F16_QUERY_MAX_SHIFT, KC=min(kc, d),
                V_SHARED=v_shared, LAZY_RESCALE=config.LAZY_RESCALE_LOG2 if lazy else 0.0)
    compiled, _ = _gluon_support.compile_for_jax_triton(fn, dtypes, scalars, num_warps=1, num_ctas=1,
                                                        compute_capability=90, enable_fp_fusion=True, metaparams=meta)
    return compiled


def theirs(path, out_dir, geo, rows, block_n, splits, warps, rule, *, fp8=False):
    """vLLM's split kernel from the file at ``path`` compiled for sm_90 at one launch, as its
    launcher passes the arguments (0.34.0's scales as fp32 arguments; ``fp8``: e4m3 cache
    pointers, as its sm_89+ launcher passes them)."""
    import triton
    from triton.backends.compiler import GPUTarget

    module_path = os.path.join(out_dir, "vllm_split_kernel.py")
    with open(module_path, "w") as f:
        f.write(P.vllm_kernel_source(path))
    spec = importlib.util.spec_from_file_location("vllm_split_kernel", module_path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = mod._qsa_sparse_paged_gqa_splitk_kernel
    floats = tuple(n for n in ("softmax_scale", "output_scale") if n in fn.arg_names)
    if fp8 and not floats:
        raise SystemExit(f"{path}: this vLLM's split kernel takes no scales, so it has no fp8 path (0.34.0 has)")
    d, group, heads, hk = geo.head_dim, geo.num_query_heads // geo.num_kv_heads, geo.num_query_heads, geo.num_kv_heads
    cache = "*fp8e4nv" if fp8 else "*bf16"
    pointers = dict(q_ptr="*bf16", k_cache_ptr=cache, v_cache_ptr=cache, indices_ptr="*i32",
                    block_table_ptr="*i32", token_to_req_ptr="*i32", partial_output_ptr="*fp32",
                    partial_lse_ptr="*fp32", output_ptr="*bf16", output_gate_ptr="*bf16")
    ints = dict(stride_q_row=heads * d, stride_q_head=d, stride_k_block=hk * PAGE * 2 * d,
                stride_k_token=2 * d, stride_k_head=PAGE * 2 * d, stride_v_block=hk * PAGE * 2 * d,
                stride_v_token=2 * d, stride_v_head=PAGE * 2 * d, stride_indices_row=W + 1,
                stride_table_req=BTW, stride_output_row=heads * d, stride_output_head=d,
                stride_output_gate_row=heads * d, stride_output_gate_head=d, num_rows=rows,
                num_cache_blocks=NUM_PAGES, num_requests=REQUESTS, k_scale=1, v_scale=1)
    constexprs = dict(TOPK=W, PAGE_SIZE=PAGE, PAGE_TABLE_WIDTH=BTW, GROUP_SIZE=group, HEAD_DIM=d,
                      NUM_QUERY_HEADS=heads, NUM_SPLITS=splits, NUM_TILES=-(-W // block_n),
                      BLOCK_M=triton.next_power_of_2(group), BLOCK_N=block_n)
    constexprs = {k: v for k, v in constexprs.items() if k in fn.arg_names}
    signature, attrs = _signature(fn, pointers, constexprs, ints, rule, floats)
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=2))


def ptxas_path() -> str:
    import glob

    import triton

    return glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))[0]


def compiled_numbers(kernel, path: str) -> dict:
    """``ptxas -v`` registers and spills, and the tile loop's counts, of a compiled kernel
    (its PTX written to ``path``)."""
    with open(path, "w") as f:
        f.write(kernel.asm["ptx"])
    return P.ptxas_info(ptxas_path(), path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--geometry", default="TP4")
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--launch", action="append", default=None, help="block_n/splits/warps (repeatable)")
    ap.add_argument("--kv", default="bf16", choices=("bf16", "fp8"),
                    help="cache dtype; fp8 (e4m3 with k/v scales) needs vLLM 0.34.0's file as --vllm")
    ap.add_argument("--vllm", default=None,
                    help="vLLM's qsa.py (default: .cache/originals/vllm-0.30.0/qsa.py, for fp8 vllm-0.34.0)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rule", default="jit", choices=("jit", "jax-triton"),
                    help="how the int arguments are specialised (see _signature); vLLM's kernel always 'jit'")
    a = ap.parse_args()
    fp8 = a.kv == "fp8"
    vllm = a.vllm or f".cache/originals/vllm-{'0.34.0' if fp8 else '0.30.0'}/qsa.py"

    from qsa_jax import arg_specs

    geo = arg_specs.GEOMETRIES[a.geometry]
    out_dir = a.out or tempfile.mkdtemp(prefix="sm90_split_ab_")
    os.makedirs(out_dir, exist_ok=True)
    classes = list(P.OPCODE_CLASSES) + ["other"]
    kv = "e4m3 with k/v scales" if fp8 else "bf16"
    print(f"{a.geometry}, {a.rows} rows, {kv} fused cache, ours specialised as {a.rule}, vLLM from {vllm}; "
          f"files in {out_dir}\n")
    print("Classes: the tile loop's, or the whole kernel's (*) where every split takes one tile (no loop).\n")
    print("| kernel | launch | regs | spill st/ld B | shared B | SASS | loop | " + " | ".join(classes) + " |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(classes))
    for launch in a.launch or ["64/4/2", "64/1/2"]:
        bn, splits, warps = (int(x) for x in launch.split("/"))
        for name, compile_one in (("ours", lambda: ours(geo, a.rows, bn, splits, warps, a.rule, fp8=fp8)),
                                  ("vllm", lambda: theirs(vllm, out_dir, geo, a.rows, bn, splits, warps, "jit",
                                                          fp8=fp8))):
            kernel = compile_one()
            info = compiled_numbers(kernel, os.path.join(out_dir, f"{name}.{a.kv}.bn{bn}-s{splits}-w{warps}.ptx"))
            counts = info["classes"] if info["loop_length"] else info["whole_classes"]
            print(f"| {name} | {launch} | {info['registers']} | {info['spill_stores']}/{info['spill_loads']} | "
                  f"{kernel.metadata.shared} | {info['sass_length']} | {info['loop_length'] or 'none*'} | "
                  + " | ".join(str(counts[c]) for c in classes) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
