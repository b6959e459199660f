"""Triton kernel of compress_groups_with_ratio (written for qsa-jax; launched by ``triton.py``).

One program per row. The row's group holds positions ``e - C + 1 .. e``
(oldest first); a member at or after the chunk start is one of this step's
raw rows, an older one sits in the request's ring at slot ``pos mod S``.
Members are summed in fp32 in that order and divided by C once, so the result
is bit-identical to the XLA reference and the originals.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def compress_groups_kernel(
    raw_keys_ptr, raw_pos_ptr, ring_ptr, rope_ptr, table_ptr, req_ptr, qsl_ptr, end_ptr, slot_ptr,
    num_rows, num_requests, num_blocks,
    pooled_ptr, first_ptr,
    DK: tl.constexpr,
    BLOCK_D: tl.constexpr,
    RATIO: tl.constexpr,
    RING: tl.constexpr,
    TABLE_WIDTH: tl.constexpr,
    WITH_ROPE: tl.constexpr,
):
    row = tl.program_id(0)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < DK
    req = tl.load(req_ptr + row)
    end = tl.load(end_ptr + row)
    req_ok = (req >= 0) & (req < num_requests)
    safe_req = tl.minimum(tl.maximum(req, 0), num_requests - 1)
    row_start = tl.load(qsl_ptr + safe_req, mask=req_ok, other=0)
    row_end = tl.load(qsl_ptr + safe_req + 1, mask=req_ok, other=0)
    chunk_start = end - (row - row_start)
    block = tl.load(table_ptr + safe_req * TABLE_WIDTH, mask=req_ok, other=-1)
    block_ok = (block >= 0) & (block < num_blocks)
    ring_base = tl.maximum(block, 0).to(tl.int64) * (RING * DK)
    valid = (req_ok & (row >= row_start) & (row < row_end) & (end >= RATIO - 1)
             & (tl.load(slot_ptr + row) >= 0))

    acc = tl.zeros((BLOCK_D,), tl.float32)
    for k in tl.static_range(RATIO):
        pos = end - (RATIO - 1 - k)
        from_raw = pos >= chunk_start
        raw_row = row_start + (pos - chunk_start)
        raw_ok = valid & from_raw & (raw_row >= 0) & (raw_row < num_rows)
        raw = tl.load(raw_keys_ptr + tl.maximum(raw_row, 0).to(tl.int64) * DK + dims,
                      mask=raw_ok & dim_ok, other=0.0).to(tl.float32)
        ring_ok = valid & ~from_raw & block_ok
        ring = tl.load(ring_ptr + ring_base + (tl.maximum(pos, 0) % RING) * DK + dims,
                       mask=ring_ok & dim_ok, other=0.0).to(tl.float32)
        acc += tl.where(from_raw, raw, ring)
    tl.store(pooled_ptr + row.to(tl.int64) * DK + dims, (acc / RATIO).to(pooled_ptr.dtype.element_ty),
             mask=dim_ok)

    three = tl.arange(0, 4)
    three_ok = three < 3
    first = end - RATIO + 1
    if WITH_ROPE:
        first_from_raw = first >= chunk_start
        raw_row = row_start + (first - chunk_start)
        raw_ok = valid & first_from_raw & (raw_row >= 0) & (raw_row < num_rows)
        from_raw = tl.load(raw_pos_ptr + tl.maximum(raw_row, 0).to(tl.int64) * 3 + three,
                           mask=raw_ok & three_ok, other=0)
        ring_ok = valid & ~first_from_raw & block_ok
        from_ring = tl.load(rope_ptr + tl.maximum(block, 0).to(tl.int64) * (RING * 3)
                            + (tl.maximum(first, 0) % RING) * 3 + three,
                            mask=ring_ok & three_ok, other=0)
        positions = tl.where(first_from_raw, from_raw.to(first_ptr.dtype.element_ty),
                             from_ring.to(first_ptr.dtype.element_ty))
    else:
        positions = tl.zeros((4,), first_ptr.dtype.element_ty) + tl.where(valid, first, 0).to(
            first_ptr.dtype.element_ty)
    tl.store(first_ptr + row.to(tl.int64) * 3 + three, positions, mask=three_ok)
