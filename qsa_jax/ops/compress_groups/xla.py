"""Plain-XLA implementation of compress_groups_with_ratio."""

from __future__ import annotations

import jax.numpy as jnp

from qsa_jax.ops.compress_groups.base import CompressProblem, group_mean, row_metadata


def run(p: CompressProblem, raw_keys, raw_positions, ring, block_table,
                        token_to_req, query_start_loc, logical_positions, compressed_slots,
                        rope_cache):
    rows, c, s = p.num_rows, p.compress_ratio, p.ring_size
    pos_dtype = raw_positions.dtype
    if rows == 0:
        return (jnp.zeros((0, 1, p.head_dim), raw_keys.dtype), jnp.zeros((0, 3), pos_dtype))
    valid, start, chunk_start, e, block, block_ok = row_metadata(
        p, token_to_req, query_start_loc, logical_positions, compressed_slots, block_table)

    # Members oldest first: positions e-C+1 .. e. A member at or after the
    # chunk start is one of this step's raw rows; older ones sit in the ring.
    acc = jnp.zeros((rows, p.head_dim), jnp.float32)
    for k in range(c):
        pos = e - (c - 1 - k)
        from_raw = pos >= chunk_start
        raw_row = jnp.clip(start + pos - chunk_start, 0, rows - 1)
        raw = raw_keys[raw_row, 0].astype(jnp.float32)
        ring_val = ring[block, jnp.mod(pos, s), 0].astype(jnp.float32)
        use_ring = valid & ~from_raw & block_ok
        member = jnp.where((valid & from_raw)[:, None], raw, jnp.where(use_ring[:, None], ring_val, 0.0))
        acc = acc + member
    pooled = group_mean(acc, c).astype(raw_keys.dtype)[:, None, :]

    first = e - c + 1
    if p.with_rope:
        first_from_raw = first >= chunk_start
        raw_row = jnp.clip(start + first - chunk_start, 0, rows - 1)
        from_raw = raw_positions[raw_row, 0, :]
        from_ring = rope_cache[block, jnp.mod(first, s), 0, :].astype(pos_dtype)
        positions = jnp.where(first_from_raw[:, None], from_raw,
                              jnp.where(block_ok[:, None], from_ring, 0))
        positions = jnp.where(valid[:, None], positions, 0)
    else:
        positions = jnp.broadcast_to(jnp.where(valid, first, 0)[:, None], (rows, 3))
    return pooled, positions.astype(pos_dtype)


def why_not() -> str | None:
    return None  # plain XLA runs on every backend
