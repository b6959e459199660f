"""Triton implementation of store_cache_rows (``jax_triton.triton_call``, in place).

The cache is aliased to the kernel's output (``input_output_aliases``): when
the caller donates it (``store_cache_rows(..., donate=True)`` or a donation in
their own jit) the rows are written into the same buffer; otherwise XLA hands
the kernel a copy. Slots outside ``[0, pages * P)`` are skipped.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from qsa_jax.config import next_pow2
from qsa_jax.ops import _triton_support
from qsa_jax.ops.store_cache_rows.base import StoreProblem

_jt, _k, _IMPORT_ERROR = _triton_support.load_kernels("qsa_jax.ops.store_cache_rows.triton_kernels")

ROWS_PER_PROGRAM = 4
NUM_WARPS = 4


def why_not() -> str | None:
    return _triton_support.why_not(_IMPORT_ERROR)


def run(p: StoreProblem, cache, slot_mapping, rows):
    if p.num_rows == 0:
        return cache
    slots = slot_mapping.reshape(-1)
    if slots.dtype != jnp.int32:  # int64 slots (x64 on): compare in int32 range after clipping
        slots = jnp.clip(slots, -1, p.num_pages * p.page_size).astype(jnp.int32)
    values = rows.reshape(p.num_rows, p.width)
    return _jt.triton_call(
        cache, slots, values, p.num_rows,
        kernel=_k.store_rows_kernel,
        out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
        input_output_aliases={0: 0},
        grid=(-(-p.num_rows // ROWS_PER_PROGRAM),),
        name="qsa_store_cache_rows",
        num_warps=NUM_WARPS, num_stages=1,
        NUM_SLOTS=p.num_pages * p.page_size, WIDTH=p.width,
        BLOCK_W=next_pow2(p.width), ROWS_PER_PROGRAM=ROWS_PER_PROGRAM)
