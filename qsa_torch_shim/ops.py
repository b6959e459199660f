"""Drop-in replacements for vLLM 0.30.0's ``vllm/models/qwen4_exp/nvidia/ops/qsa.py``.

Same names, signatures, validation and exception types as the originals; the
computation runs in qsa_jax. Conversion rules: ``_interop``. The only
addition is a keyword-only ``implementation=`` ("triton", "pallas", "xla" or
None: qsa_jax's default for the backend).
"""

from __future__ import annotations

import torch

from qsa_jax.config import select_config as _qsa_select_config

from qsa_torch_shim import _interop as I
from qsa_torch_shim import _jax_side as J

__all__ = [
    "qsa_compress_groups_with_ratio",
    "qsa_sparse_paged_attention",
    "qsa_store_cache_rows",
    "warmup_qsa_sparse_paged_attention",
]


def _select_config(num_rows: int, num_kv_heads: int, use_prefill_config: bool,
                   num_columns: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, num_warps, num_tiles, num_splits), as the originals' table.

    qsa_jax's table is keyed on programs = rows * KV heads; it rejects the
    degenerate inputs (no columns, negative sizes) that the originals answer
    anyway, so those are answered here the way the originals do.
    """
    programs = max(int(num_rows) * int(num_kv_heads), 0)
    if num_columns >= 1:
        return tuple(_qsa_select_config(programs, 1, bool(use_prefill_config), int(num_columns)))
    block_n, warps, _, _ = _qsa_select_config(programs, 1, bool(use_prefill_config), 1)
    tiles = -(-int(num_columns) // block_n)  # <= 0: min(target splits, tiles) is tiles
    return block_n, warps, tiles, tiles


def _fail(cond_bad: bool, exc, msg: str):
    if cond_bad:
        raise exc(msg)


def _check_sparse(q, k_cache, v_cache, logical_indices, block_table, token_to_req, out,
                  output_gate):
    """The originals' checks, in their order, with their exception types."""
    if q.ndim != 3 or k_cache.ndim != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"qsa_sparse_paged_attention: bad q/k_cache/v_cache shapes: q {tuple(q.shape)} must be "
            f"[rows, heads, head_dim], k_cache {tuple(k_cache.shape)} [pages, page_size, "
            f"kv_heads, head_dim], v_cache {tuple(v_cache.shape)} equal to k_cache")
    rows = q.shape[0]
    if logical_indices.ndim != 2 or logical_indices.shape[0] != rows:
        raise ValueError(f"qsa_sparse_paged_attention: logical_indices needs exactly one row per q row; logical_indices "
                         f"{tuple(logical_indices.shape)}, q rows {rows}")
    if token_to_req.shape != (rows,) or block_table.ndim != 2:
        raise ValueError(f"qsa_sparse_paged_attention: bad metadata shapes: token_to_req "
                         f"{tuple(token_to_req.shape)} must be ({rows},), block_table "
                         f"{tuple(block_table.shape)} 2-D")
    if not all(k_cache.shape[:3]) or not all(block_table.shape):
        raise ValueError(f"qsa_sparse_paged_attention: empty cache or block table: k_cache "
                         f"{tuple(k_cache.shape)}, block_table {tuple(block_table.shape)}")
    if logical_indices.shape[1] < 2:
        raise ValueError("qsa_sparse_paged_attention: logical_indices must hold at least one token column and the count column; "
                         f"logical_indices has {logical_indices.shape[1]}")
    if q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"qsa_sparse_paged_attention: q heads / head_dim do not fit the cache (query heads must be a multiple of KV heads): q "
                         f"{tuple(q.shape)}, k_cache {tuple(k_cache.shape)}")
    d = q.shape[2]
    if not (d >= 16 and d & (d - 1) == 0):
        raise AssertionError(f"head_dim must be a power of two >= 16; got {d}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype == torch.bfloat16):
        raise AssertionError(f"q/k_cache/v_cache must be bfloat16; got {q.dtype}, "
                             f"{k_cache.dtype}, {v_cache.dtype}")
    if not (logical_indices.dtype == block_table.dtype == torch.int32):
        raise AssertionError(f"logical_indices/block_table must be int32; got "
                             f"{logical_indices.dtype}, {block_table.dtype}")
    if token_to_req.dtype != torch.int32:
        raise AssertionError(f"token_to_req must be int32; got {token_to_req.dtype}")
    dev = q.device
    if not (dev == k_cache.device == v_cache.device == logical_indices.device
            == block_table.device == token_to_req.device):
        raise AssertionError("all QSA sparse attention tensors must be on q's device")
    if not (q.stride(2) == k_cache.stride(3) == v_cache.stride(3) == 1):
        raise AssertionError("q, k_cache and v_cache need unit stride in head_dim")
    if not (logical_indices.stride(1) == block_table.stride(1) == 1):
        raise AssertionError("logical_indices and block_table need unit column stride")
    if token_to_req.stride(0) != 1:
        raise AssertionError("token_to_req needs unit stride")
    if out is not None:
        if out.shape != q.shape:
            raise ValueError(f"qsa_sparse_paged_attention: out must have q's shape: out {tuple(out.shape)}, "
                             f"q {tuple(q.shape)}")
        if not (out.dtype == q.dtype and out.device == q.device):
            raise AssertionError("out must have q's dtype and device")
        if out.stride(2) != 1:
            raise AssertionError("out needs unit stride in head_dim")
    if not output_gate.is_contiguous():
        raise AssertionError("output_gate must be contiguous")


def _kv_arrays(k_cache: torch.Tensor, v_cache: torch.Tensor):
    """(JAX arrays for qsa_jax's ``kv``): the fused buffer when k/v are its views.

    Both are cached imports (``_interop.PersistentImports``): the KV cache is
    the same buffer on every call.
    """
    if I.fused_kv_shape(k_cache, v_cache) is not None and I.is_aligned(k_cache):
        return (I.PERSISTENT.get((k_cache, v_cache), k_cache,
                                 lambda: I.fused_kv_base(k_cache, v_cache)),)
    return (I.import_arg(k_cache, "k_cache"), I.import_arg(v_cache, "v_cache"))


def _write_back(result, dest: torch.Tensor, what: str) -> torch.Tensor:
    """Order torch after JAX's write into ``dest``; copy if it did not land in place."""
    alias = I.to_torch(result)  # stream handshake: torch's current stream waits for JAX
    if alias.data_ptr() != dest.data_ptr():
        # JAX's CPU backend ignores donation (measured, jax 0.11.2): copy back, and say so
        # once per process there; on a GPU it would be a bug worth hearing about each time.
        global _CPU_COPY_WARNED
        if dest.is_cuda or not _CPU_COPY_WARNED:
            _CPU_COPY_WARNED = _CPU_COPY_WARNED or not dest.is_cuda
            I.warn_copy(what, "was not updated in place by JAX (buffer donation not honoured; "
                        "JAX's CPU backend never honours it)", stacklevel=4)
        dest.copy_(alias.view(dest.shape))
    return dest


_CPU_COPY_WARNED = False


def sparse_paged_attention_impl(q, k_cache, v_cache, logical_indices, block_table, token_to_req,
                                use_prefill_config, out, output_gate, implementation=None):
    """The eager path after validation (also the body of the torch custom op)."""
    gate = output_gate.view_as(q)
    if not q.shape[0]:
        return torch.empty_like(q) if out is None else out
    kv = _kv_arrays(k_cache, v_cache)
    # Every input is a cached import (the same tensor objects recur each step);
    # the stream order comes from one fresh import per call: the donated ``out``,
    # or the fence (see ``_interop.PersistentImports``).
    args = (I.import_query(q), kv,
            I.import_arg(logical_indices, "logical_indices", large=False),
            I.import_arg(block_table, "block_table", large=False),
            I.import_arg(token_to_req, "token_to_req", large=False),
            I.import_arg(gate, "output_gate"))
    flag = bool(use_prefill_config)
    if out is not None and I.is_importable(out):
        result = J.sparse_into(I.to_jax(out), *args, use_prefill_config=flag,
                               implementation=implementation)
        return _write_back(result, out, "out")
    result = I.to_torch(J.sparse_new(I.stream_fence(q.device), *args, use_prefill_config=flag,
                                     implementation=implementation))
    if out is None:
        return result
    I.warn_copy("out", "is not compact/aligned, so JAX cannot write into it")
    out.copy_(result)
    return out


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
    """Sparse GQA over paged bf16 K/V caches (drop-in for the original).

    ``k_cache``/``v_cache`` are vLLM's strided views of one ``kv_cache``
    ``[NB, Hk, P, 2D]`` (imported whole, zero-copy) or two compact
    ``[NB, P, Hk, D]`` caches. ``logical_indices`` is the packed
    ``[rows, W + 1]`` buffer (last column: the row's count). With ``out``,
    the result is written into it in place and ``out`` is returned.
    """
    _check_sparse(q, k_cache, v_cache, logical_indices, block_table, token_to_req, out,
                  output_gate)
    if torch.compiler.is_compiling():
        from qsa_torch_shim import _torch_ops

        return _torch_ops.sparse_paged_attention(q, k_cache, v_cache, logical_indices, block_table,
                                                 token_to_req, use_prefill_config, out,
                                                 output_gate, implementation)
    return sparse_paged_attention_impl(q, k_cache, v_cache, logical_indices, block_table,
                                       token_to_req, use_prefill_config, out, output_gate,
                                       implementation)


# --- store -------------------------------------------------------------------------------------

def _check_store(cache, slot_mapping, rows):
    if cache.ndim != 4 or cache.shape[2] != 1:
        raise ValueError(f"qsa_store_cache_rows: cache must be 4-D [pages, page_size, 1, width]; got {tuple(cache.shape)}")
    if not all(cache.shape):
        raise ValueError(f"qsa_store_cache_rows: cache has a zero-sized dimension: {tuple(cache.shape)}")
    if rows.ndim == 3:
        if rows.shape[1] != 1:
            raise ValueError(f"qsa_store_cache_rows: 3-D rows need exactly one head; got {tuple(rows.shape)}")
        rows = rows[:, 0]
    if rows.shape != (slot_mapping.numel(), cache.shape[3]):
        raise ValueError(f"qsa_store_cache_rows: rows must be [len(slot_mapping), width]: rows "
                         f"{tuple(rows.shape)}, slots {slot_mapping.numel()}, width {cache.shape[3]}")
    return rows


def store_cache_rows_impl(cache, slot_mapping, rows, implementation=None) -> None:
    if not rows.shape[0]:
        return
    slots, slot_words = I.int_words(slot_mapping.reshape(-1), "slot_mapping")
    rows_j = I.import_arg(rows, "rows")  # cached; the donated cache's fresh import is the fence
    if I.is_importable(cache):
        result = J.store_into(I.to_jax(cache), slots, rows_j, slots_are_words=slot_words,
                              implementation=implementation)
        _write_back(result, cache, "cache")
        return
    I.warn_copy("cache", "is not compact/aligned, so JAX cannot update it in place")
    work = cache.contiguous().clone()
    result = J.store_into(I.to_jax(work), slots, rows_j, slots_are_words=slot_words,
                          implementation=implementation)
    cache.copy_(I.to_torch(result))


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
    rows = _check_store(cache, slot_mapping, rows)
    if torch.compiler.is_compiling():
        from qsa_torch_shim import _torch_ops

        _torch_ops.store_cache_rows(cache, slot_mapping, rows, implementation)
        return
    store_cache_rows_impl(cache, slot_mapping, rows, implementation)


# --- compress --------------------------------------------------------------------------------

def _check_compress(raw_keys, raw_positions, compressor_state_cache, compressor_state_block_table,
                    token_to_req, query_start_loc, logical_positions, compressed_slots,
                    compress_ratio, rope_cache):
    rows = token_to_req.numel()
    if compress_ratio <= 0:
        raise ValueError(f"qsa_compress_groups_with_ratio: compress_ratio must be >= 1; got {compress_ratio}")
    if raw_keys.ndim != 3 or raw_keys.shape[:2] != (rows, 1):
        raise ValueError(f"qsa_compress_groups_with_ratio: raw_keys must be [rows={rows}, 1, head_size]; got {tuple(raw_keys.shape)}")
    if raw_positions.shape != (rows, 1, 3) or raw_positions.dtype != torch.int64:
        raise ValueError(f"qsa_compress_groups_with_ratio: raw_positions must be int64 [rows={rows}, 1, 3]; got "
                         f"{tuple(raw_positions.shape)} {raw_positions.dtype}")
    if logical_positions.shape != (rows,) or compressed_slots.shape != (rows,):
        raise ValueError(f"qsa_compress_groups_with_ratio: logical_positions and compressed_slots need one entry per row ({rows}): "
                         f"logical_positions {tuple(logical_positions.shape)}, compressed_slots "
                         f"{tuple(compressed_slots.shape)}")
    cs = compressor_state_cache
    if cs.ndim != 4 or cs.shape[2] != 1:
        raise ValueError(f"qsa_compress_groups_with_ratio: compressor_state_cache must be [blocks, ring, 1, head_size]; got {tuple(cs.shape)}")
    if cs.shape[1] < compress_ratio or cs.shape[3] != raw_keys.shape[2] or cs.dtype != raw_keys.dtype:
        raise ValueError("qsa_compress_groups_with_ratio: compressor_state_cache ring, width or dtype does not fit raw_keys / compress_ratio: "
                         f"cache {tuple(cs.shape)} {cs.dtype}, raw_keys {tuple(raw_keys.shape)} "
                         f"{raw_keys.dtype}, compress_ratio {compress_ratio}")
    bt = compressor_state_block_table
    if bt.ndim != 2 or bt.shape[1] < 1:
        raise ValueError(f"qsa_compress_groups_with_ratio: compressor_state_block_table must be 2-D with at least one column; "
                         f"got {tuple(bt.shape)}")
    if query_start_loc.ndim != 1 or query_start_loc.shape[0] < 2:
        raise ValueError(f"qsa_compress_groups_with_ratio: query_start_loc must be 1-D with the end offset (>= 2 entries); got "
                         f"{tuple(query_start_loc.shape)}")
    if bt.shape[0] < query_start_loc.shape[0] - 1:
        raise ValueError("qsa_compress_groups_with_ratio: compressor_state_block_table has fewer rows than requests")
    if rope_cache is not None and (
            rope_cache.ndim != 4 or rope_cache.shape[:3] != cs.shape[:3]
            or rope_cache.shape[3] != 3 or rope_cache.dtype != torch.int64):
        raise ValueError(f"qsa_compress_groups_with_ratio: rope_cache must be int64 [blocks, ring, 1, 3] matching the ring: "
                         f"{tuple(rope_cache.shape)} {rope_cache.dtype}")
    if rows and (not all(cs.shape) or not all(bt.shape)):
        raise ValueError("qsa_compress_groups_with_ratio: compressor_state_cache and its block table must be nonempty")


def _packed_ring(cache: torch.Tensor, rope: torch.Tensor):
    """(storage rows [Bs,S,1,width], rope element offset) when ``cache`` and ``rope``
    are views of one packed ring (keys then 3 int64 positions per row), else None."""
    if cache.stride(3) != 1 or rope.stride(3) != 1:
        return None
    if cache.untyped_storage().data_ptr() != rope.untyped_storage().data_ptr():
        return None
    es = cache.element_size()
    bs, s, _, dk = cache.shape
    width = cache.stride(1)
    if es not in (1, 2, 4) or width < dk or (bs > 1 and cache.stride(0) != s * width):
        return None
    if rope.stride(1) * 8 != width * es or (bs > 1 and rope.stride(0) * 8 != s * width * es):
        return None
    offset_bytes = rope.storage_offset() * 8 - cache.storage_offset() * es
    if offset_bytes < dk * es or offset_bytes % es or offset_bytes + 24 > width * es:
        return None
    try:
        base = I.alias(cache, (bs, s, 1, width), (s * width, width, width, 1))
    except RuntimeError:
        return None
    return base, offset_bytes // es


def compress_groups_impl(raw_keys, raw_positions, compressor_state_cache,
                         compressor_state_block_table, token_to_req, query_start_loc,
                         logical_positions, compressed_slots, compress_ratio, rope_cache=None,
                         implementation=None):
    rows = token_to_req.numel()
    if not rows:
        return (torch.empty((0, 1, raw_keys.shape[2]), dtype=raw_keys.dtype, device=raw_keys.device),
                torch.empty((0, 3), dtype=torch.int64, device=raw_keys.device))
    ring_layout = None
    rope_words = None
    packed = None if rope_cache is None else _packed_ring(compressor_state_cache, rope_cache)
    if packed is not None and I.is_importable(packed[0]):
        base, offset = packed
        ring = I.PERSISTENT.get((base,), compressor_state_cache, lambda: base)
        ring_layout, rope_mode = (compressor_state_cache.shape[3], offset), "packed"
    else:
        cs = compressor_state_cache
        ring = I.import_arg(cs, "compressor_state_cache")
        rope_mode = "none"
        if rope_cache is not None:
            rope_words, _ = I.int_words(rope_cache, "rope_cache")
            rope_mode = "separate"
    positions, _ = I.int_words(raw_positions, "raw_positions")
    bt, bt_w = I.int_words(compressor_state_block_table, "compressor_state_block_table")
    ttr, ttr_w = I.int_words(token_to_req.reshape(-1), "token_to_req")
    qsl, qsl_w = I.int_words(query_start_loc, "query_start_loc")
    lp, lp_w = I.int_words(logical_positions, "logical_positions")
    slots, cs_w = I.int_words(compressed_slots, "compressed_slots")
    pooled, first = J.compress(
        I.stream_fence(raw_keys.device), I.import_arg(raw_keys, "raw_keys"), positions, ring, rope_words, bt, ttr, qsl,
        lp, slots, ring_layout=ring_layout, rope_mode=rope_mode,
        words=(bt_w, ttr_w, qsl_w, lp_w, cs_w), compress_ratio=int(compress_ratio),
        implementation=implementation)
    return I.to_torch(pooled), I.words_to_int64_tensor(first)


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
    _check_compress(raw_keys, raw_positions, compressor_state_cache, compressor_state_block_table,
                    token_to_req, query_start_loc, logical_positions, compressed_slots,
                    compress_ratio, rope_cache)
    if torch.compiler.is_compiling():
        from qsa_torch_shim import _torch_ops

        return _torch_ops.compress_groups(raw_keys, raw_positions, compressor_state_cache,
                                          compressor_state_block_table, token_to_req,
                                          query_start_loc, logical_positions, compressed_slots,
                                          int(compress_ratio), rope_cache, implementation)
    return compress_groups_impl(raw_keys, raw_positions, compressor_state_cache,
                                compressor_state_block_table, token_to_req, query_start_loc,
                                logical_positions, compressed_slots, compress_ratio, rope_cache,
                                implementation)


# --- warmup ------------------------------------------------------------------------------------

def warmup_rows(num_kv_heads: int, selection_width: int, max_rows: int = 8192) -> list[int]:
    """One row count per config ``_select_config`` reaches (the smallest that picks it)."""
    seen, rows = set(), []
    for r in range(1, max_rows + 1):
        for flag in (False, True):
            cfg = _select_config(r, num_kv_heads, flag, selection_width)
            if cfg not in seen:
                seen.add(cfg)
                rows.append(r)
    return sorted(set(rows))


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
    """Compile the shim's calls for this deployment; returns the originals' summary.

    The return value is the originals': ``(block_n, num_splits, num_warps)`` of
    every config reachable for rows 1..8192 and both ``use_prefill_config``.

    Unlike Triton's, JAX executables are specialised on the row count too, so
    "every reachable config" does not mean "every call compiled". By default
    this compiles one row count per reachable config (``warmup_rows``), both
    flags, with and without ``out``; pass ``rows=`` (e.g. the CUDA-graph
    capture sizes) to compile exactly the batch sizes you serve. Warm-up calls
    use all-padding rows (count 0), so they read no cache page.
    """
    head_dim = kv_cache.shape[-1] // 2
    k_cache, v_cache = kv_cache.transpose(1, 2).split(head_dim, dim=-1)
    num_kv_heads = k_cache.shape[2]
    profiles = sorted({_select_config(r, num_kv_heads, flag, selection_width)
                       for r in range(1, 8193) for flag in (False, True)})
    if rows is None:
        rows = warmup_rows(num_kv_heads, selection_width)
    dev = kv_cache.device
    for r in rows:
        q = torch.zeros((r, num_query_heads, head_dim), dtype=torch.bfloat16, device=dev)
        indices = torch.full((r, selection_width + 1), -1, dtype=torch.int32, device=dev)
        indices[:, -1] = 0
        ttr = torch.zeros((r,), dtype=torch.int32, device=dev)
        for flag in (False, True):
            for use_out in ((False, True) if with_out else (False,)):
                out = torch.empty_like(q) if use_out else None
                qsa_sparse_paged_attention(q, k_cache, v_cache, indices, block_table, ttr, flag,
                                           out, output_gate=q, implementation=implementation)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return tuple((bn, splits, warps) for bn, warps, _, splits in profiles)
