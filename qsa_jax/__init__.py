"""qsa-jax: the QSA sparse-attention operators of Qwen3.8-Flash-Next in JAX.

Public API:

- ``sparse_attention``: gated sparse GQA over a paged K/V cache (``StridedQuery``:
  its q read in place from a wider array, e.g. a fused qkv projection; ``kv_scales`` /
  ``KVScales``: vLLM 0.34.0's fp8 scales prepared on the host, traceable).
- ``compress_groups_with_ratio``: mean-pool groups of indexer keys (ring + raw rows).
- ``store_cache_rows``: scatter rows into a paged cache (in place when donated).
- ``select_config`` / ``SparseAttentionConfig``: the static tiling table;
  ``reachable_configs``: every tiling it can pick for 1..max_rows rows.
- ``PallasLaunch`` / ``TritonLaunch``: launch knobs (warps, stages, merge) passed as
  ``sparse_attention(..., launch=)``.
- ``available_implementations``: which implementations can run an operator here.
- ``warmup`` / ``enable_persistent_cache``: compile ahead of serving, keep it on disk.
- ``repeat_kv_heads`` / ``MeshLayoutError``: running on a device mesh (README, "On a device mesh").

Each operator takes ``implementation=`` ("pallas", "triton", "xla" or None).
"""

from qsa_jax.ops.compress_groups import compress_groups_with_ratio
from qsa_jax._implementations import available_implementations
from qsa_jax.config import PallasLaunch, SparseAttentionConfig, TritonLaunch, reachable_configs, select_config
from qsa_jax.ops._sharding import MeshLayoutError, repeat_kv_heads
from qsa_jax.ops.sparse_attention import KVScales, StridedQuery, kv_scales, sparse_attention
from qsa_jax.ops.store_cache_rows import store_cache_rows
from qsa_jax.warmup import enable_persistent_cache, warmup

__all__ = [
    "KVScales",
    "MeshLayoutError",
    "PallasLaunch",
    "SparseAttentionConfig",
    "StridedQuery",
    "TritonLaunch",
    "available_implementations",
    "compress_groups_with_ratio",
    "enable_persistent_cache",
    "kv_scales",
    "reachable_configs",
    "repeat_kv_heads",
    "select_config",
    "sparse_attention",
    "store_cache_rows",
    "warmup",
]
