"""Triton implementation of sparse paged attention, launched with ``jax_triton.triton_call``.

The kernels (``triton_kernels.py``) read the cache where it lies: the fused
vLLM buffer ``[NB, Hk, P, 2D]`` (K = channels [0, D), V = [D, 2D)) or the split
pair ``[NB, P, Hk, D]``; the wrapper only passes strides, never copies or
transposes the cache. Same arithmetic as ``xla.py`` and the originals.

Launch configuration: ``config.triton_tiling`` (``problem.config``, the
originals' table or the caller's ``config=``; when the caller did not give one
and the GPU is a Hopper, ``config.tune_config_for_hopper`` may change the split
count of the smallest batches) and ``config.triton_launch`` for warps, stages,
prefetch and the merge (``launch=TritonLaunch(...)`` overrides; see
notes/triton.md for the numbers).

Compile cost: jax-triton compiles the Triton kernels while JAX lowers the jitted
function (outside JAX's persistent compilation cache), once per kernel
specialisation per process. Batch-size-dependent values are runtime scalars,
so a deployment compiles one kernel per distinct tiling, not per batch size.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp

from qsa_jax.config import next_pow2, triton_launch, triton_tiling
from qsa_jax.ops import _triton_support
from qsa_jax.ops.sparse_attention.base import SparseAttentionProblem

# Optional dependency: the package must import without jax-triton.
_jt, _k, _IMPORT_ERROR = _triton_support.load_kernels("qsa_jax.ops.sparse_attention.triton_kernels")


def why_not() -> str | None:
    """None when the Triton kernels can run here, else the reason."""
    return _triton_support.why_not(_IMPORT_ERROR)


def run(problem: SparseAttentionProblem, q, kv_arrays, logical_indices, block_table,
        token_to_req, output_gate, scales=None):
    """Traceable under jit."""
    p = problem
    cfg = triton_tiling(p)
    launch = triton_launch(p)
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
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        W=p.selection_width, PAGE=kv.page_size, BTW=p.table_width, GROUP=p.group_size,
        HEADS=heads, D=d, Q_ROW_STRIDE=p.queries.row_stride, Q_HEAD_STRIDE=p.queries.head_stride,
        Q_OFFSET=p.queries.offset, BLOCK_M=next_pow2(p.group_size), BLOCK_N=cfg.block_n,
        NUM_TILES=cfg.num_tiles, NUM_SPLITS=splits,
        PREFETCH=launch.prefetch, SCALED=p.scaled, FP8=p.is_fp8,
        KV_BYTES=p.kv_format == "e4m3_bytes", **strides)
    if one_split:
        return partial
    block_d = launch.merge_block_d
    return _jt.triton_call(
        partial, lse, gate, rows,
        kernel=_k.sparse_attention_merge_kernel,
        out_shape=jax.ShapeDtypeStruct((rows, heads, d), jnp.bfloat16),
        grid=(rows, heads, d // block_d),
        name="qsa_sparse_attention_merge",
        num_warps=launch.merge_warps, num_stages=1,
        HEADS=heads, D=d, NUM_SPLITS=splits, BLOCK_S=next_pow2(splits), BLOCK_D=block_d)
