"""The originals' config choice (``_select_config``) and warmup, over qsa_jax.

Mirrors vLLM 0.34.0: ``_select_config`` takes ``is_fp8``, and the warmup takes
a ``uint8`` ``kv_cache`` for an fp8 cache (vLLM allocates fp8 caches as bytes).
The 0.30.0 surface (``vllm_0_30``) calls the same functions with fp8 off.
"""

from __future__ import annotations


import torch

from qsa_jax.arg_specs import MAX_WARMUP_ROWS
from qsa_jax.config import first_rows
from qsa_jax.config import select_config as _qsa_select_config
from qsa_jax.ops.sparse_attention.base import GATE_DTYPES

from qsa_torch_shim import _direct, _eager, _jax_side



def _select_config(num_rows: int, num_kv_heads: int, use_prefill_config: bool,
                   num_columns: int, is_fp8: bool = False, *,
                   table: str | None = "vllm-0.34") -> tuple[int, int, int, int]:
    """(BLOCK_N, num_warps, num_tiles, num_splits), as the originals' table (``table``:
    the vLLM version's; None: the table the shim's own calls run, ``set_tiling_table``).

    qsa_jax's table is keyed on programs = rows * KV heads; it rejects the
    degenerate inputs (no columns, negative sizes) that the originals answer
    anyway, so those are answered here the way the originals do.
    """
    programs = max(int(num_rows) * int(num_kv_heads), 0)
    extra = {"is_fp8": bool(is_fp8), "table": table}
    flag = bool(use_prefill_config)
    if num_columns >= 1:
        return tuple(_qsa_select_config(programs, 1, flag, int(num_columns), **extra))
    block_n, warps, _, _ = _qsa_select_config(programs, 1, flag, 1, **extra)
    tiles = -(-int(num_columns) // block_n)  # <= 0: min(target splits, tiles) is tiles
    return block_n, warps, tiles, tiles


# The output gate dtypes the operator takes: qsa_jax's, as torch dtypes (the names agree).
_GATE_DTYPES = tuple(getattr(torch, d.name) for d in GATE_DTYPES)

_SHIM_TABLE = object()  # warmup_rows' default: the table the shim's JAX route runs


def warmup_rows(num_kv_heads: int, selection_width: int, max_rows: int = MAX_WARMUP_ROWS,
                is_fp8: bool = False, table=_SHIM_TABLE) -> list[int]:
    """One row count per config the shim's calls reach (the smallest that picks it), on
    ``table`` (default: the shim's, ``set_tiling_table``)."""
    if table is _SHIM_TABLE:
        table = _jax_side.TILING_TABLE[0]
    return sorted(set(first_rows(num_kv_heads, selection_width, max_rows, is_fp8=is_fp8,
                                 table=table).values()))


def fp8_call_dtype(device: torch.device) -> torch.dtype:
    """The dtype vLLM hands an fp8 cache over as: an e4m3 view from sm_89 on, the raw
    bytes below (and on CPU, where there is no capability to ask)."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9):
        return torch.float8_e4m3fn
    return torch.uint8


def warmup(kv_cache: torch.Tensor, block_table: torch.Tensor, *, num_query_heads: int,
           selection_width: int, rows=None, with_out: bool = True,
           implementation: str | None = None, fp8_tables: bool = True,
           summary_table: str = "vllm-0.34", gate_dtype: torch.dtype = torch.bfloat16):
    """Compile the shim's calls for this deployment; returns the originals' summary.

    The return value is the originals': ``(block_n, num_splits, num_warps)`` of
    every config reachable for rows 1..8192 and both ``use_prefill_config``
    (with 0.34's fp8 table for a uint8 ``kv_cache`` when ``fp8_tables``).

    On the JAX route, executables are specialised on the row count and the cache
    dtype too, so "every reachable config" does not mean "every call compiled";
    on the default CUDA route (triton-torch) Triton compiles per tiling and
    specialises the row count only as 1 / a multiple of 16 / other, but each new
    call signature (shapes) is planned on its first call. By default this runs one
    row count per config the route reaches (``warmup_rows`` on the table the route
    launches), both flags, with and without ``out``, for the cache dtype the calls
    will bring (an fp8 cache: ``fp8_call_dtype``; its scales are traced, so one
    compile serves every layer's scales); pass ``rows=`` (e.g. the CUDA-graph
    capture sizes) to prepare exactly the batch sizes you serve -- needed before
    capturing a CUDA graph, which must not see a signature's first call.
    Warm-up calls use all-padding rows (count 0), so they read no cache page.
    ``gate_dtype``: the dtype of the output gates the calls will bring (bf16 in vLLM;
    an fp16 or fp32 gate is another kernel signature on the triton-torch route, so a
    deployment with one must warm up with it before a CUDA-graph capture).
    """
    if gate_dtype not in _GATE_DTYPES:
        raise TypeError(f"gate_dtype must be torch.bfloat16, torch.float16 or torch.float32; got {gate_dtype!r}")
    head_dim = kv_cache.shape[-1] // 2
    table_fp8 = fp8_tables and kv_cache.dtype == torch.uint8  # 0.34's rule for the summary
    dev = kv_cache.device
    if kv_cache.dtype in (torch.uint8, torch.float8_e4m3fn):
        # Compile what the calls will bring (scales are traced, any value will do).
        kv_cache = kv_cache.view(fp8_call_dtype(dev))
        scales = (1.0, 1.0)
    else:
        scales = None
    k_cache, v_cache = kv_cache.transpose(1, 2).split(head_dim, dim=-1)
    num_kv_heads = k_cache.shape[2]
    profiles = sorted({_select_config(r, num_kv_heads, flag, selection_width, table_fp8, table=summary_table)
                       for r in range(1, 8193) for flag in (False, True)})
    implementation = _eager.sparse_route(implementation, dev)
    if rows is None:
        table = _jax_side.TILING_TABLE[0]
        if implementation == _direct.NAME:  # the tilings the Triton launch takes (bf16: 0.30.0's)
            table = _direct.effective_table(table, kv_cache.dtype)
        rows = warmup_rows(num_kv_heads, selection_width, is_fp8=scales is not None, table=table)
    for r in rows:
        q = torch.zeros((r, num_query_heads, head_dim), dtype=torch.bfloat16, device=dev)
        indices = torch.full((r, selection_width + 1), -1, dtype=torch.int32, device=dev)
        indices[:, -1] = 0
        ttr = torch.zeros((r,), dtype=torch.int32, device=dev)
        gate = q if gate_dtype == torch.bfloat16 else q.to(gate_dtype)
        for flag in (False, True):
            for use_out in ((False, True) if with_out else (False,)):
                out = torch.empty_like(q) if use_out else None
                _eager.sparse_paged_attention_impl(q, k_cache, v_cache, indices, block_table, ttr,
                                                   flag, out, gate, implementation, scales)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return tuple((bn, splits, warps) for bn, warps, _, splits in profiles)


def public_warmup(fp8_tables: bool, version: str):
    """The drop-in ``warmup_qsa_sparse_paged_attention`` of vLLM ``version``'s surface
    (same signature in 0.30.0 and 0.34.0; only 0.34.0 reads a uint8 cache as fp8)."""

    def warmup_qsa_sparse_paged_attention(
        kv_cache: torch.Tensor,
        block_table: torch.Tensor,
        *,
        num_query_heads: int,
        selection_width: int,
        rows=None,
        with_out: bool = True,
        implementation: str | None = None,
    ) -> tuple[tuple[int, int, int], ...]:
        return warmup(kv_cache, block_table, num_query_heads=num_query_heads,
                      selection_width=selection_width, rows=rows, with_out=with_out,
                      implementation=implementation, fp8_tables=fp8_tables,
                      summary_table="vllm-" + version.rsplit(".", 1)[0])

    warmup_qsa_sparse_paged_attention.__doc__ = (
        f"Compile the shim's calls for this deployment; returns vLLM {version}'s summary. "
        "See ``qsa_torch_shim._warmup.warmup`` for what is compiled.")
    return warmup_qsa_sparse_paged_attention
