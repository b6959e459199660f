"""Pallas implementation of store_cache_rows (Triton lowering on GPU).

One program per row, writing in place: the cache is aliased input->output
(``input_output_aliases``), so with a donated cache only the targeted slots are
written and every other slot keeps its bits (without donation XLA copies the
cache first, as it must, to return a new array). A row whose slot is outside
[0, pages*P) is skipped with ``pl.when`` -- nothing is stored at all.

The row width (140 for the indexer ring) is not a power of two: padded lanes
read and write the last real column again (same value, harmless duplicate
store) instead of needing a masked scatter.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from qsa_jax.ops import _vma
from qsa_jax.ops._pallas_support import interpret, next_pow2, pl, plgpu, why_not  # noqa: F401
from qsa_jax.ops.store_cache_rows.base import StoreProblem


def _kernel(slots_ref, rows_ref, cache_in_ref, cache_ref, *, p: StoreProblem, block_w: int):
    del cache_in_ref  # the same buffer as cache_ref (aliased)
    i = pl.program_id(0)
    slot = slots_ref[i]
    valid = (slot >= 0) & (slot < p.num_pages * p.page_size)

    @pl.when(valid)
    def _():
        cols = jnp.minimum(jax.lax.broadcasted_iota(jnp.int32, (block_w,), 0), p.width - 1)
        values = rows_ref[i, cols].astype(cache_ref.dtype)
        cache_ref[slot // p.page_size, slot % p.page_size, 0, cols] = values


def run(p: StoreProblem, cache, slot_mapping, rows):
    if p.num_rows == 0:
        return cache
    slots = slot_mapping.reshape(-1).astype(jnp.int32)
    rows2 = rows.reshape(p.num_rows, p.width)
    return _vma.pallas_call(
        functools.partial(_kernel, p=p, block_w=next_pow2(p.width)),
        out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
        grid=(p.num_rows,),
        in_specs=[pl.no_block_spec] * 3,
        out_specs=pl.no_block_spec,
        input_output_aliases={2: 0},
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret(),
        name="qsa_store_cache_rows",
    )(slots, rows2, cache)

