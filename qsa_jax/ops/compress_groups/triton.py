"""Triton implementation of compress_groups_with_ratio (``jax_triton.triton_call``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from qsa_jax.config import next_pow2
from qsa_jax.ops import _triton_support
from qsa_jax.ops.compress_groups.base import CompressProblem

_jt, _k, _IMPORT_ERROR = _triton_support.load_kernels("qsa_jax.ops.compress_groups.triton_kernels")

NUM_WARPS = 1  # Dk = 128 bf16: one warp moves a row in one 8-byte access per lane


def why_not() -> str | None:
    return _triton_support.why_not(_IMPORT_ERROR)


def run(p: CompressProblem, raw_keys, raw_positions, ring, block_table, token_to_req,
        query_start_loc, logical_positions, compressed_slots, rope_cache):
    rows = p.num_rows
    pos_dtype = raw_positions.dtype
    if rows == 0:
        return jnp.zeros((0, 1, p.head_dim), raw_keys.dtype), jnp.zeros((0, 3), pos_dtype)
    i32 = lambda x: x if x.dtype == jnp.int32 else x.astype(jnp.int32)  # noqa: E731
    rope = rope_cache if p.with_rope else raw_positions  # placeholder pointer, never read
    return _jt.triton_call(
        raw_keys, raw_positions, ring, rope, i32(block_table), i32(token_to_req),
        i32(query_start_loc), i32(logical_positions), i32(compressed_slots),
        rows, p.num_requests, p.num_ring_blocks,
        kernel=_k.compress_groups_kernel,
        out_shape=[jax.ShapeDtypeStruct((rows, 1, p.head_dim), raw_keys.dtype),
                   jax.ShapeDtypeStruct((rows, 3), pos_dtype)],
        grid=(rows,),
        name="qsa_compress_groups",
        num_warps=NUM_WARPS, num_stages=1,
        DK=p.head_dim, BLOCK_D=next_pow2(p.head_dim), RATIO=p.compress_ratio,
        RING=p.ring_size, TABLE_WIDTH=int(block_table.shape[1]), WITH_ROPE=p.with_rope)
