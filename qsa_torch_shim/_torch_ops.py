"""torch.library custom ops, so the shim's calls can sit inside torch.compile'd code.

The public functions in ``ops`` route through these only while torch.compile
traces (``torch.compiler.is_compiling()``); eager calls skip the dispatcher.
Each op has a fake (meta) implementation for tracing. The ops' bodies are the
eager path (``_eager``); this module never imports ``ops`` (no import cycle).

With ``implementation="triton-torch"`` (the sparse attention's default on CUDA) the op's
body launches the Triton kernels on torch's stream (``_eager`` hands it to ``_direct``).
Every other route launches JAX's executables on JAX's stream: those cannot be captured in
a torch CUDA graph (``torch.cuda.graph``). The ops are not marked cudagraph-safe, so
inductor's cudagraph trees skip graphs containing them; compile with ``mode="default"`` or
``"max-autotune-no-cudagraphs"``.
"""

from __future__ import annotations

from typing import Optional

import torch

from qsa_torch_shim import _eager

Tensor = torch.Tensor


@torch.library.custom_op("qsa_shim::sparse_paged_attention", mutates_args=())
def _sparse(q: Tensor, k_cache: Tensor, v_cache: Tensor, logical_indices: Tensor,
            block_table: Tensor, token_to_req: Tensor, use_prefill_config: bool,
            output_gate: Tensor, implementation: Optional[str] = None,
            k_scale: Optional[float] = None, v_scale: Optional[float] = None) -> Tensor:
    return _eager.sparse_paged_attention_impl(q, k_cache, v_cache, logical_indices, block_table,
                                              token_to_req, use_prefill_config, None, output_gate,
                                              implementation, _scales(k_scale, v_scale))


@_sparse.register_fake
def _(q, k_cache, v_cache, logical_indices, block_table, token_to_req, use_prefill_config,
      output_gate, implementation=None, k_scale=None, v_scale=None):
    return torch.empty_like(q)


@torch.library.custom_op("qsa_shim::sparse_paged_attention_out", mutates_args=("out",))
def _sparse_out(q: Tensor, k_cache: Tensor, v_cache: Tensor, logical_indices: Tensor,
                block_table: Tensor, token_to_req: Tensor, use_prefill_config: bool, out: Tensor,
                output_gate: Tensor, implementation: Optional[str] = None,
                k_scale: Optional[float] = None, v_scale: Optional[float] = None) -> None:
    _eager.sparse_paged_attention_impl(q, k_cache, v_cache, logical_indices, block_table,
                                       token_to_req, use_prefill_config, out, output_gate,
                                       implementation, _scales(k_scale, v_scale))


@_sparse_out.register_fake
def _(q, k_cache, v_cache, logical_indices, block_table, token_to_req, use_prefill_config, out,
      output_gate, implementation=None, k_scale=None, v_scale=None):
    return None


def _scales(k_scale, v_scale):
    return None if k_scale is None else (k_scale, v_scale)


def sparse_paged_attention(q, k_cache, v_cache, logical_indices, block_table, token_to_req,
                           use_prefill_config, out, output_gate, implementation, scales):
    k_scale, v_scale = (None, None) if scales is None else scales
    if out is None:
        return _sparse(q, k_cache, v_cache, logical_indices, block_table, token_to_req,
                       bool(use_prefill_config), output_gate, implementation, k_scale, v_scale)
    _sparse_out(q, k_cache, v_cache, logical_indices, block_table, token_to_req,
                bool(use_prefill_config), out, output_gate, implementation, k_scale, v_scale)
    return out


@torch.library.custom_op("qsa_shim::store_cache_rows", mutates_args=("cache",))
def _store(cache: Tensor, slot_mapping: Tensor, rows: Tensor,
           implementation: Optional[str] = None) -> None:
    _eager.store_cache_rows_impl(cache, slot_mapping, rows, implementation)


@_store.register_fake
def _(cache, slot_mapping, rows, implementation=None):
    return None


def store_cache_rows(cache, slot_mapping, rows, implementation):
    _store(cache, slot_mapping, rows, implementation)


@torch.library.custom_op("qsa_shim::compress_groups_with_ratio", mutates_args=())
def _compress(raw_keys: Tensor, raw_positions: Tensor, compressor_state_cache: Tensor,
              compressor_state_block_table: Tensor, token_to_req: Tensor, query_start_loc: Tensor,
              logical_positions: Tensor, compressed_slots: Tensor, compress_ratio: int,
              rope_cache: Optional[Tensor] = None,
              implementation: Optional[str] = None) -> tuple[Tensor, Tensor]:
    pooled, first = _eager.compress_groups_impl(
        raw_keys, raw_positions, compressor_state_cache, compressor_state_block_table,
        token_to_req, query_start_loc, logical_positions, compressed_slots, compress_ratio,
        rope_cache, implementation)
    return pooled, first


@_compress.register_fake
def _(raw_keys, raw_positions, compressor_state_cache, compressor_state_block_table, token_to_req,
      query_start_loc, logical_positions, compressed_slots, compress_ratio, rope_cache=None,
      implementation=None):
    rows = token_to_req.numel()
    return (raw_keys.new_empty((rows, 1, raw_keys.shape[2])),
            raw_keys.new_empty((rows, 3), dtype=torch.int64))


def compress_groups(*args):
    return _compress(*args)
