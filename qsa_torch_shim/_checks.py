"""The originals' argument checks, in their order, with their exception types.

``check_sparse`` follows vLLM 0.34.0's ``qsa_sparse_paged_attention`` (fp8
caches with host-float scales) or, for the 0.30.0 surface, 0.30.0's (bf16
only); both versions check shapes with ``ValueError`` and dtypes, devices and
strides with ``assert``, so the same bad input raises the same type here. The
messages are the shim's own and name the argument. Checks the originals lack
(scale values; see ``check_sparse``) come after all of theirs, so they can only
fire where the originals would have launched.
"""

from __future__ import annotations

import numbers

import torch

FP8_CACHE_DTYPES = (torch.float8_e4m3fn, torch.uint8)  # uint8: e4m3 bytes (below sm_89)


def _shapes(q, k_cache, v_cache, logical_indices, block_table, token_to_req):
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


def _dtypes_030(q, k_cache, v_cache):
    if not (q.dtype == k_cache.dtype == v_cache.dtype == torch.bfloat16):
        raise AssertionError(f"q/k_cache/v_cache must be bfloat16; got {q.dtype}, "
                             f"{k_cache.dtype}, {v_cache.dtype}")


def _dtypes_034(q, k_cache, v_cache, k_scale, v_scale):
    """0.34's dtype rules; returns the scales as floats for an fp8 cache, else None
    (0.34 ignores the scales of a bf16 cache)."""
    if q.dtype != torch.bfloat16:
        raise AssertionError(f"q must be bfloat16; got {q.dtype}")
    if k_cache.dtype != v_cache.dtype:
        raise AssertionError(f"k_cache and v_cache must have one dtype; got {k_cache.dtype} and "
                             f"{v_cache.dtype}")
    if k_cache.dtype == torch.bfloat16:
        return None
    # Any other cache dtype is taken for fp8 first (scales required, converted with
    # float() as 0.34 does, so a non-number raises what float() raises), then checked.
    if k_scale is None or v_scale is None:
        raise AssertionError(f"an fp8 ({k_cache.dtype}) cache needs both k_scale and v_scale; got "
                             f"k_scale={k_scale!r}, v_scale={v_scale!r}")
    scales = float(k_scale), float(v_scale)
    if k_cache.dtype not in FP8_CACHE_DTYPES:
        raise AssertionError(f"k_cache/v_cache must be bfloat16, float8_e4m3fn or uint8 (e4m3 "
                             f"bytes); got {k_cache.dtype}")
    return scales


def _placement(q, k_cache, v_cache, logical_indices, block_table, token_to_req, out, output_gate):
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
    # out and output_gate: the originals read out.shape, then output_gate.is_contiguous(), so
    # an argument without that attribute (a list, None for the gate) fails there with an
    # AttributeError, which this names; one with it (a NumPy array) fails the asserts below.
    if out is not None and not hasattr(out, "shape"):
        raise AttributeError(f"qsa_sparse_paged_attention: out must be a torch.Tensor or None; got "
                             f"{type(out).__module__}.{type(out).__name__}")
    if out is not None:
        if out.shape != q.shape:
            raise ValueError(f"qsa_sparse_paged_attention: out must have q's shape: out {tuple(out.shape)}, "
                             f"q {tuple(q.shape)}")
        if not (out.dtype == q.dtype and out.device == q.device):
            raise AssertionError("out must have q's dtype and device")
        if out.stride(2) != 1:
            raise AssertionError("out needs unit stride in head_dim")
    if not hasattr(output_gate, "is_contiguous"):
        raise AttributeError(f"qsa_sparse_paged_attention: output_gate must be a torch.Tensor; got "
                             f"{type(output_gate).__module__}.{type(output_gate).__name__}")
    if not output_gate.is_contiguous():
        raise AssertionError("output_gate must be contiguous")


def check_scale(name: str, value: float, head_dim: int) -> None:
    """A dequantisation scale must be a positive finite number: 0.34 folds it into the
    softmax and output scales unchecked (NaN, inf, 0 or a negative would silently
    poison or flip every output). So must the fp32 the kernels receive, and for k_scale the
    score multiplier derived from it (qsa_jax's ``check_host_scale``)."""
    from qsa_jax.ops.sparse_attention.base import check_host_scale

    try:
        check_host_scale(name, value, head_dim if name == "k_scale" else None)
    except ValueError as exc:
        raise ValueError(f"qsa_sparse_paged_attention: {exc}") from None


def check_sparse(q, k_cache, v_cache, logical_indices, block_table, token_to_req, out,
                 output_gate, k_scale=None, v_scale=None, *, surface: str = "0.34"):
    """Raise as the originals of ``surface`` ("0.34" or "0.30") would on bad input.

    Returns ``(k_scale, v_scale)`` as floats for an fp8 cache, None for bf16.
    """
    _shapes(q, k_cache, v_cache, logical_indices, block_table, token_to_req)
    # The originals' dtype asserts come next and fail for anything but a torch tensor (a NumPy
    # array's dtype is never torch's): AssertionError, as they raise it, naming the argument.
    # (out and output_gate are read later, by attribute: _placement.)
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("logical_indices", logical_indices),
                    ("block_table", block_table), ("token_to_req", token_to_req)):
        if not isinstance(x, torch.Tensor):
            raise AssertionError(f"qsa_sparse_paged_attention: {name} must be a torch.Tensor; got "
                                 f"{type(x).__module__}.{type(x).__name__}")
    if surface == "0.30":
        _dtypes_030(q, k_cache, v_cache)
        scales = None
    else:
        scales = _dtypes_034(q, k_cache, v_cache, k_scale, v_scale)
    _placement(q, k_cache, v_cache, logical_indices, block_table, token_to_req, out, output_gate)
    if scales is not None:
        check_scale("k_scale", scales[0], q.shape[-1])
        check_scale("v_scale", scales[1], q.shape[-1])
    return scales


def check_store(cache, slot_mapping, rows):
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



def check_compress(raw_keys, raw_positions, compressor_state_cache, compressor_state_block_table,
                    token_to_req, query_start_loc, logical_positions, compressed_slots,
                    compress_ratio, rope_cache):
    rows = token_to_req.numel()
    if not isinstance(compress_ratio, numbers.Integral) or isinstance(compress_ratio, bool):
        # The originals' kernel takes it as a loop bound (a float fails there); int() would
        # silently pool groups of floor(C). Any integral type (a NumPy int) is exact.
        raise TypeError(f"qsa_compress_groups_with_ratio: compress_ratio must be an int; got {compress_ratio!r}")
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

