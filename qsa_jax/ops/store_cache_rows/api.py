"""Public entry point: ``store_cache_rows``."""

from __future__ import annotations

import functools

import jax

from qsa_jax._implementations import REGISTRIES
from qsa_jax.ops import _sharding
from qsa_jax.ops._arrays import index_int32
from qsa_jax.ops._memo import memoised
from qsa_jax.ops.store_cache_rows.base import StoreProblem, check_store_args

_REGISTRY = REGISTRIES["store_cache_rows"]


@memoised
def _plan(cache, slot_mapping, rows, *, implementation) -> tuple[StoreProblem, str]:
    """Checks + implementation choice: pure functions of static metadata."""
    return check_store_args(cache, slot_mapping, rows), _REGISTRY.choose(implementation)


@functools.partial(jax.jit, static_argnames=("problem", "implementation"), donate_argnums=(0,))
def _run_donated(cache, slot_mapping, rows, *, problem: StoreProblem, implementation: str):
    return _run.__wrapped__(cache, slot_mapping, rows, problem=problem, implementation=implementation)


@functools.partial(jax.jit, static_argnames=("problem", "implementation"))
def _run(cache, slot_mapping, rows, *, problem: StoreProblem, implementation: str):
    # On a mesh: one call per shard (qsa_jax/ops/_sharding.py); otherwise the plain call.
    return _sharding.store_cache_rows(_REGISTRY.run(implementation), problem, cache, slot_mapping, rows)


def store_cache_rows(cache, slot_mapping, rows, *, donate: bool = False,
                     implementation: str | None = None):
    """Write ``rows[i]`` to slot ``slot_mapping[i]`` of a paged cache; return the new cache.

    ``cache`` is [pages, P, 1, width]; slot s is ``cache[s // P, s % P, 0]``.
    Slots outside [0, pages * P) are skipped; every slot not written stays
    bit-identical. Rows are converted to the cache's dtype. With
    ``donate=True`` the cache buffer is donated and updated in place (the
    input array must not be used afterwards); inside your own ``jax.jit``,
    donate the cache there instead. If two rows target the same slot, which
    one lands is unspecified (as in the originals).
    """
    problem, name = _plan(cache, slot_mapping, rows, implementation=implementation)
    slot_mapping = index_int32(slot_mapping)  # vLLM's int64: saturated, never wrapped into range
    _sharding.check_store_cache_rows(cache, slot_mapping, rows)
    run = _run_donated if donate else _run
    return run(cache, slot_mapping, rows, problem=problem, implementation=name)
