"""Public entry point: ``compress_groups_with_ratio``."""

from __future__ import annotations

import functools

import jax
import numpy as np

from qsa_jax._implementations import REGISTRIES
from qsa_jax.ops import _sharding
from qsa_jax.ops._arrays import index_int32
from qsa_jax.ops._memo import memoised
from qsa_jax.ops.compress_groups import int64_words
from qsa_jax.ops.compress_groups.base import CompressProblem, check_compress_args

_REGISTRY = REGISTRIES["compress_groups_with_ratio"]


@memoised
def _plan(*arrays, compress_ratio, implementation) -> tuple[CompressProblem, str]:
    """Checks + implementation choice: pure functions of static metadata."""
    *tensors, rope_cache = arrays
    return check_compress_args(*tensors, compress_ratio, rope_cache), _REGISTRY.choose(implementation)


@functools.partial(jax.jit, static_argnames=("problem", "implementation"))
def _run(*arrays, problem: CompressProblem, implementation: str):
    # On a mesh: one call per shard (qsa_jax/ops/_sharding.py); otherwise the plain call.
    return _sharding.compress_groups(_REGISTRY.run(implementation), problem, *arrays)


def compress_groups_with_ratio(
    raw_keys, raw_positions, compressor_state_cache, compressor_state_block_table,
    token_to_req, query_start_loc, logical_positions, compressed_slots,
    compress_ratio: int, rope_cache=None, *, implementation: str | None = None,
):
    """Mean-pool each row's group of ``compress_ratio`` indexer keys.

    The group of row r ends at position e = logical_positions[r]; members
    older than this step's chunk come from the request's ring
    ``compressor_state_cache[block, pos % S, 0]`` (block = column 0 of its
    ``compressor_state_block_table`` row), newer ones from ``raw_keys``.

    Returns ``(pooled [R, 1, Dk] in raw_keys' dtype, first_positions [R, 3])``:
    pooled = bf16(fp32 sum / C); first_positions are the rope positions of the
    first member (from ``raw_positions`` or ``rope_cache``; without
    ``rope_cache``, e - C + 1 three times), in ``raw_positions``' dtype. Invalid
    rows give zeros in both.
    """
    problem, name = _plan(raw_keys, raw_positions, compressor_state_cache,
                          compressor_state_block_table, token_to_req, query_start_loc,
                          logical_positions, compressed_slots, rope_cache,
                          compress_ratio=compress_ratio, implementation=implementation)
    # vLLM's int64 indices: saturated to int32, never wrapped into range (positions keep their
    # dtype). int64 end positions are not indices: an int32 stand-in keeps each one's validity
    # and ring slot, and the exact e - C + 1 is put back below (int64_words).
    exact = None
    if np.dtype(logical_positions.dtype) == np.int64 and not isinstance(logical_positions, jax.ShapeDtypeStruct):
        logical_positions, exact = int64_words.int64_end_positions(
            logical_positions, compressor_state_cache.shape[1], compress_ratio)
    arrays = (raw_keys, raw_positions, compressor_state_cache, index_int32(compressor_state_block_table),
              index_int32(token_to_req), index_int32(query_start_loc), index_int32(logical_positions),
              index_int32(compressed_slots), rope_cache)
    _sharding.check_compress_groups(problem, *arrays)
    pooled, first = _run(*arrays, problem=problem, implementation=name)
    if exact is not None and rope_cache is None:
        first = int64_words.exact_first_positions(first, *exact)
    return pooled, first
