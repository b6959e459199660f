"""Triton implementation of sparse paged attention, launched with ``jax_triton.triton_call``.

The kernels (``triton_kernels.py``) read the cache where it lies: the fused
vLLM buffer ``[NB, Hk, P, 2D]`` (K = channels [0, D), V = [D, 2D)) or the split
pair ``[NB, P, Hk, D]``; the wrapper only passes strides, never copies or
transposes the cache. Same arithmetic as ``xla.py`` and the originals.

Launch configuration: ``problem.config`` (the originals' table, or the
caller's ``config=``). When the caller did not give one and the GPU is a
Hopper, ``config.tune_config_for_hopper`` may change warps and the split
count of the smallest batches (see notes/triton.md for the numbers).

Compile cost: jax-triton compiles the Triton kernels while JAX lowers the jitted
function (outside JAX's persistent compilation cache), once per kernel
specialisation per process. Batch-size-dependent values are runtime scalars,
so a deployment compiles one kernel per distinct tiling, not per batch size.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp

from qsa_jax.ops import _triton_support
from qsa_jax.ops.sparse_attention.base import SparseAttentionProblem

# Optional dependency: the package must import without jax-triton.
_jt, _k, _IMPORT_ERROR = _triton_support.load_kernels("qsa_jax.ops.sparse_attention.triton_kernels")

# Extra kernel knobs that are not part of SparseAttentionConfig (no effect on numerics).
NUM_STAGES = 2  # 1 and 3 measured slower at every shape (notes/triton.md)
PREFETCH = None  # None: by config (see _prefetch)
MERGE_BLOCK_D = 64  # D chunk per merge program: more programs for tiny batches
MERGE_WARPS = 4


def why_not() -> str | None:
    """None when the Triton kernels can run here, else the reason."""
    return _triton_support.why_not(_IMPORT_ERROR)


def launch_config(problem: SparseAttentionProblem):
    """The config this implementation launches with (see the module docstring)."""
    from qsa_jax.config import running_on_hopper, tune_config_for_hopper

    if problem.config_explicit or not running_on_hopper():
        return problem.config

    return tune_config_for_hopper(problem.config, problem.num_rows, problem.num_kv_heads)


def _prefetch(cfg) -> bool:
    """Load the next tile's tokens/pages early: +8-10% at 32-64 rows (1 warp, BN 32),
    -26% at 256 rows (BN 64, 2 warps, 4 splits), neutral at one split (H200)."""
    if PREFETCH is not None:
        return PREFETCH
    return not (cfg.block_n >= 64 and cfg.num_splits > 1)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def run(problem: SparseAttentionProblem, q, kv_arrays, logical_indices, block_table,
        token_to_req, output_gate, scales=None, *, config=None, num_stages: int | None = None,
        prefetch: bool | None = None, merge_block_d: int | None = None):
    """Traceable under jit. Keyword knobs are for benchmarks; defaults are the tuned ones."""
    p = problem
    cfg = config or launch_config(p)
    rows, heads, d = p.num_rows, p.num_query_heads, p.head_dim
    if rows == 0:
        return jnp.zeros((0, heads, d), jnp.bfloat16)
    kv = p.kv
    if kv.fused:  # [NB, Hk, P, 2D]
        k_arr = v_arr = kv_arrays[0]
        strides = dict(STRIDE_PAGE=kv.num_kv_heads * kv.page_size * 2 * d, STRIDE_TOKEN=2 * d,
                       STRIDE_HEAD=kv.page_size * 2 * d, V_OFFSET=d)
    else:  # [NB, P, Hk, D] each
        k_arr, v_arr = kv_arrays
        strides = dict(STRIDE_PAGE=kv.page_size * kv.num_kv_heads * d, STRIDE_TOKEN=kv.num_kv_heads * d,
                       STRIDE_HEAD=d, V_OFFSET=0)
    gate = output_gate.reshape(rows, heads, d)
    splits = cfg.num_splits
    one_split = splits == 1
    if one_split:
        out_shape = [jax.ShapeDtypeStruct((rows, heads, d), jnp.bfloat16),
                     jax.ShapeDtypeStruct((1,), jnp.float32)]  # lse slot unused
    else:
        out_shape = [jax.ShapeDtypeStruct((splits, rows, heads, d), jnp.float32),
                     jax.ShapeDtypeStruct((splits, rows, heads), jnp.float32)]
    partial, lse = _jt.triton_call(
        # Without scales the kernel never reads scale_ptr: any array fills the slot.
        q, k_arr, v_arr, logical_indices, block_table, token_to_req, gate,
        scales if p.scaled else token_to_req, rows, p.num_requests, kv.num_pages,
        kernel=_k.sparse_attention_split_kernel,
        out_shape=out_shape,
        grid=(rows, kv.num_kv_heads, splits),
        name="qsa_sparse_attention_split",
        num_warps=cfg.num_warps,
        num_stages=NUM_STAGES if num_stages is None else num_stages,
        W=p.selection_width, PAGE=kv.page_size, BTW=p.table_width, GROUP=p.group_size,
        HEADS=heads, D=d, Q_ROW_STRIDE=p.queries.row_stride, Q_HEAD_STRIDE=p.queries.head_stride,
        Q_OFFSET=p.queries.offset, BLOCK_M=_next_pow2(p.group_size), BLOCK_N=cfg.block_n,
        NUM_TILES=cfg.num_tiles, NUM_SPLITS=splits,
        PREFETCH=_prefetch(cfg) if prefetch is None else prefetch, SCALED=p.scaled, FP8=p.is_fp8,
        KV_BYTES=p.kv_format == "e4m3_bytes", **strides)
    if one_split:
        return partial
    block_d = min(d, merge_block_d or MERGE_BLOCK_D)
    return _jt.triton_call(
        partial, lse, gate, rows,
        kernel=_k.sparse_attention_merge_kernel,
        out_shape=jax.ShapeDtypeStruct((rows, heads, d), jnp.bfloat16),
        grid=(rows, heads, d // block_d),
        name="qsa_sparse_attention_merge",
        num_warps=MERGE_WARPS, num_stages=1,
        HEADS=heads, D=d, NUM_SPLITS=splits, BLOCK_S=_next_pow2(splits), BLOCK_D=block_d)
