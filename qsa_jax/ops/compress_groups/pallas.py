"""Pallas implementation of compress_groups_with_ratio (Triton lowering on GPU).

One program per row. Each program reads its row's metadata as scalars, sums
the C group members in fp32 (oldest first, exactly like the originals, so the
pooled keys are bit-identical), divides by C and stores one row.

In-kernel arrays must have power-of-two sizes while Dk (and the 3 rope
positions) need not be: the padded lanes read and write a *clamped* column
(the last real one), so they load, compute and store exactly that column's
value again. Duplicate stores of identical values are harmless and no masked
gather/scatter is needed (those do not run in interpret mode).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from qsa_jax.ops import _vma
from qsa_jax.ops._pallas_support import interpret, next_pow2, pl, plgpu, why_not  # noqa: F401
from qsa_jax.ops.compress_groups.base import CompressProblem, group_mean


def _kernel(keys_ref, pos_ref, ring_ref, table_ref, req_ref, qsl_ref, lpos_ref, slot_ref, *rest,
            p: CompressProblem, block_d: int):
    if p.with_rope:
        rope_ref, pooled_ref, first_ref = rest
    else:
        pooled_ref, first_ref = rest
    c, s = p.compress_ratio, p.ring_size
    r = pl.program_id(0)
    cols = jnp.minimum(jax.lax.broadcasted_iota(jnp.int32, (block_d,), 0), p.head_dim - 1)
    pcols = jnp.minimum(jax.lax.broadcasted_iota(jnp.int32, (4,), 0), 2)

    request = req_ref[r].astype(jnp.int32)
    request_ok = (request >= 0) & (request < p.num_requests)
    safe_request = jnp.clip(request, 0, p.num_requests - 1)
    start = jnp.where(request_ok, qsl_ref[safe_request], 0).astype(jnp.int32)
    end = jnp.where(request_ok, qsl_ref[safe_request + 1], 0).astype(jnp.int32)
    e = lpos_ref[r].astype(jnp.int32)
    chunk_start = e - (r - start)
    block = jnp.where(request_ok, table_ref[safe_request, 0], -1).astype(jnp.int32)
    block_ok = (block >= 0) & (block < p.num_ring_blocks)
    safe_block = jnp.where(block_ok, block, 0)
    valid = (request_ok & (r >= start) & (r < end) & (e >= c - 1) & (slot_ref[r] >= 0))

    # Members oldest first: positions e-C+1 .. e. From this step's raw rows
    # when at/after the chunk start, else from the request's ring. Reads of
    # rows that will not be used are clamped in range and discarded by where.
    acc = jnp.zeros((block_d,), jnp.float32)
    for k in range(c):
        pos = e - (c - 1 - k)
        from_raw = pos >= chunk_start
        raw_row = jnp.clip(start + pos - chunk_start, 0, p.num_rows - 1)
        raw = keys_ref[raw_row, 0, cols].astype(jnp.float32)
        ring = ring_ref[safe_block, jnp.remainder(jnp.maximum(pos, 0), s), 0, cols].astype(jnp.float32)
        member = jnp.where(valid & from_raw, raw, jnp.where(valid & ~from_raw & block_ok, ring, 0.0))
        acc = acc + member
    # On the GPU Triton divides, as the originals' kernel does; the interpreter runs the
    # kernel as XLA, which would multiply by the reciprocal instead (group_mean).
    pooled_ref[r, 0, cols] = (group_mean(acc, c) if interpret() else acc / c).astype(pooled_ref.dtype)

    first = e - c + 1
    if p.with_rope:
        first_from_raw = first >= chunk_start
        raw_row = jnp.clip(start + first - chunk_start, 0, p.num_rows - 1)
        from_raw = pos_ref[raw_row, 0, pcols]
        from_ring = rope_ref[safe_block, jnp.remainder(jnp.maximum(first, 0), s), 0, pcols]
        positions = jnp.where(first_from_raw, from_raw.astype(first_ref.dtype),
                              jnp.where(block_ok, from_ring.astype(first_ref.dtype), 0))
        positions = jnp.where(valid, positions, 0)
    else:
        positions = jnp.broadcast_to(jnp.where(valid, first, 0), (4,))
    first_ref[r, pcols] = positions.astype(first_ref.dtype)


def run(p: CompressProblem, raw_keys, raw_positions, ring, block_table, token_to_req,
        query_start_loc, logical_positions, compressed_slots, rope_cache):
    rows = p.num_rows
    pos_dtype = raw_positions.dtype
    if rows == 0:
        return (jnp.zeros((0, 1, p.head_dim), raw_keys.dtype), jnp.zeros((0, 3), pos_dtype))
    args = [raw_keys, raw_positions, ring, block_table, token_to_req, query_start_loc,
            logical_positions, compressed_slots]
    if p.with_rope:
        args.append(rope_cache)
    return _vma.pallas_call(
        functools.partial(_kernel, p=p, block_d=next_pow2(p.head_dim)),
        out_shape=(jax.ShapeDtypeStruct((rows, 1, p.head_dim), raw_keys.dtype),
                   jax.ShapeDtypeStruct((rows, 3), pos_dtype)),
        grid=(rows,),
        in_specs=[pl.no_block_spec] * len(args),
        out_specs=(pl.no_block_spec, pl.no_block_spec),
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret(),
        name="qsa_compress_groups",
    )(*args)

