"""Public entry point: ``sparse_attention``."""

from __future__ import annotations

import functools
from typing import Sequence

import jax

from qsa_jax._implementations import REGISTRIES
from qsa_jax.ops import _sharding
from qsa_jax.ops._memo import memoised
from qsa_jax.ops.sparse_attention.backward import differentiable
from qsa_jax.ops.sparse_attention.base import (
    SparseAttentionProblem, StridedQuery, check_sparse_attention_args, query_table)

_REGISTRY = REGISTRIES["sparse_attention"]


@memoised
def _plan(q, kv, logical_indices, block_table, token_to_req, output_gate, *,
          use_prefill_config, config, implementation) -> tuple[SparseAttentionProblem, str]:
    """Checks + config + implementation choice: pure functions of static metadata."""
    problem = check_sparse_attention_args(
        q, kv, logical_indices, block_table, token_to_req, output_gate,
        use_prefill_config=use_prefill_config, config=config)
    return problem, _REGISTRY.choose(implementation)


@functools.partial(jax.jit, static_argnames=("problem", "implementation"))
def _run(q, kv_arrays, logical_indices, block_table, token_to_req, output_gate, *,
         problem: SparseAttentionProblem, implementation: str):
    # A custom_vjp around the implementation's forward (gradients: backward.py); on a
    # mesh its forward runs one call per shard (qsa_jax/ops/_sharding.py).
    return differentiable(problem, implementation, q, kv_arrays, logical_indices, block_table,
                          token_to_req, output_gate)


def sparse_attention(
    q: jax.Array | StridedQuery,
    kv,
    logical_indices: jax.Array,
    block_table: jax.Array,
    token_to_req: jax.Array,
    output_gate: jax.Array,
    *,
    use_prefill_config: bool = False,
    config: Sequence[int] | None = None,
    implementation: str | None = None,
) -> jax.Array:
    """Gated sparse GQA over a paged bf16 K/V cache (QSA ``qsa_sparse_paged_attention``).

    Args:
      q: [R, H, D] bf16 queries, or a ``StridedQuery``: queries read in place from a
        larger array (e.g. the q columns of a fused qkv projection), without a copy.
      kv: the fused cache ``[NB, Hk, P, 2D]`` (vLLM's ``kv_cache``; K = first D
        channels, V = last D) or a pair ``(k_cache, v_cache)`` of ``[NB, P, Hk, D]``.
      logical_indices: [R, W+1] int32; columns ``< W`` are logical token ids
        (-1 = padding), column W is the row's valid count.
      block_table: [NR, BTW] int32 logical page -> physical page, per request.
      token_to_req: [R] int32 request of each row (out of range -> row outputs 0).
      output_gate: [R, H, D] bf16; the output is multiplied by sigmoid(gate).
      use_prefill_config: picks the prefill tiling when R * Hk > 2048.
      config: explicit ``(block_n, num_warps, num_tiles, num_splits)``
        overriding ``select_config``.
      implementation: "pallas", "triton", "xla" or None (first available).

    Returns:
      [R, H, D] bf16.
    """
    problem, name = _plan(q, kv, logical_indices, block_table, token_to_req, output_gate,
                          use_prefill_config=bool(use_prefill_config),
                          config=None if config is None else tuple(config),
                          implementation=implementation)
    kv_arrays = tuple(kv) if isinstance(kv, (tuple, list)) else (kv,)
    arrays = (query_table(q), kv_arrays, logical_indices, block_table, token_to_req, output_gate)
    _sharding.check_sparse_attention(problem, *arrays)
    return _run(*arrays, problem=problem, implementation=name)
