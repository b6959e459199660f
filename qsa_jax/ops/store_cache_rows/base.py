"""store_cache_rows: argument checks (static shapes)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from qsa_jax.ops._arrays import require_arrays


@dataclasses.dataclass(frozen=True)
class StoreProblem:
    num_rows: int
    num_pages: int
    page_size: int
    width: int


def check_store_args(cache, slot_mapping, rows) -> StoreProblem:
    require_arrays(cache=cache, slot_mapping=slot_mapping, rows=rows)
    cs = tuple(int(s) for s in np.shape(cache))
    if len(cs) != 4 or cs[2] != 1:
        raise ValueError(f"cache must be [pages, page_size, 1, width]; got shape {cs}")
    if not all(cs):
        raise ValueError(f"cache dimensions must be nonzero; got shape {cs}")
    rs = tuple(int(s) for s in np.shape(rows))
    if len(rs) == 3:
        if rs[1] != 1:
            raise ValueError(f"rows given as [n, heads, width] must have one head; got shape {rs}")
        rs = (rs[0], rs[2])
    n = int(np.size(slot_mapping))
    if rs != (n, cs[3]):
        raise ValueError(
            f"rows must be [slots={n}, width={cs[3]}] (or [n, 1, width]); got shape {tuple(np.shape(rows))}")
    if not jnp.issubdtype(slot_mapping.dtype, jnp.integer):
        raise TypeError(f"slot_mapping must be an integer array; got {slot_mapping.dtype}")
    if cs[0] * cs[1] >= 2**31:
        raise ValueError("cache has 2**31 or more slots; slot numbers would overflow int32")
    return StoreProblem(n, cs[0], cs[1], cs[3])
