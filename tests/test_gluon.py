"""The Gluon fp8 split kernel (``gluon_kernels.py``) and its way through jax-triton (``_gluon_support``).

CPU: jax-triton's private API where the hook expects it (read from its source: jax-triton does
not import without a GPU); the kernel compiled for sm_90 by Triton's own compiler -- V never in
shared memory, no byte-wise shared reads, 32-bit V loads, a shorter tile loop than the Triton
kernel's at the same launch, no spills; the launch plan picks it only where it applies, with
arguments the kernel takes. Triton's interpreter does not run Gluon, so the kernel's values are
the GPU tests' (bit for bit against the Triton kernel, and against exact attention).
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import qsa_jax
from qsa_jax import config as cfgmod
from qsa_jax.config import SparseAttentionConfig
from qsa_testing import cases as C
from qsa_testing.stack import pinned_version

K_SCALE, V_SCALE = 0.5, 2.0
E4M3_CODES = np.setdiff1d(np.arange(256), [0x7F, 0xFF]).astype(np.uint8)  # every finite e4m3 code


# ------------------------------------------------------------------------ jax-triton's private API


def test_jax_triton_private_api_is_where_the_hook_expects():
    """``_gluon_support.install`` wraps ``jax_triton.triton_lib.get_or_create_triton_kernel``;
    this fails when an upgrade moves it. The checker itself is shown to notice each change."""
    import importlib.metadata
    import importlib.util
    import os

    from qsa_jax.ops import _gluon_support as G

    spec = importlib.util.find_spec("jax_triton")  # not imported: it refuses to without a GPU
    if spec is None:
        pytest.skip("jax-triton is not installed")
    installed, pinned = importlib.metadata.version("jax-triton"), pinned_version("jax-triton")
    if installed != pinned:  # 0.4.1 beside triton >= 3.7: the plans keep the Triton kernel
        pytest.skip(f"the hook is written for jax-triton {pinned} (tools/constraints.txt), this is {installed}")
    assert G.signature_problems() == []
    with open(os.path.join(list(spec.submodule_search_locations)[0], "triton_lib.py")) as f:
        source = f.read()
    broken = {
        "renamed": source.replace("def get_or_create_triton_kernel(", "def get_or_build_triton_kernel("),
        "keyword": source.replace("    enable_fp_fusion,\n    metaparams,\n    dump: bool,",
                                  "    enable_fp_fusion,\n    params,\n    dump: bool,"),
        "kernel": source.replace("        compilation_result.binary,\n        ttir,\n", "        compilation_result.binary,\n"),
        "not called": source.replace("kernel, specialization_attr = get_or_create_triton_kernel(",
                                     "kernel, specialization_attr = _kernel_for(")}
    for what, text in broken.items():
        assert text != source, f"the {what!r} edit no longer applies to this jax-triton's source"
        assert G.signature_problems(text), what


def test_gluon_is_offered_exactly_on_the_tested_triton_and_jax_triton():
    """``_gluon_support.unavailable_reason`` is None on the tested stack (triton 3.6, jax-triton
    0.3.1: where the kernel was run) and names the reason on the project's other pair (triton
    >= 3.7 with jax-triton 0.4.1: Triton 3.8's Gluon has no ``thread_barrier``, and 0.4.1 no
    longer has the function the hook wraps), so there the plans keep the Triton kernel. Moving
    the pins to another Triton release (major.minor: the gate's unit) or another jax-triton
    fails here until the kernel and the hook are checked on it."""
    import importlib.metadata

    from qsa_jax.ops import _gluon_support as G

    try:
        versions = {p: importlib.metadata.version(p) for p in ("triton", "jax-triton")}
    except importlib.metadata.PackageNotFoundError as exc:
        pytest.skip(f"not installed: {exc}")
    release = lambda v: v.split(".")[:2]  # noqa: E731
    tested = (release(versions["triton"]) == release(pinned_version("triton"))
              and versions["jax-triton"] == pinned_version("jax-triton"))
    reason = G.unavailable_reason()
    assert (reason is None) == tested, (versions, reason)


def test_plans_keep_the_triton_kernel_where_gluon_cannot_run(monkeypatch):
    """Another Triton release than ``GLUON_TRITON`` is named in the reason, and with any reason
    the knob changes nothing: the launch plan, which both launchers read, names the Triton kernel."""
    triton = pytest.importorskip("triton")
    from qsa_jax.ops import _gluon_support as G

    G.unavailable_reason.cache_clear()
    monkeypatch.setattr(triton, "__version__", "3.8.0")
    try:
        reason = G.unavailable_reason()
    finally:
        G.unavailable_reason.cache_clear()
    assert reason and "3.8.0" in reason and G.GLUON_TRITON[0] in reason, reason
    monkeypatch.setattr(G, "unavailable_reason", lambda: "moved")
    assert _plan(_problem("TP1", 1024), monkeypatch).split_kernel == "triton"


def _skip_unless_gluon_runs_here():
    pytest.importorskip("triton")
    from qsa_jax.ops import _gluon_support as G

    reason = G.unavailable_reason()
    if reason:
        pytest.skip(f"the plans keep the Triton kernel here: {reason}")


# ------------------------------------------------------------------------ sm_90 compile (no GPU)


# The sm_90 fp8 table's 2-split launch (513-4096 programs and up until session 21; since then some
# of its bands, config.H200_FP8): 32-wide tiles, 1 warp, 2 splits. The compile checks and numbers
# in the notes are at this launch.
TABLE_LAUNCH = (32, 1, 65, 2)


def _problem(tp="TP1", rows=1024, fmt="e4m3", config=TABLE_LAUNCH):
    """A sparse-attention problem at geometry ``tp`` (shapes only) with the given tiling."""
    import jax
    import jax.numpy as jnp

    from qsa_jax import arg_specs
    from qsa_jax.ops.sparse_attention import base as sbase

    g = arg_specs.GEOMETRIES[tp]
    w, s = 2051, jax.ShapeDtypeStruct
    cache = {"e4m3": jnp.float8_e4m3fn, "e4m3_bytes": jnp.uint8, "bf16": jnp.bfloat16}[fmt]
    return sbase.check_sparse_attention_args(
        s((rows, g.num_query_heads, g.head_dim), jnp.bfloat16),
        s((512, g.num_kv_heads, g.page_size, 2 * g.head_dim), cache),
        s((rows, w + 1), jnp.int32), s((2, 512), jnp.int32), s((rows,), jnp.int32),
        s((rows, g.num_query_heads * g.head_dim), jnp.bfloat16), use_prefill_config=False, config=tuple(config),
        scales_given=(fmt != "bf16",) * 2)


def _plan(problem, monkeypatch, on=True, shared=False):
    from qsa_jax.ops.sparse_attention import triton as T

    monkeypatch.setattr(cfgmod, "triton_fp8_gluon_split", lambda: on)
    monkeypatch.setattr(cfgmod, "triton_fp8_gluon_values_shared", lambda: shared)
    T._launch_plan.cache_clear()
    try:
        return T._launch_plan(problem, (9, 0))
    finally:
        T._launch_plan.cache_clear()


def _compile(plan, cache_type):
    """The plan's split kernel compiled for sm_90 as jax-triton would specialise it."""
    from qsa_jax.ops import _gluon_support as G
    from qsa_jax.ops.sparse_attention import gluon_kernels, triton_kernels

    meta = dict(plan.split_meta)
    warps, stages = meta.pop("num_warps"), meta.pop("num_stages")
    out = "*bf16" if plan.merge_grid is None else "*fp32"
    dtypes = ["*bf16", cache_type, cache_type, "*i32", "*i32", "*i32", "*bf16", "*fp32", "i32", "i32", "i32",
              out, "*fp32"]
    scalars = [(8 + i, "i32", v) for i, v in enumerate(plan.split_scalars)]
    if plan.split_kernel == "gluon":
        fn = gluon_kernels.sparse_attention_split_kernel_fp8_gluon
        compiled, _ = G.compile_for_jax_triton(fn, dtypes, scalars, num_warps=warps, num_ctas=1,
                                               compute_capability=90, enable_fp_fusion=True, metaparams=meta)
        return compiled
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = triton_kernels.sparse_attention_split_kernel
    signature = {fn.arg_names[i]: t for i, t in enumerate(dtypes)}
    consts = dict(meta, **{fn.arg_names[i]: 1 for i, _, v in scalars if v == 1})
    signature.update({k: "constexpr" for k in consts})
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(dtypes) if t.startswith("*")}
    return triton.compile(ASTSource(fn, signature, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=warps, num_stages=stages))


def _sass_numbers(compiled, tmp_path, name):
    """``ptxas -v`` registers and spills and the SASS tile loop's length (tools/sm90_split_kernel_ab)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import sm90_split_kernel_ab as A

    return A.compiled_numbers(compiled, str(tmp_path / f"{name}.ptx"))


@pytest.mark.parametrize("tp,fmt", [("TP1", "e4m3"), ("TP4", "e4m3_bytes")])
def test_gluon_kernel_compiles_for_sm90(tp, fmt, monkeypatch, tmp_path):
    """At the measured Hopper table's 2-split one-warp fp8 launch (``TABLE_LAUNCH``: 32-wide
    tiles, 2 splits): V travels global memory -> registers only (shared memory = q + two K tiles; no
    byte-wise shared reads; the V tile in 32-bit loads), and the tile loop is at most 0.8x
    the Triton kernel's at the same launch, without spills (V loads after q.K^T, the default)."""
    _skip_unless_gluon_runs_here()
    rows = 1024
    cache = "*u8" if fmt == "e4m3_bytes" else "*fp8e4nv"
    gplan = _plan(_problem(tp, rows, fmt), monkeypatch)
    tplan = _plan(_problem(tp, rows, fmt), monkeypatch, on=False)
    assert gplan.split_kernel == "gluon" and tplan.split_kernel == "triton"
    meta = dict(gplan.split_meta)
    bn, d = meta["BLOCK_N"], meta["D"]
    assert (bn, meta["NUM_SPLITS"], meta["num_warps"]) == (32, 2, 1)
    gk = _compile(gplan, cache)
    tk = _compile(tplan, cache)
    ptx = gk.asm["ptx"]
    q_bytes = 16 * d * 2
    assert gk.metadata.shared <= q_bytes + 2 * bn * d + 1024, gk.metadata.shared
    assert not re.search(r"ld\.shared\.(b8|u8|s8)", ptx)
    assert len(re.findall(r"ld\.global\.b32", ptx)) >= bn * d // 4 // 32  # V: one 4-byte load per 4 channels
    g = _sass_numbers(gk, tmp_path, "gluon")
    t = _sass_numbers(tk, tmp_path, "triton")
    # tools/sm90_split_kernel_ab.gluon (the notes' numbers) builds the same program.
    import sm90_split_kernel_ab as A
    from qsa_jax import arg_specs

    tool = A.gluon(arg_specs.GEOMETRIES[tp], rows, bn, meta["NUM_SPLITS"], requests=2, page=meta["PAGE"])
    assert _sass_numbers(tool, tmp_path, "tool")["loop_length"] == g["loop_length"]
    assert int(g["spill_stores"]) == 0, g
    assert g["loop_length"] <= 0.8 * t["loop_length"], (g["loop_length"], t["loop_length"])


def test_gluon_values_through_shared_memory_compile_for_sm90(monkeypatch, tmp_path):
    """V_SHARED (``config.triton_fp8_gluon_values_shared``) at the TP1 table launch: V arrives by
    ``cp.async`` (as many 16-byte copies as K's) instead of global loads, is read back 4 bytes at
    a time (no byte reads), and the shared memory is the register path's (one V buffer in place
    of the second K buffer)."""
    _skip_unless_gluon_runs_here()
    plan = _plan(_problem("TP1", 1024), monkeypatch, shared=True)
    regs = _plan(_problem("TP1", 1024), monkeypatch)
    assert dict(plan.split_meta)["V_SHARED"] is True and dict(regs.split_meta)["V_SHARED"] is False
    shared, in_regs = _compile(plan, "*fp8e4nv"), _compile(regs, "*fp8e4nv")
    ptx, ptx_regs = shared.asm["ptx"], in_regs.asm["ptx"]
    copies = lambda text: len(re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", text))
    assert copies(ptx) == 2 * copies(ptx_regs) > 0
    assert len(re.findall(r"ld\.global\.b32", ptx)) < 32 <= len(re.findall(r"ld\.global\.b32", ptx_regs))
    assert len(re.findall(r"ld\.shared\.(b32|v2\.b16|v4\.b8)", ptx)) >= 64  # 4 bytes per read
    assert len(re.findall(r"ld\.shared(\.v\d)?\.(b8|u8|s8)", ptx)) < 32
    assert shared.metadata.shared == in_regs.metadata.shared


def _bank_conflict_probe(expected_plain_v_reads):
    """A kernel that compiles only when the shared-memory accesses have the conflict counts
    stated (``gl.bank_conflicts``, Gluon's own count, checked by ``static_assert``)."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from qsa_jax.ops.sparse_attention import gluon_kernels as G

    @gluon.jit
    def probe(x, PLAIN_V_READS: gl.constexpr):
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
        b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=G.K_WIDTH)
        v_load: gl.constexpr = G._value_layouts(32, 256)[0]
        copy: gl.constexpr = gl.BlockedLayout([1, 16], [2, 16], [1, 1], [1, 0])
        plain: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        k = gl.allocate_shared_memory(gl.uint8, [32, 256], G.K_SHARED)
        v = gl.allocate_shared_memory(gl.uint8, [32, 256], G.V_SHARED_LAYOUT)
        u = gl.allocate_shared_memory(gl.uint8, [32, 256], plain)
        tile: gl.constexpr = gl.distributed_type(gl.uint8, [32, 256], v_load)
        copies: gl.constexpr = gl.distributed_type(gl.uint8, [32, 256], copy)
        gl.static_assert(gl.bank_conflicts(gl.distributed_type(gl.uint8, [256, 32], b_op), k.permute([1, 0]).type) == 0)
        gl.static_assert(gl.bank_conflicts(tile, v.type) == 0)
        gl.static_assert(gl.bank_conflicts(copies, k.type) == 0)
        gl.static_assert(gl.bank_conflicts(copies, v.type) == 0)
        gl.static_assert(gl.bank_conflicts(tile, k.type) == 1)  # V read from K's swizzle: 2-way
        gl.static_assert(gl.bank_conflicts(tile, u.type) == PLAIN_V_READS)

    return probe


def test_gluon_shared_memory_reads_have_no_bank_conflicts(monkeypatch):
    """The kernel's shared-memory layouts against the register layouts that read and write them
    at the table launch's tile: the K operand's reads, V's 32-bit reads (V_SHARED) and the
    16-byte copies of both, 0 conflicts each; the count does see conflicts (V's reads from K's
    swizzle: 1, from an unswizzled tile: 3 -- and a probe that claims 0 there fails to compile)."""
    pytest.importorskip("triton")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    def build(plain_v_reads):
        fn = _bank_conflict_probe(plain_v_reads)
        return triton.compile(GluonASTSource(fn, {"x": "*i32", "PLAIN_V_READS": "constexpr"},
                                             {"PLAIN_V_READS": plain_v_reads}, {}),
                              target=GPUTarget("cuda", 90, 32), options=dict(num_warps=1))

    # Compiled afresh: the probe reads the layouts through the module, which Triton's cache key
    # does not see, so a cached build would not evaluate the asserts.
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
    build(3)
    with pytest.raises(Exception, match="static_assert|assert"):
        build(0)


@pytest.mark.parametrize("d,group,block_n", [(32, 4, 16), (64, 16, 32), (128, 1, 64)])
def test_gluon_kernel_compiles_at_every_head_dim_it_accepts(d, group, block_n, monkeypatch):
    """Every launch ``gluon_split_applies`` lets through compiles (D 32-128 here besides the real
    256: the K step is capped at D), with the V tile kept out of shared memory."""
    _skip_unless_gluon_runs_here()
    import jax
    import jax.numpy as jnp

    from qsa_jax.ops.sparse_attention import base as sbase

    rows, kv_heads, page, w = 8, 2, 16, 4 * block_n - 3
    s = jax.ShapeDtypeStruct
    problem = sbase.check_sparse_attention_args(
        s((rows, group * kv_heads, d), jnp.bfloat16), s((64, kv_heads, page, 2 * d), jnp.float8_e4m3fn),
        s((rows, w + 1), jnp.int32), s((2, 64), jnp.int32), s((rows,), jnp.int32),
        s((rows, group * kv_heads * d), jnp.bfloat16), use_prefill_config=False,
        config=(block_n, 1, -(-w // block_n), 2), scales_given=(True, True))
    plan = _plan(problem, monkeypatch)
    assert plan.split_kernel == "gluon" and dict(plan.split_meta)["KC"] == min(64, d)
    compiled = _compile(plan, "*fp8e4nv")
    # Byte-wise shared reads: only the tile's validity flags changing layout (a handful); a V
    # tile read so would be block_n * d / 32 of them per thread.
    assert len(re.findall(r"ld\.shared(\.v\d)?\.(b8|u8|s8)", compiled.asm["ptx"])) < block_n * d // 32
    assert compiled.metadata.shared <= 16 * d * 2 + 2 * block_n * d + 1024


def test_plan_picks_gluon_only_where_it_applies(monkeypatch):
    """The knob moves fp8 one-warp launches to the Gluon kernel with arguments it takes
    (every constexpr a parameter, every parameter given); bf16 caches, 2-warp launches and
    the knob off keep the Triton kernel."""
    _skip_unless_gluon_runs_here()
    from qsa_jax.ops.sparse_attention import gluon_kernels

    fn = gluon_kernels.sparse_attention_split_kernel_fp8_gluon
    names = list(inspect.signature(fn.fn).parameters)
    plan = _plan(_problem("TP1", 1024), monkeypatch)
    assert plan.split_kernel == "gluon"
    meta = dict(plan.split_meta)
    given = names[:13] + [k for k in meta if k not in ("num_warps", "num_stages")]
    assert sorted(given) == sorted(names), set(given) ^ set(names)
    assert meta["KC"] == 64
    assert _plan(_problem("TP1", 1024, "bf16"), monkeypatch).split_kernel == "triton"
    assert _plan(_problem("TP1", 1024, config=(32, 2, 65, 4)), monkeypatch).split_kernel == "triton"
    assert _plan(_problem("TP1", 1024), monkeypatch, on=False).split_kernel == "triton"


def test_register_cap_goes_into_one_warp_fp8_triton_plans_only(monkeypatch):
    """``config.triton_fp8_register_cap`` adds Triton's ``maxnreg`` launch option to the Triton
    split kernel's plan at one-warp fp8 launches (e4m3 values and bytes) and nowhere else: not
    at 2 warps, not for a bf16 cache, not to the Gluon kernel (whose launcher takes no such
    option), not when the knob is None or 0; the shim's torch route passes the same options."""
    pytest.importorskip("triton")
    monkeypatch.setattr(cfgmod, "triton_fp8_register_cap", lambda: 200)

    def meta(problem, gluon=False):
        plan = _plan(problem, monkeypatch, on=gluon)
        return plan, dict(plan.split_meta)

    for fmt in ("e4m3", "e4m3_bytes"):
        for tp in ("TP1", "TP4"):
            plan, m = meta(_problem(tp, 1024, fmt))
            assert plan.split_kernel == "triton" and m["maxnreg"] == 200 and m["num_warps"] == 1
    assert "maxnreg" not in meta(_problem("TP1", 1024, config=(32, 2, 65, 4)))[1]
    assert "maxnreg" not in meta(_problem("TP1", 1024, "bf16"))[1]
    from qsa_jax.ops.sparse_attention import triton as T

    if T.gluon_split_applies(_problem("TP1", 1024), 32, 1):
        plan, m = meta(_problem("TP1", 1024), gluon=True)
        assert plan.split_kernel == "gluon" and "maxnreg" not in m
    for off in (None, 0):
        monkeypatch.setattr(cfgmod, "triton_fp8_register_cap", lambda off=off: off)
        assert "maxnreg" not in meta(_problem("TP1", 1024))[1]
    for bad in (True, 8, 256, 200.0):  # a bare --knob (True) would be a cap of 1 register
        monkeypatch.setattr(cfgmod, "triton_fp8_register_cap", lambda bad=bad: bad)
        with pytest.raises(ValueError, match="16-255"):
            meta(_problem("TP1", 1024))
    pytest.importorskip("torch")
    from qsa_torch_shim import _direct

    monkeypatch.setattr(cfgmod, "triton_fp8_register_cap", lambda: 200)
    problem = _problem("TP1", 1024)
    plan = _plan(problem, monkeypatch, on=False)
    assert _direct._launches(problem, plan)[0].meta["maxnreg"] == 200


def test_shim_launches_the_plans_kernel(monkeypatch):
    _skip_unless_gluon_runs_here()
    pytest.importorskip("torch")
    from qsa_jax.ops.sparse_attention import gluon_kernels, triton_kernels
    from qsa_torch_shim import _direct

    problem = _problem("TP1", 1024)
    plan = _plan(problem, monkeypatch)
    assert _direct._launches(problem, plan)[0].kernel is gluon_kernels.sparse_attention_split_kernel_fp8_gluon
    plan = _plan(problem, monkeypatch, on=False)
    assert _direct._launches(problem, plan)[0].kernel is triton_kernels.sparse_attention_split_kernel


# ------------------------------------------------------------------------ GPU


def _gpu_case(tp, rows, seed):
    from qsa_jax import arg_specs

    g = arg_specs.GEOMETRIES[tp]
    rng = np.random.default_rng(seed)
    case = C.sparse_attention_case(rng, rows=rows, num_query_heads=g.num_query_heads, num_kv_heads=g.num_kv_heads,
                                   head_dim=g.head_dim, page_size=64, selection_blocks=512, context_tokens=8192,
                                   num_requests=4, make_cache=True)
    return C.add_edge_rows(rng, case), rng


def _poisoned_e4m3_codes(case, cfg, rng):
    """Random finite e4m3 codes in the case's cache shape, every row no entry of ``cfg``'s
    tiling references poisoned: K 448 (a stray score would take its row), V NaN (a stray
    value would show)."""
    bits = rng.choice(E4M3_CODES, case.kv_cache.shape)
    stray = ~C.referenced_rows(case, cfg)
    d = case.head_dim
    unref = np.broadcast_to(stray[:, None, :, None], bits.shape)
    bits[..., :d][unref[..., :d]] = 0x7E
    bits[..., d:][unref[..., d:]] = 0x7F
    return bits


def _gpu_fp8_variants(tp, fmt, tiling, shared, seed, variants, monkeypatch):
    """Both GPU tests' runs: skips without a GPU or a Gluon route; one poisoned e4m3 case
    (``_poisoned_e4m3_codes``; ``fmt`` e4m3 values or their bytes) launched through the public
    jax-triton call at ``tiling`` once per variant (name -> (Gluon split kernel on, lazy
    rescaling on)), V through shared memory for the Gluon kernel when ``shared``. Returns
    (case, cfg, the e4m3 codes, {name: output}, {name: launch plan})."""
    import jax

    from qsa_jax.ops.sparse_attention import base as sbase
    from qsa_jax.ops.sparse_attention import triton as T
    from qsa_jax.ops.sparse_attention.api import _run as jitted

    if jax.default_backend() not in ("gpu", "cuda"):
        pytest.skip("needs a CUDA GPU")
    if T.why_not():
        pytest.skip(T.why_not())
    _skip_unless_gluon_runs_here()
    case, rng = _gpu_case(tp, 64, seed=seed)
    cfg = SparseAttentionConfig(*tiling)
    bits = _poisoned_e4m3_codes(case, cfg, rng)
    kv = jax.device_put(bits if fmt == "e4m3_bytes" else bits.view(C.E4M3))
    args = (case.q, kv, case.logical_indices, case.block_table, case.token_to_req, case.output_gate)
    outs, plans = {}, {}
    monkeypatch.setattr(cfgmod, "triton_fp8_gluon_values_shared", lambda: shared)
    for name, (gluon_on, lazy) in variants.items():
        monkeypatch.setattr(cfgmod, "triton_fp8_gluon_split", lambda on=gluon_on: on)
        monkeypatch.setattr(cfgmod, "triton_fp8_lazy_rescale", lambda on=lazy: on)
        jitted.clear_cache()
        T._launch_plan.cache_clear()
        problem = sbase.check_sparse_attention_args(*args, use_prefill_config=False, config=tuple(tiling),
                                                    scales_given=(True, True))
        plans[name] = T.launch_plan(problem)
        outs[name] = np.asarray(qsa_jax.sparse_attention(*args, config=cfg, implementation="triton",
                                                         k_scale=K_SCALE, v_scale=V_SCALE))
    jitted.clear_cache()
    T._launch_plan.cache_clear()
    return case, cfg, bits, outs, plans


def _case_ids(cases):
    return [f"{t}-{f}-bn{c[0]}-s{c[3]}-{'vshared' if v else 'vregs'}" for t, f, c, v in cases]


GPU_CASES = [  # (geometry, cache, tiling, V through shared memory)
    ("TP1", "e4m3", TABLE_LAUNCH, False), ("TP4", "e4m3", TABLE_LAUNCH, False),
    ("TP1", "e4m3_bytes", (32, 1, 65, 4), False), ("TP4", "e4m3_bytes", (32, 1, 65, 1), False),
    ("TP1", "e4m3", (32, 1, 65, 1), False), ("TP1", "e4m3", (16, 1, 129, 8), False),
    ("TP4", "e4m3", (64, 1, 33, 1), False),
    ("TP1", "e4m3", TABLE_LAUNCH, True), ("TP4", "e4m3_bytes", TABLE_LAUNCH, True),
    ("TP1", "e4m3", (16, 1, 129, 8), True), ("TP4", "e4m3", (32, 1, 65, 1), True)]


@pytest.mark.gpu
@pytest.mark.parametrize("tp,fmt,tiling,shared", GPU_CASES, ids=_case_ids(GPU_CASES))
def test_gpu_gluon_split_is_bit_identical(tp, fmt, tiling, shared, monkeypatch):
    """On the GPU: the Gluon split kernel's output is the Triton kernel's, bit for bit, at
    one-warp launches (32-wide tiles with 1, 2, 4 splits; 16-wide with 8; 64-wide), V through
    registers and (``config.triton_fp8_gluon_values_shared``) through shared memory, on
    random finite e4m3 codes with every degenerate row kind, and with poison in every
    unreferenced cache row (K 448, V NaN) -- exact zeros where rows have no entries, no NaN.
    The plan must name the Gluon kernel (it falls back to Triton's where it cannot route it)."""
    seed = GPU_CASES.index((tp, fmt, tiling, shared)) + 100
    _, _, _, outs, plans = _gpu_fp8_variants(tp, fmt, tiling, shared, seed,
                                             {False: (False, False), True: (True, False)}, monkeypatch)
    for on in (False, True):
        assert plans[on].split_kernel == ("gluon" if on else "triton")
    assert not np.isnan(outs[False].astype(np.float32)).any()
    assert (outs[False].astype(np.float32) == 0).all(axis=(1, 2)).any()  # the empty rows are there
    np.testing.assert_array_equal(outs[True].view(np.uint16), outs[False].view(np.uint16))

LAZY_CASES = [  # (geometry, cache, tiling, the Gluon kernel's V through shared memory)
    ("TP1", "e4m3", TABLE_LAUNCH, False), ("TP4", "e4m3_bytes", TABLE_LAUNCH, False),
    ("TP1", "e4m3", (32, 1, 65, 4), True), ("TP4", "e4m3", (16, 1, 129, 8), True)]


@pytest.mark.gpu
@pytest.mark.parametrize("tp,fmt,tiling,shared", LAZY_CASES, ids=_case_ids(LAZY_CASES))
def test_gpu_lazy_rescale(tp, fmt, tiling, shared, monkeypatch):
    """On the GPU: lazy rescaling (``config.triton_fp8_lazy_rescale``) in the Triton split kernel
    meets the accuracy contract -- distance from exact attention (float64) at most 1.10x the
    eager kernel's -- on random finite e4m3 codes (scores spread widely, so tiles both take and
    skip the rescaling) with every degenerate row kind and poison in every unreferenced row
    (exact zeros, no NaN); and the Gluon kernel with it gives the Triton kernel's bits (the
    same decisions on the same scores, the same MMA positions)."""
    from qsa_testing.exact import exact_attention

    variants = {"eager": (False, False), "lazy": (False, True), "gluon-lazy": (True, True)}
    case, cfg, bits, outs, plans = _gpu_fp8_variants(tp, fmt, tiling, shared,
                                                     LAZY_CASES.index((tp, fmt, tiling, shared)) + 200, variants,
                                                     monkeypatch)
    for name, (gluon_on, lazy) in variants.items():
        assert plans[name].split_kernel == ("gluon" if gluon_on else "triton")
        assert dict(plans[name].split_meta)["LAZY_RESCALE"] == (cfgmod.LAZY_RESCALE_LOG2 if lazy else 0.0)
    exact = exact_attention(case.q, bits.view(C.E4M3), case.logical_indices, case.block_table, case.token_to_req,
                            case.output_gate, k_scale=K_SCALE, v_scale=V_SCALE, block_n=cfg.block_n,
                            num_tiles=cfg.num_tiles)
    err = {k: float(np.linalg.norm(v.astype(np.float64) - exact) / np.linalg.norm(exact)) for k, v in outs.items()}
    print(tp, fmt, tiling, err)
    lazy_out = outs["lazy"].astype(np.float32)
    assert not np.isnan(lazy_out).any()
    empty = np.all(exact == 0, axis=(1, 2))
    assert empty.any() and not lazy_out[empty].any()
    assert err["lazy"] <= 1.10 * err["eager"], err
    np.testing.assert_array_equal(outs["gluon-lazy"].view(np.uint16), outs["lazy"].view(np.uint16))
