"""Triton implementation of sparse paged attention, launched with ``jax_triton.triton_call``.

The kernels (``triton_kernels.py``) read the cache where it lies: the fused
vLLM buffer ``[NB, Hk, P, 2D]`` (K = channels [0, D), V = [D, 2D)) or the split
pair ``[NB, P, Hk, D]``; the wrapper only passes strides, never copies or
transposes the cache. Same arithmetic as ``xla.py`` and the originals.

Launch configuration: ``config.triton_tiling`` (``problem.config``: the default
table's, ``config.select_config``, or the caller's ``config=``; on a Hopper GPU where the tiling came
from the library's measured table, ``config.tune_config_for_hopper`` may change the
split count of the smallest batches) and ``config.triton_launch`` for warps, stages,
prefetch and the merge (``launch=TritonLaunch(...)`` overrides; see
notes/triton.md for the numbers).

Compile cost: jax-triton compiles the Triton kernels while JAX lowers the jitted
function (outside JAX's persistent compilation cache), once per kernel
specialisation per process. Batch-size-dependent values are runtime scalars,
so a deployment compiles one kernel per distinct tiling, not per batch size.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from qsa_jax import config
from qsa_jax.config import device_capability, next_pow2, triton_launch, triton_tile_induction, triton_tiling
from qsa_jax.ops import _triton_support
from qsa_jax.ops.sparse_attention.base import F16_QUERY_MAX_SHIFT, F16_QUERY_TOP_EXPONENT, SparseAttentionProblem

# Optional dependency: the package must import without jax-triton.
_jt, _k, _IMPORT_ERROR = _triton_support.load_kernels("qsa_jax.ops.sparse_attention.triton_kernels")


def why_not() -> str | None:
    """None when the Triton kernels can run here, else the reason."""
    return _triton_support.why_not(_IMPORT_ERROR)


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Both launches of one problem, whoever makes them: ``run`` through
    ``jax_triton.triton_call``, or qsa_torch_shim's ``implementation="triton-torch"`` through
    Triton's own launcher on torch tensors. Kernel arguments, in order: q, K, V,
    logical_indices, block_table, token_to_req, the gate ([R, H, D]), the scale pair (fp32
    ``[score scale, output scale]``, ``base.scale_operand``; any array when the problem is not
    ``scaled``; for the fused cache K and V are both the fused buffer, V at ``V_OFFSET``),
    the scalars (``split_scalars``), then the outputs (``out_shapes``); the merge takes the
    partials, their lse, the gate and rows, then its output ([R, H, D] bf16)."""

    split_grid: tuple[int, int, int]
    # rows, requests - 1 (the largest valid request id: triton_kernels says why), pages
    split_scalars: tuple[int, int, int]
    # constexprs, num_warps and num_stages (and Triton's maxnreg where
    # config.triton_fp8_register_cap sets one: jax-triton's launch takes it through _triton_images)
    split_meta: tuple[tuple[str, object], ...]
    split_kernel: str  # "triton" (triton_kernels) or "gluon" (gluon_kernels; fp8 at one warp)
    out_shapes: tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype name) per output
    merge_grid: tuple[int, int, int] | None  # None: one split, the split kernel writes the result
    merge_meta: tuple[tuple[str, object], ...] | None


def launch_plan(problem: SparseAttentionProblem) -> LaunchPlan:
    """The launches ``run`` makes for ``problem`` (rows > 0), cached per problem and device
    capability (the launch tables depend on it)."""
    return _launch_plan(problem, device_capability())


@functools.lru_cache(maxsize=256)
def _launch_plan(problem: SparseAttentionProblem, capability) -> LaunchPlan:
    p = problem
    cfg = triton_tiling(p)
    launch = triton_launch(p)
    rows, heads, d = p.num_rows, p.num_query_heads, p.head_dim
    kv = p.kv
    if kv.fused:  # [NB, Hk, P, 2D]
        strides = dict(STRIDE_PAGE=kv.num_kv_heads * kv.page_size * 2 * d, STRIDE_TOKEN=2 * d,
                       STRIDE_HEAD=kv.page_size * 2 * d, V_OFFSET=d)
    else:  # [NB, P, Hk, D] each
        strides = dict(STRIDE_PAGE=kv.page_size * kv.num_kv_heads * d, STRIDE_TOKEN=kv.num_kv_heads * d,
                       STRIDE_HEAD=d, V_OFFSET=0)
    splits = cfg.num_splits
    # What both split kernels take alike.
    common = dict(W=p.selection_width, PAGE=kv.page_size, BTW=p.table_width, GROUP=p.group_size, HEADS=heads,
                  D=d, Q_ROW_STRIDE=p.queries.row_stride, Q_HEAD_STRIDE=p.queries.head_stride,
                  Q_OFFSET=p.queries.offset, BLOCK_N=cfg.block_n, NUM_TILES=cfg.num_tiles, NUM_SPLITS=splits,
                  QK_FP16=p.is_fp8 and config.triton_fp8_keys_f16_dot(p.group_size, splits),
                  F16_TOP_EXPONENT=F16_QUERY_TOP_EXPONENT, F16_MAX_SHIFT=F16_QUERY_MAX_SHIFT, **strides)
    lazy = config.LAZY_RESCALE_LOG2 if p.is_fp8 and config.triton_fp8_lazy_rescale() else 0.0
    if config.triton_fp8_gluon_split() and gluon_split_applies(p, cfg.block_n, launch.num_warps):
        split_kernel = "gluon"
        split_meta = dict(num_warps=1, num_stages=launch.num_stages, KC=min(GLUON_KEY_CHANNELS, d),
                          V_SHARED=config.triton_fp8_gluon_values_shared(), LAZY_RESCALE=lazy, **common)
    else:
        split_kernel = "triton"
        split_meta = dict(
            num_warps=launch.num_warps, num_stages=launch.num_stages, BLOCK_M=next_pow2(p.group_size),
            PREFETCH=launch.prefetch, SCALED=p.scaled, FP8=p.is_fp8,
            TILE_INDUCTION=not launch.prefetch and triton_tile_induction(cfg.num_tiles, cfg.num_splits),
            KV_BYTES=p.kv_format == "e4m3_bytes", V_F16_STAGED=p.is_fp8 and config.triton_fp8_values_f16_staged(),
            LAZY_RESCALE=lazy,
            **common)
        cap = p.is_fp8 and launch.num_warps == 1 and config.triton_fp8_register_cap()
        if cap:  # a launch option, not a kernel argument: Triton's ``maxnreg``, read by both launchers
            if isinstance(cap, bool) or not isinstance(cap, int) or not 16 <= cap <= 255:
                raise ValueError(f"config.triton_fp8_register_cap() must be None or an int in 16-255 (ptxas's "
                                 f"range); got {cap!r}")
            split_meta["maxnreg"] = cap
    scalars = (rows, p.num_requests - 1, kv.num_pages)
    if splits == 1:
        return LaunchPlan((rows, kv.num_kv_heads, 1), scalars, tuple(split_meta.items()), split_kernel,
                          (((rows, heads, d), "bfloat16"), ((1,), "float32")),  # lse slot unused
                          None, None)
    block_d = launch.merge_block_d
    merge_meta = dict(num_warps=launch.merge_warps, num_stages=1, HEADS=heads, D=d, NUM_SPLITS=splits,
                      BLOCK_S=next_pow2(splits), BLOCK_D=block_d)
    return LaunchPlan((rows, kv.num_kv_heads, splits), scalars, tuple(split_meta.items()), split_kernel,
                      (((splits, rows, heads, d), "float32"), ((splits, rows, heads), "float32")),
                      (rows, heads, d // block_d), tuple(merge_meta.items()))


# q.K^T channels per step of the Gluon kernel (at most D): 64 gives the shortest sm_90 loop at
# the TP1 2-split table launch (1687 instructions against 1743 at 16), no spills.
GLUON_KEY_CHANNELS = 64


def gluon_split_applies(problem: SparseAttentionProblem, block_n: int, num_warps: int) -> bool:
    """Whether ``gluon_kernels.sparse_attention_split_kernel_fp8_gluon`` can run this launch:
    an fp8 cache (with its scales), one warp, at most 16 query heads per KV head (one 16-row
    MMA tile), D a power of two in [32, 256] (its layouts), tiles of at least 16 tokens; and
    a Triton release the kernel is written for (``_gluon_support.GLUON_TRITON``) and a
    jax-triton whose internals ``_gluon_support`` knows (``unavailable_reason``)."""
    from qsa_jax.ops import _gluon_support

    d = problem.head_dim
    return (problem.is_fp8 and problem.scaled and num_warps == 1 and problem.group_size <= 16
            and 32 <= d <= 256 and d & (d - 1) == 0 and block_n >= 16
            and _gluon_support.unavailable_reason() is None)


def split_kernel(plan: LaunchPlan):
    """The split kernel ``plan`` names, for either launcher: ``run`` (jax-triton) and the shim's
    torch route (Triton's own). The Gluon module is imported only when a plan names it."""
    if plan.split_kernel == "gluon":
        from qsa_jax.ops.sparse_attention import gluon_kernels

        return gluon_kernels.sparse_attention_split_kernel_fp8_gluon
    from qsa_jax.ops.sparse_attention import triton_kernels

    return triton_kernels.sparse_attention_split_kernel


def run(problem: SparseAttentionProblem, q, kv_arrays, logical_indices, block_table,
        token_to_req, output_gate, scales=None):
    """Traceable under jit."""
    p = problem
    rows, heads, d = p.num_rows, p.num_query_heads, p.head_dim
    if rows == 0:
        return jnp.zeros((0, heads, d), jnp.bfloat16)
    plan = launch_plan(p)
    k_arr, v_arr = (kv_arrays[0], kv_arrays[0]) if p.kv.fused else kv_arrays
    gate = output_gate.reshape(rows, heads, d)
    split_meta = dict(plan.split_meta)
    if plan.split_kernel == "gluon":
        from qsa_jax.ops import _gluon_support

        _gluon_support.install()  # jax-triton builds Gluon kernels only through this
    if "maxnreg" in split_meta:
        from qsa_jax.ops import _triton_images

        reason = _triton_images.unavailable_reason()  # the hook that carries maxnreg into the PTX
        if reason is not None:
            raise RuntimeError(f"config.triton_fp8_register_cap() = {split_meta['maxnreg']} needs the jax-triton "
                               f"lowering hook of qsa_jax.ops._triton_images, which is not in place: {reason}")
    partial, lse = _jt.triton_call(
        # Without scales the kernel never reads scale_ptr: any array fills the slot.
        q, k_arr, v_arr, logical_indices, block_table, token_to_req, gate,
        scales if p.scaled else token_to_req, *plan.split_scalars,
        kernel=split_kernel(plan),
        out_shape=[jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in plan.out_shapes],
        grid=plan.split_grid,
        name="qsa_sparse_attention_split",
        **split_meta)
    if plan.merge_grid is None:
        return partial
    return _jt.triton_call(
        partial, lse, gate, rows,
        kernel=_k.sparse_attention_merge_kernel,
        out_shape=jax.ShapeDtypeStruct((rows, heads, d), jnp.bfloat16),
        grid=plan.merge_grid,
        name="qsa_sparse_attention_merge",
        **dict(plan.merge_meta))
