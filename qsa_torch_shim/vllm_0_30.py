"""The shim with vLLM 0.30.0's surface, for ``install()`` beside a vLLM before 0.31.

0.30.0's ``qsa_sparse_paged_attention`` has no scales (``out`` is its last
positional parameter) and takes bf16 caches only, its ``_select_config`` has
no ``is_fp8``, and its warmup knows no fp8 cache. Everything else (compress,
store, the warmup's signature) is the same as 0.34.0's, so it is re-exported.
"""

from __future__ import annotations

import torch

from qsa_torch_shim import _warmup
from qsa_torch_shim import ops as _ops
from qsa_torch_shim._warmup import _select_config as _select_config_034
from qsa_torch_shim.ops import qsa_compress_groups_with_ratio, qsa_store_cache_rows, warmup_rows

__all__ = [
    "qsa_compress_groups_with_ratio",
    "qsa_sparse_paged_attention",
    "qsa_store_cache_rows",
    "warmup_qsa_sparse_paged_attention",
    "warmup_rows",
]


def _select_config(num_rows: int, num_kv_heads: int, use_prefill_config: bool,
                   num_columns: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, num_warps, num_tiles, num_splits), as 0.30.0's table (no fp8 argument)."""
    return _select_config_034(num_rows, num_kv_heads, use_prefill_config, num_columns, table="vllm-0.30")


def qsa_sparse_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    logical_indices: torch.Tensor,
    block_table: torch.Tensor,
    token_to_req: torch.Tensor,
    use_prefill_config: bool,
    out: torch.Tensor | None = None,
    *,
    output_gate: torch.Tensor,
    implementation: str | None = None,
) -> torch.Tensor:
    """Sparse GQA over paged bf16 K/V caches (drop-in for 0.30.0's); see ``ops``."""
    return _ops.checked_sparse(q, k_cache, v_cache, logical_indices, block_table, token_to_req,
                               use_prefill_config, out, output_gate, implementation, None, None,
                               "0.30")


warmup_qsa_sparse_paged_attention = _warmup.public_warmup(fp8_tables=False, version="0.30.0")
