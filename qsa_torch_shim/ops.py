"""Drop-in replacements for vLLM's ``vllm/models/qwen4_exp/nvidia/ops/qsa.py`` (0.34.0).

Same names, signatures, validation and exception types as vLLM 0.34.0's
originals (which accept every 0.30.0 call too); the computation runs in qsa_jax.
The only addition is a keyword-only ``implementation=`` ("triton", "pallas",
"xla" or None: qsa_jax's default for the backend -- except the sparse attention, where None
means ``_eager.default_route``'s choice; for the sparse attention also
"triton-torch": the jax-triton kernels launched by Triton on torch's stream,
``_direct``, the default for CUDA tensors (``_eager.default_route``), and "jax": the JAX route
with qsa_jax's choice). ``vllm_0_30`` is the same module with 0.30.0's signatures, for
``install()`` beside a vLLM of that line.

Each public function checks its arguments (``_checks``) and then runs the eager
path (``_eager``), or, while torch.compile traces, the torch custom op around
it (``_torch_ops``, registered on first use).
"""

from __future__ import annotations

import torch

from qsa_torch_shim import _call_cache, _checks, _direct, _eager, _warmup
from qsa_torch_shim._warmup import _select_config, warmup_rows

# Internal names kept for tools/profile_shim.py, which times these pieces one by one.
_kv_arrays = _eager._kv_arrays
_check_sparse = _checks.check_sparse

__all__ = [
    "qsa_compress_groups_with_ratio",
    "qsa_sparse_paged_attention",
    "qsa_store_cache_rows",
    "warmup_qsa_sparse_paged_attention",
]


def _traced_ops():
    """The custom ops while torch.compile traces, else None (eager calls skip the dispatcher)."""
    if not torch.compiler.is_compiling():
        return None
    from qsa_torch_shim import _torch_ops

    return _torch_ops


def sparse_paged_attention(q, k_cache, v_cache, logical_indices, block_table, token_to_req,
                           use_prefill_config, out, output_gate, implementation, scales):
    """After the checks: the compiled or the eager route (shared by both surfaces)."""
    traced = _traced_ops()
    if traced is not None:
        return traced.sparse_paged_attention(q, k_cache, v_cache, logical_indices, block_table,
                                             token_to_req, use_prefill_config, out, output_gate,
                                             implementation, scales)
    return _eager.sparse_paged_attention_impl(q, k_cache, v_cache, logical_indices, block_table,
                                              token_to_req, use_prefill_config, out, output_gate,
                                              implementation, scales)


def checked_sparse(q, k_cache, v_cache, logical_indices, block_table, token_to_req,
                   use_prefill_config, out, output_gate, implementation, k_scale, v_scale,
                   surface):
    """The originals' checks of ``surface``, then the call. An eager call whose arguments
    are the memory views and tensor objects of an earlier call skips both the checks
    and the import lookups (``_call_cache``: one key, one dict lookup). A call that names
    no implementation takes the process default (``set_sparse_implementation``), else
    ``_eager.default_route``'s (``_eager.sparse_route``)."""
    tensor = torch.Tensor
    if not (type(q) is tensor and type(k_cache) is tensor and type(v_cache) is tensor  # the per-call path:
            and type(logical_indices) is tensor and type(block_table) is tensor  # no generator, no isinstance
            and type(token_to_req) is tensor and type(output_gate) is tensor and (out is None or type(out) is tensor)):
        # Something else than plain tensors: raise as the originals do (their shape checks,
        # then AssertionError) before any routing reads a device or a pointer. (A tensor
        # subclass passes the checks and goes on.)
        _checks.check_sparse(q, k_cache, v_cache, logical_indices, block_table, token_to_req, out, output_gate,
                             k_scale, v_scale, surface=surface)
    implementation = _eager.sparse_route(implementation, q.device)
    if implementation == _direct.NAME:
        scales = _checks.check_sparse(q, k_cache, v_cache, logical_indices, block_table,
                                      token_to_req, out, output_gate, k_scale, v_scale, surface=surface)
        # Eager: launched here (_eager); under torch.compile: from the custom op's body.
        return sparse_paged_attention(q, k_cache, v_cache, logical_indices, block_table, token_to_req,
                                      use_prefill_config, out, output_gate, implementation, scales)
    if torch.compiler.is_compiling():
        key = None
    else:
        key = _call_cache.sparse_key(q, k_cache, v_cache, logical_indices, block_table,
                                     token_to_req, out, output_gate, k_scale, v_scale, surface)
    tensors = (q, k_cache, v_cache, logical_indices, block_table, token_to_req, output_gate)
    found = None if key is None else _call_cache.SPARSE_CALLS.get(key, tensors)
    if found is not None:
        return _eager.sparse_run(found[1], q, use_prefill_config, out, implementation)
    scales = _checks.check_sparse(q, k_cache, v_cache, logical_indices, block_table,
                                  token_to_req, out, output_gate, k_scale, v_scale,
                                  surface=surface)
    if key is None or not q.shape[0]:
        return sparse_paged_attention(q, k_cache, v_cache, logical_indices, block_table,
                                      token_to_req, use_prefill_config, out, output_gate,
                                      implementation, scales)
    output_gate.view_as(q)  # the originals' RuntimeError for a gate of another size
    args, checked = _eager.sparse_inputs(q, k_cache, v_cache, logical_indices, block_table,
                                         token_to_req, output_gate, scales)
    if checked is not None:
        _call_cache.SPARSE_CALLS.put(key, tensors, checked, scales, args)
    return _eager.sparse_run(args, q, use_prefill_config, out, implementation)


def qsa_sparse_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    logical_indices: torch.Tensor,
    block_table: torch.Tensor,
    token_to_req: torch.Tensor,
    use_prefill_config: bool,
    out: torch.Tensor | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    *,
    output_gate: torch.Tensor,
    implementation: str | None = None,
) -> torch.Tensor:
    """Sparse GQA over paged bf16 or fp8 K/V caches (drop-in for 0.34.0's, and 0.30.0's calls).

    ``k_cache``/``v_cache`` are vLLM's strided views of one ``kv_cache``
    ``[NB, Hk, P, 2D]`` (imported whole, zero-copy) or two compact
    ``[NB, P, Hk, D]`` caches, in bf16, ``float8_e4m3fn``, or ``uint8`` holding
    e4m3 bytes. An fp8 cache needs both host-float dequantisation scales
    (``k_scale`` multiplies the scores' D^-0.5, ``v_scale`` the output); a bf16
    cache ignores them, as 0.34.0 does. ``logical_indices`` is the packed
    ``[rows, W + 1]`` buffer (last column: the row's count). With ``out``, the
    result is written into it in place and ``out`` is returned.
    """
    return checked_sparse(q, k_cache, v_cache, logical_indices, block_table, token_to_req,
                          use_prefill_config, out, output_gate, implementation, k_scale, v_scale,
                          "0.34")


def qsa_store_cache_rows(cache: torch.Tensor, slot_mapping: torch.Tensor, rows: torch.Tensor, *,
                         implementation: str | None = None) -> None:
    """Store ``rows[i]`` at slot ``slot_mapping[i]`` of ``cache`` in place (drop-in).

    ``cache`` is ``[pages, page_size, 1, width]``; slots outside
    ``[0, pages * page_size)`` are skipped (int64 slots included: no silent
    narrowing). Unlike the original, CPU tensors are accepted too (they run on
    JAX's CPU backend).
    """
    if cache.device.type not in ("cuda", "cpu"):
        raise RuntimeError("qsa_store_cache_rows: the cache must be a CUDA (or CPU) tensor")
    rows = _checks.check_store(cache, slot_mapping, rows)
    traced = _traced_ops()
    if traced is not None:
        traced.store_cache_rows(cache, slot_mapping, rows, implementation)
        return
    _eager.store_cache_rows_impl(cache, slot_mapping, rows, implementation)


def qsa_compress_groups_with_ratio(
    raw_keys: torch.Tensor,
    raw_positions: torch.Tensor,
    compressor_state_cache: torch.Tensor,
    compressor_state_block_table: torch.Tensor,
    token_to_req: torch.Tensor,
    query_start_loc: torch.Tensor,
    logical_positions: torch.Tensor,
    compressed_slots: torch.Tensor,
    compress_ratio: int,
    rope_cache: torch.Tensor | None = None,
    *,
    implementation: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean-pool each row's finished group of indexer keys: ring members plus this step's raw rows (drop-in).

    Returns ``(pooled [rows, 1, head_size] in raw_keys' dtype, first_positions
    [rows, 3] int64)``. int64 positions stay exact over the whole int64 range.
    ``compressor_state_cache`` and ``rope_cache`` may be the two views of
    vLLM's packed ring rows (keys + 3 int64 positions per row): the packed
    buffer is imported whole. Unlike the original, CPU tensors are accepted.
    """
    if raw_keys.device.type not in ("cuda", "cpu"):
        raise RuntimeError("qsa_compress_groups_with_ratio: inputs must be CUDA (or CPU) tensors")
    _checks.check_compress(raw_keys, raw_positions, compressor_state_cache,
                           compressor_state_block_table, token_to_req, query_start_loc,
                           logical_positions, compressed_slots, compress_ratio, rope_cache)
    args = (raw_keys, raw_positions, compressor_state_cache, compressor_state_block_table,
            token_to_req, query_start_loc, logical_positions, compressed_slots,
            int(compress_ratio), rope_cache, implementation)
    traced = _traced_ops()
    if traced is not None:
        return traced.compress_groups(*args)
    return _eager.compress_groups_impl(*args)


# A uint8 kv_cache is an fp8 cache (0.34.0's rule).
warmup_qsa_sparse_paged_attention = _warmup.public_warmup(fp8_tables=True, version="0.34.0")
