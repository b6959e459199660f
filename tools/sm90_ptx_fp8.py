"""Dump and compare the sm_90 PTX of the Pallas forward kernel for bf16 / e4m3 / uint8 caches.

    python tools/sm90_ptx_fp8.py [--out DIR] [--vllm .cache/originals/vllm-0.34.0/qsa.py]
                                 [--knob NAME] [--only bf16,e4m3,uint8]

No GPU needed (notes/pallas.md, "fp8 loads on sm_90"): JAX's GPU query is patched to
sm_90 as in tools/sm90_compile_grad.py, the forward ``sparse_attention(implementation=
"pallas")`` is exported for CUDA, the Triton IR of each kernel is captured and compiled
with the venv's Triton for ``GPUTarget("cuda", 90, 32)``, and the bundled ``ptxas -v``
reports registers and spills. Per kernel it counts, in the PTX, the global loads by
width, the async copies (``cp.async`` by cache mode and byte count), the e4m3 conversions,
the shared-memory traffic and the MMA instructions; in the SASS (``cuobjdump``), the
length and the spills, conversions and byte permutes of the tile loop.

Configs: the TP1 geometry (24 query / 2 KV heads, D = 256, W = 2051, fused cache) at
the launches of the fp8 rows of the 2026-12-03 H200 grid -- block_n 64, 1 split, 2 warps,
2 stages (4096 programs) and block_n 32, 4 splits, 2 warps (256-2048 programs) -- and
block_n 32, 4 splits, 1 warp (vLLM 0.34.0's own launch there).

``--vllm PATH`` also compiles the split-K kernel of vLLM 0.34.0's file at PATH (read
only: its two jitted functions are extracted into a temporary module, never into this
repository) with the same Triton, as its sm_89+ launcher would (float8e4nv cache
pointers; and a bf16 cache), at the same warps unless --vllm-warps, for comparison. ``--knob NAME``
sets ``qsa_jax.config.NAME`` to return True (an opt-in kernel variant) before lowering.
"""

from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import glob
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import types

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

# (label, block_n, num_splits, num_warps); TP1: 24 query heads over 2 KV heads. The fp8
# grid ran 0.34.0's sm_90 fp8 table: (64, 1 split, 2 warps) at 4096 programs and (32, 4
# splits, 1 warp) at 256-2048, where config.pallas_hopper_launch gives Pallas 2 warps.
CONFIGS = (("bn64-s1-w2", 64, 1, 2), ("bn32-s4-w2", 32, 4, 2), ("bn32-s4-w1", 32, 4, 1),
           ("bn32-s2-w1", 32, 2, 1))  # the last: config.H200_FP8's launch at 1024-4096 programs
# until session 21 (since then the 2-split bands of config.H200_FP8)
HEADS, KV_HEADS, HEAD_DIM, SELECTION_BLOCKS = 24, 2, 256, 512  # W = 4 * 512 + 3 = 2051
WIDTH = 4 * SELECTION_BLOCKS + 3


def ptx_summary(ptx: str) -> dict[str, str]:
    """Instruction counts (static, in the PTX text) that tell how the tiles travel."""
    def count(pattern):
        c = collections.Counter(re.findall(pattern, ptx))
        return ", ".join(f"{k if isinstance(k, str) else ' '.join(k)} x{v}" for k, v in sorted(c.items())) or "-"

    return {
        # ld.global[.cg/.nc/...][.v2/.v4].type; predicated or not
        "ld.global": count(r"ld\.global(?:\.\w+)*?(?:\.v[248])?\.[busf]\d+"),
        "cp.async": count(r"(cp\.async\.c[ag])\.shared\.global(?:\.L2::\w+)? \[[^\]]+\], \[[^\]]+\], (0x\w+|\d+)"),
        "e4m3 cvt": count(r"cvt\.rn\.\w+x2\.e4m3x2"),
        "other cvt": count(r"cvt\.rn\.(?:bf16x2|f16x2)\.f32"),
        "prmt": count(r"\bprmt\.b32\b"),
        "ld.shared": count(r"ld\.shared(?:\.v[248])?\.[bu]\d+"),
        "st.shared": count(r"st\.shared(?:\.v[248])?\.[bu]\d+"),
        "ldmatrix": count(r"ldmatrix\.sync\.aligned\.\w+(?:\.trans)?\.shared\.b16"),
        "mma": count(r"(?:mma\.sync\.aligned\.\w+\.row\.col\.f32\.\w+\.\w+|wgmma\.mma_async[\w.]*)"),
    }


# SASS opcodes worth counting in the tile loop: spills, the async copies and shared-memory
# reads of the tiles, the MMAs, and the conversion / repacking instructions.
LOOP_OPCODES = ("STL", "LDL", "LDGSTS", "LDS", "LDSM", "HMMA", "F2FP", "F2F", "HADD2", "PRMT", "IMAD", "LEA")


# The tile loop's SASS by what the instructions are for (opcode without modifiers).
OPCODE_CLASSES = {
    "int/address": ("IMAD", "IADD3", "LEA", "SHF", "LOP3", "SEL", "ISETP", "PLOP3", "VIMNMX", "IABS", "SGXT",
                    "VIADD", "P2R", "R2P", "S2R", "S2UR", "UIADD3", "UMOV", "ULEA", "USHF", "UISETP", "ULOP3",
                    "LDC", "ULDC", "MOV", "IMNMX", "I2F", "F2I", "POPC", "FLO", "BMSK", "UIMAD"),
    "fp8/fp16 convert": ("F2FP", "F2F", "HADD2", "PRMT", "HMUL2", "HFMA2"),
    "shared ld/st": ("LDS", "LDSM", "STS", "STSM"),
    "global": ("LDGSTS", "LDG", "STG", "LDGDEPBAR", "DEPBAR"),
    "mma": ("HMMA",),
    "fp32 softmax": ("FMUL", "FFMA", "FADD", "FSEL", "FMNMX", "MUFU", "FSETP", "SHFL"),
    "spill": ("STL", "LDL"),
}


def opcode_classes(ops: collections.Counter) -> dict[str, int]:
    """Counts of ``ops`` per OPCODE_CLASSES entry, the rest as "other" (branches, barriers, NOPs)."""
    out = {name: sum(ops.get(op, 0) for op in members) for name, members in OPCODE_CLASSES.items()}
    out["other"] = sum(ops.values()) - sum(out.values())
    return out


def sass_loop(sass: str) -> tuple[int, collections.Counter]:
    """Length and opcode counts of the tile loop: the backward branch spanning the most code.
    (0, empty) where there is none: a launch whose splits take one tile each has no loop."""
    code = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4,6})\*/\s+(.*?)\s*;", sass)]
    spans = [(int(m.group(1), 16), a) for a, t in code
             if (m := re.search(r"\bBRA (?:\S+ )?0x([0-9a-f]+)", t)) and int(m.group(1), 16) < a]
    if not spans:
        return 0, collections.Counter()
    lo, hi = max(spans, key=lambda s: s[1] - s[0])
    body = [re.sub(r"^@!?U?P\w+\s+", "", t) for a, t in code if lo <= a <= hi]
    return len(body), collections.Counter(t.split()[0].split(".")[0] for t in body)


def ptxas_numbers(ptxas: str, ptx_path: str) -> tuple[dict[str, str], str]:
    """Registers and spills (``ptxas -v`` for sm_90a) and the SASS of one PTX file (the
    cubin and its ``.sass`` are written beside it)."""
    cubin = ptx_path + ".cubin"
    info = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", ptx_path, "-o", cubin],
                          capture_output=True, text=True, check=True).stderr
    sass = subprocess.run([os.path.join(os.path.dirname(ptxas), "cuobjdump"), "-sass", cubin],
                          capture_output=True, text=True, check=True).stdout
    with open(cubin + ".sass", "w") as f:
        f.write(sass)
    return dict(registers=re.search(r"Used (\d+) registers", info).group(1),
                spill_stores=re.search(r"(\d+) bytes spill stores", info).group(1),
                spill_loads=re.search(r"(\d+) bytes spill loads", info).group(1)), sass


def sass_ops(sass: str) -> collections.Counter:
    """Opcode counts of a whole SASS listing (predicates and modifiers dropped)."""
    return collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
                               for t in re.findall(r"/\*[0-9a-f]{4,6}\*/\s+(.*?)\s*;", sass))


def ptxas_info(ptxas: str, ptx_path: str) -> dict[str, str]:
    numbers, sass = ptxas_numbers(ptxas, ptx_path)
    n, ops = sass_loop(sass)
    whole = sass_ops(sass)
    return dict(numbers, loop_length=n, classes=opcode_classes(ops), sass_length=sum(whole.values()),
                whole_classes=opcode_classes(whole),
                loop=f"{n} instructions: " + " ".join(f"{k} {ops.get(k, 0)}" for k in LOOP_OPCODES))


def ttir_passes(path: str, warps: int, stages: int) -> str:
    """The TTIR in ``path`` after Triton's own TTIR passes (``make_ttir``: inliner,
    canonicalize, combine, CSE, loop unroll), as text.

    ``triton.compile`` skips the passes of the stage an IR file is given at, but XLA
    runs the same list on a Pallas kernel's Triton IR before TTGIR (its
    compilation pipeline mirrors ``make_ttir``). Without them the lowering here
    differs from the GPU's: e.g. ``acc * alpha + dot(p, v)`` stays two ops instead of
    the combine pass's ``dot(p, v, acc * alpha)``, one accumulator tile more live."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    backend = make_backend(GPUTarget("cuda", 90, 32))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = ir.parse_mlir_module(path, context)
    module.context = context
    backend.make_ttir(module, {}, backend.parse_options(dict(num_warps=warps, num_stages=stages)), 90)
    return module.str_nodebug()


def compile_ttir(ttir: str, name: str, warps: int, stages: int, out_dir: str, label: str):
    import triton
    from triton.backends.compiler import GPUTarget

    raw = os.path.join(out_dir, f"{label}.{name}.lowered.ttir")
    with open(raw, "w") as f:
        f.write(ttir)
    path = os.path.join(out_dir, f"{label}.{name}.ttir")
    with open(path, "w") as f:
        f.write(ttir_passes(raw, warps, stages))
    kernel = triton.compile(path, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=warps, num_stages=stages))
    return kernel, path


@contextlib.contextmanager
def captured_triton_ir():
    """A list that fills with the Triton IR text of every Pallas kernel lowered inside."""
    from jax._src.pallas.triton import pallas_call_registration as registration

    captured = []
    lower = registration.lowering.lower_jaxpr_to_triton_module

    def capture(*args, **kwargs):
        result = lower(*args, **kwargs)
        captured.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    registration.lowering.lower_jaxpr_to_triton_module = capture
    try:
        yield captured
    finally:
        registration.lowering.lower_jaxpr_to_triton_module = lower


def pallas_kernels(dtype_name: str, block_n: int, splits: int, warps: int):
    """(name, ttir, warps, stages) of each Triton kernel of one forward call."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import qsa_jax
    from qsa_testing import cases as C

    with captured_triton_ir() as captured:
        rows = 2048 if splits == 1 else 128  # 4096 / 256 programs at 2 KV heads
        case = C.sparse_attention_case(
            np.random.default_rng(0), rows=rows, num_query_heads=HEADS, num_kv_heads=KV_HEADS,
            head_dim=HEAD_DIM, page_size=64, selection_blocks=SELECTION_BLOCKS, context_tokens=8192,
            num_requests=4, make_cache=False)
        li, bt, tr = (jnp.asarray(x) for x in (case.logical_indices, case.block_table, case.token_to_req))
        dtype = dict(bf16=jnp.bfloat16, e4m3=jnp.float8_e4m3fn, uint8=jnp.uint8)[dtype_name]
        q = jax.ShapeDtypeStruct(case.q.shape, jnp.bfloat16)
        kv = jax.ShapeDtypeStruct(case.kv_shape, dtype)
        num_tiles = -(-WIDTH // block_n)
        scales = {} if dtype_name == "bf16" else dict(k_scale=0.5, v_scale=2.0)

        def forward(q, kv, g):
            return qsa_jax.sparse_attention(q, kv, li, bt, tr, g, implementation="pallas",
                                            config=(block_n, warps, num_tiles, splits), **scales)

        checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
        module = jax.export.export(jax.jit(forward), platforms=["cuda"], disabled_checks=checks)(
            q, kv, q).mlir_module()
    launch = {n: (int(w), int(s)) for n, s, w in
              re.findall(r'name = "(\w+)", num_stages = (\d+) : i32, num_warps = (\d+)', module)}
    for ttir in captured:
        name = re.search(r"tt.func public @(\w+)", ttir).group(1)
        yield (name, ttir) + launch[name]


def vllm_kernel_source(path: str) -> str:
    """The source of the split-K kernel and its dequant helper (0.34.0; 0.30.0 has none), cut
    out of vLLM's file."""
    with open(path) as f:
        text = f.read()
    tree = ast.parse(text)
    wanted = {"_maybe_dequant", "_qsa_sparse_paged_gqa_splitk_kernel"}
    parts = ["import triton\nimport triton.language as tl\n"]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            parts.append("\n".join(text.splitlines()[start - 1:node.end_lineno]) + "\n")
    if not any("def _qsa_sparse_paged_gqa_splitk_kernel(" in part for part in parts):
        raise ValueError(f"{path}: expected the function _qsa_sparse_paged_gqa_splitk_kernel")
    return "\n\n".join(parts)


def vllm_compile(path: str, block_n: int, splits: int, warps: int, cache_type: str, out_dir: str):
    """Compile vLLM 0.34.0's split-K kernel for sm_90 as its launcher would on the TP1 shapes."""
    import triton
    from triton.backends.compiler import GPUTarget

    module_path = os.path.join(out_dir, "vllm034_kernel.py")
    with open(module_path, "w") as f:
        f.write(vllm_kernel_source(path))
    spec = importlib.util.spec_from_file_location("vllm034_kernel", module_path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = mod._qsa_sparse_paged_gqa_splitk_kernel
    d, group = HEAD_DIM, HEADS // KV_HEADS
    out_type = "*bf16" if splits == 1 else "*fp32"
    pointers = dict(q_ptr="*bf16", k_cache_ptr=cache_type, v_cache_ptr=cache_type, indices_ptr="*i32",
                    block_table_ptr="*i32", token_to_req_ptr="*i32", partial_output_ptr=out_type,
                    partial_lse_ptr=out_type, output_ptr="*bf16", output_gate_ptr="*bf16")
    # Strides of the fused [NB, Hk, P, 2D] cache seen as K/V views [NB, P, Hk, D] (vLLM's
    # kv_cache.unbind / view), q [R, H, D], indices [R, W+1], table [NR, BTW]: what the
    # JIT would specialise (divisible by 16 -> tt.divisibility; 1 -> constant).
    ints = dict(stride_q_row=HEADS * d, stride_q_head=d, stride_k_block=KV_HEADS * 64 * 2 * d,
                stride_k_token=2 * d, stride_k_head=64 * 2 * d, stride_v_block=KV_HEADS * 64 * 2 * d,
                stride_v_token=2 * d, stride_v_head=64 * 2 * d, stride_indices_row=WIDTH + 1,
                stride_table_req=128, stride_output_row=HEADS * d, stride_output_head=d,
                stride_output_gate_row=HEADS * d, stride_output_gate_head=d, num_rows=3,
                num_cache_blocks=515, num_requests=3)
    constexprs = dict(TOPK=WIDTH, PAGE_SIZE=64, PAGE_TABLE_WIDTH=128, GROUP_SIZE=group, HEAD_DIM=d,
                      NUM_QUERY_HEADS=HEADS, NUM_SPLITS=splits, NUM_TILES=-(-WIDTH // block_n),
                      BLOCK_M=max(16, 1 << (group - 1).bit_length()), BLOCK_N=block_n)
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in pointers:
            signature[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in ("softmax_scale", "output_scale"):
            signature[name] = "fp32"
        elif name in constexprs:
            signature[name] = "constexpr"
        else:
            signature[name] = "i32"
            # do_not_specialize args get no divisibility hint, as in the JIT.
            if ints[name] % 16 == 0 and name not in ("num_rows", "num_requests"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=2))
    ptx_path = os.path.join(out_dir, f"vllm034.bn{block_n}-s{splits}-w{warps}.{cache_type[1:]}.ptx")
    with open(ptx_path, "w") as f:
        f.write(kernel.asm["ptx"])
    return kernel, ptx_path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="keep the TTIR/PTX here (default: a temporary dir)")
    ap.add_argument("--vllm", default=None, help="path of vLLM 0.34.0's qsa.py to compile for comparison")
    ap.add_argument("--vllm-warps", type=int, default=None, help="vLLM's warps (default: as ours, 2)")
    ap.add_argument("--knob", action="append", default=[], help="qsa_jax.config function to force True")
    ap.add_argument("--only", default="bf16,e4m3,uint8")
    ap.add_argument("--configs", default=",".join(c[0] for c in CONFIGS),
                    help="labels of CONFIGS to compile (comma-separated)")
    a = ap.parse_args()

    import triton
    from jax._src.pallas.triton import pallas_call_registration as registration

    import qsa_jax.config as config
    from qsa_jax.ops.sparse_attention import pallas

    registration.gpu_info_lib.get_gpu_info = lambda: types.SimpleNamespace(compute_capability=90)
    pallas.interpret = lambda: False
    config.running_on_hopper = lambda: True
    for knob in a.knob:
        if not callable(getattr(config, knob, None)):
            raise ValueError(f"--knob {knob}: no such function in qsa_jax.config")
        setattr(config, knob, lambda *args, **kwargs: True)
    ptxas = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))[0]
    out_dir = a.out or tempfile.mkdtemp(prefix="sm90_ptx_fp8_")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for label, bn, splits, warps in (c for c in CONFIGS if c[0] in a.configs.split(",")):
        for dtype_name in a.only.split(","):
            for name, ttir, w, stages in pallas_kernels(dtype_name, bn, splits, warps):
                if name != "qsa_sparse_attention":
                    continue  # the merge does not read the cache
                kernel, path = compile_ttir(ttir, name, w, stages, out_dir, f"{label}.{dtype_name}")
                with open(path + ".ptx", "w") as f:
                    f.write(kernel.asm["ptx"])
                rows.append((f"pallas {dtype_name}", label, w, stages, kernel.metadata.shared,
                             ptxas_info(ptxas, path + ".ptx"), ptx_summary(kernel.asm["ptx"])))
        if a.vllm:
            vw = a.vllm_warps or warps
            for cache_type in ("*fp8e4nv", "*bf16"):
                kernel, path = vllm_compile(a.vllm, bn, splits, vw, cache_type, out_dir)
                rows.append((f"vllm-0.34 {cache_type[1:]}", label, vw, 2, kernel.metadata.shared,
                             ptxas_info(ptxas, path), ptx_summary(kernel.asm["ptx"])))
    print(f"PTX/TTIR kept in {out_dir}\n")
    for kernel, label, w, stages, shared, info, summary in rows:
        print(f"## {kernel} {label} (warps {w}, stages {stages}): {info['registers']} registers, "
              f"spill st/ld {info['spill_stores']}/{info['spill_loads']} B, shared {shared} B")
        print(f"  SASS loop  {info['loop']}")
        for key, value in summary.items():
            print(f"  {key:10s} {value}")
        print()
    # One markdown table: the tile loop per warp and tile, by class, every kernel compiled.
    classes = list(OPCODE_CLASSES) + ["other"]
    print("| kernel | launch | regs | spill st/ld B | loop | " + " | ".join(classes) + " |")
    print("|---|---|---|---|---|" + "---|" * len(classes))
    for kernel, label, w, stages, shared, info, summary in rows:
        knobs = "+".join(a.knob) if a.knob and kernel.startswith("pallas") else ""
        print(f"| {kernel}{' ' + knobs if knobs else ''} | {label} w{w} | {info['registers']} | "
              f"{info['spill_stores']}/{info['spill_loads']} | {info['loop_length']} | "
              + " | ".join(str(info["classes"][c]) for c in classes) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
