"""Triton kernel of store_cache_rows (written for qsa-jax; launched by ``triton.py``).

One program per ``ROWS_PER_PROGRAM`` input rows. The cache arrives twice: as
input (unused: it only carries the aliasing) and as the output pointer, which
XLA makes the same buffer (donated) or a copy of the input (not donated), so
every slot this kernel does not write keeps its bytes.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def store_rows_kernel(
    cache_in_ptr, slots_ptr, rows_ptr,
    num_rows,
    cache_ptr,
    NUM_SLOTS: tl.constexpr,  # pages * page_size
    WIDTH: tl.constexpr,
    BLOCK_W: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
):
    row = tl.program_id(0) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    row_ok = row < num_rows
    slot = tl.load(slots_ptr + row, mask=row_ok, other=-1)
    ok = row_ok & (slot >= 0) & (slot < NUM_SLOTS)
    cols = tl.arange(0, BLOCK_W)
    mask = ok[:, None] & (cols < WIDTH)[None, :]
    values = tl.load(rows_ptr + row.to(tl.int64)[:, None] * WIDTH + cols[None, :], mask=mask)
    # [pages, P, 1, width] is contiguous: slot s starts at s * width (64-bit: may pass 2**31).
    dest = tl.maximum(slot, 0).to(tl.int64)[:, None] * WIDTH + cols[None, :]
    tl.store(cache_ptr + dest, values.to(cache_ptr.dtype.element_ty), mask=mask)
