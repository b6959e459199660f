"""Independent float64 NumPy oracle of the three QSA operators.

Written from docs/spec.md §3 alone (no kernel code was consulted), so that it can be
checked against the golden files of the originals and used as a second opinion on every
JAX implementation. Everything is computed in float64; the only roundings modelled are the
ones the specification makes observable:

* the bf16 rounding of the softmax probabilities before the P.V product (the normaliser
  keeps the unrounded values),
* the bf16 rounding of the attention output before the gate multiply,
* the bf16 store of the gated output / of the pooled key.

All bf16 roundings are round-to-nearest-even, done by ``ml_dtypes.bfloat16`` straight from
float64 (the GPU rounds an fp32 value; the difference is a double-rounding corner case far
below the 1e-3 agreement bar).

Public functions:
    sparse_attention_oracle(...)  -> float64 [R, H, D] (bf16-representable values)
    compress_groups_oracle(...)   -> (float64 [R, 1, Dk] bf16-representable, int64 [R, 3])
    store_cache_rows_oracle(...)  -> a new cache array, same dtype as the input cache
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

__all__ = [
    "bf16_round",
    "sparse_attention_oracle",
    "compress_groups_oracle",
    "store_cache_rows_oracle",
]

BF16 = ml_dtypes.bfloat16

# The kernel's running max starts here and invalid scores are set to it; using the same
# finite sentinel (not -inf) keeps exp2(m - m_new) well defined for empty tiles.
NEG_SENTINEL = -1e20

LOG2E = math.log2(math.e)


def bf16_round(x) -> np.ndarray:
    """Round to the nearest bf16 (ties to even) and return the value as float64."""
    return np.asarray(x, dtype=np.float64).astype(BF16).astype(np.float64)


def _f64(x) -> np.ndarray:
    # ml_dtypes.bfloat16 -> float64 is exact, as is every other float dtype we accept.
    return np.asarray(x).astype(np.float64)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp(-log(1 + exp(-x))) never overflows, unlike 1 / (1 + exp(-x)) for x << 0.
    # A NaN gate gives NaN (as on the GPU) without a RuntimeWarning.
    with np.errstate(invalid="ignore"):
        return np.exp(-np.logaddexp(0.0, -x))


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


# --------------------------------------------------------------------------------------
# sparse_attention
# --------------------------------------------------------------------------------------


def _valid_entries(indices_row, req, block_table, P, NB):
    """Per column of one row: (valid mask, physical page, in-page slot).

    An entry is used only when the request exists, the token index is >= 0, its logical
    page is inside the block-table row and the physical page is inside the cache. Pages and
    slots of invalid entries are set to 0 but must never be read (the mask selects first).
    """
    NR, BTW = block_table.shape
    t = indices_row.astype(np.int64)
    valid = np.zeros(t.shape, dtype=bool)
    page = np.zeros(t.shape, dtype=np.int64)
    if not (0 <= req < NR):
        return valid, page, page.copy()
    lp = np.where(t >= 0, t // P, -1)
    in_table = (t >= 0) & (lp < BTW)
    page[in_table] = block_table[req, lp[in_table]]
    valid = in_table & (page >= 0) & (page < NB)
    slot = np.where(valid, t % P, 0)
    page = np.where(valid, page, 0)
    return valid, page, slot


def _attention_core(q, k_cache, v_cache, logical_indices, block_table, token_to_req,
                    *, block_n, num_tiles, num_splits):
    """Attention output before the gate epilogue, float64 [R, H, D], no final rounding.

    Exposed (privately) so tests can compare split counts without the bf16 store rounding.
    Rows with count <= 0 are 0 here as well.
    """
    R, H, D = q.shape
    NB, P, Hk, _ = k_cache.shape
    W = logical_indices.shape[1] - 1
    G = H // Hk
    kv_head_of = np.arange(H) // G  # query head j reads KV head j // G
    scale = D ** -0.5 * LOG2E  # scores live in base 2 so that exp2 is the softmax exp

    out = np.zeros((R, H, D), dtype=np.float64)
    for r in range(R):
        count = min(int(logical_indices[r, W]), W)
        if count <= 0:
            continue
        # Tiles are consumed whole: a column past `count` but inside a consumed tile is
        # still used if its index is >= 0 (the callers' -1 padding is what excludes it).
        tile_end = min(int(num_tiles), -(-count // block_n))
        valid, page, slot = _valid_entries(
            logical_indices[r, :W], int(token_to_req[r]), block_table, P, NB)

        partial = np.zeros((num_splits, H, D))
        lse = np.full((num_splits, H), -np.inf)
        for s in range(num_splits):
            m = np.full(H, NEG_SENTINEL)
            l = np.zeros(H)
            acc = np.zeros((H, D))
            for tile in range(s, tile_end, num_splits):
                cols = np.arange(tile * block_n, min((tile + 1) * block_n, W))
                cols = cols[valid[cols]]  # select, never multiply: NaN in unused pages stays out
                if cols.size == 0:
                    continue  # m_new == m, alpha == 1, nothing added: the tile is a no-op
                kk = k_cache[page[cols], slot[cols]][:, kv_head_of, :]  # [n, H, D]
                vv = v_cache[page[cols], slot[cols]][:, kv_head_of, :]
                scores = np.einsum("hd,nhd->hn", q[r], kk) * scale  # [H, n]
                m_new = np.maximum(m, scores.max(axis=1))
                alpha = np.exp2(m - m_new)
                p = np.exp2(scores - m_new[:, None])
                acc = acc * alpha[:, None] + np.einsum("hn,nhd->hd", bf16_round(p), vv)
                l = l * alpha + p.sum(axis=1)  # the normaliser uses the unrounded p
                m = m_new
            has = l > 0
            safe_l = np.where(has, l, 1.0)
            partial[s] = np.where(has[:, None], acc / safe_l[:, None], 0.0)
            lse[s] = np.where(has, m + np.log2(safe_l), -np.inf)

        if num_splits == 1:
            out[r] = partial[0]
            continue
        # Merge: weight each split by exp2(lse_s - max lse); an empty split has weight 0 and
        # a row whose splits are all empty yields 0.
        M = lse.max(axis=0)  # [H]
        live = np.isfinite(M)
        safe_M = np.where(live, M, 0.0)
        w = np.where(np.isfinite(lse), np.exp2(lse - safe_M[None, :]), 0.0)  # [S, H]
        wsum = w.sum(axis=0)
        merged = np.einsum("sh,shd->hd", w, partial) / np.where(live, wsum, 1.0)[:, None]
        out[r] = np.where(live[:, None], merged, 0.0)
    return out


def sparse_attention_oracle(q, k_cache, v_cache, logical_indices, block_table, token_to_req,
                            output_gate, *, block_n, num_tiles, num_splits) -> np.ndarray:
    """Float64 oracle of qsa_sparse_paged_attention (docs/spec.md §3.1).

    q, output_gate: [R, H, D]; k_cache, v_cache: logical layout [NB, P, Hk, D];
    logical_indices: [R, W+1] ints, last column = valid count; block_table: [NR, BTW];
    token_to_req: [R]. block_n / num_tiles / num_splits are the kernel configuration
    (BLOCK_N, tile cap, split-K count). Returns float64 [R, H, D] holding bf16 values.
    """
    q = _f64(q)
    k_cache = _f64(k_cache)
    v_cache = _f64(v_cache)
    gate = _f64(output_gate)
    logical_indices = np.asarray(logical_indices).astype(np.int64)
    block_table = np.asarray(block_table).astype(np.int64)
    token_to_req = np.asarray(token_to_req).astype(np.int64)

    _require(q.ndim == 3, f"q must be [R,H,D], got shape {q.shape}")
    R, H, D = q.shape
    _require(k_cache.ndim == 4 and k_cache.shape[3] == D,
             f"k_cache must be [NB,P,Hk,{D}], got {k_cache.shape}")
    _require(v_cache.shape == k_cache.shape,
             f"v_cache shape {v_cache.shape} != k_cache shape {k_cache.shape}")
    Hk = k_cache.shape[2]
    _require(Hk >= 1 and H % Hk == 0, f"H={H} is not a multiple of Hk={Hk}")
    _require(logical_indices.ndim == 2 and logical_indices.shape[0] == R
             and logical_indices.shape[1] >= 2,
             f"logical_indices must be [{R}, W+1], got {logical_indices.shape}")
    _require(block_table.ndim == 2, f"block_table must be 2-D, got {block_table.shape}")
    _require(token_to_req.shape == (R,), f"token_to_req must be [{R}], got {token_to_req.shape}")
    _require(gate.shape == q.shape, f"output_gate shape {gate.shape} != q shape {q.shape}")
    _require(block_n >= 1 and num_splits >= 1 and num_tiles >= 0,
             f"bad config block_n={block_n} num_tiles={num_tiles} num_splits={num_splits}")

    attn = _attention_core(q, k_cache, v_cache, logical_indices, block_table, token_to_req,
                           block_n=int(block_n), num_tiles=int(num_tiles),
                           num_splits=int(num_splits))
    # Gate epilogue: bf16 attention output times fp32 sigmoid(gate), one rounding at store.
    final = bf16_round(bf16_round(attn) * _sigmoid(gate))
    # Rows with count <= 0 are exactly zero whatever the gate holds.
    W = logical_indices.shape[1] - 1
    empty = np.minimum(logical_indices[:, W], W) <= 0
    final[empty] = 0.0
    return final


# --------------------------------------------------------------------------------------
# compress_groups_with_ratio
# --------------------------------------------------------------------------------------


def compress_groups_oracle(raw_keys, raw_positions, compressor_state_cache,
                           compressor_state_block_table, token_to_req, query_start_loc,
                           logical_positions, compressed_slots, compress_ratio,
                           rope_cache=None):
    """Float64 oracle of compress_groups_with_ratio (docs/spec.md §3.2).

    Row r pools the C = compress_ratio positions e-C+1 .. e (e = logical_positions[r]).
    Positions at or after the row's chunk start come from this step's raw rows, older ones
    from the request's ring (block = column 0 of its block-table row, slot = pos mod S).
    Returns (pooled float64 [R, 1, Dk] of bf16 values, first_positions int64 [R, 3]).
    Invalid rows give 0 in both outputs. A ring block outside [0, Bs) (or a request without
    a block-table row) makes its ring members contribute 0 while the row stays valid.
    """
    raw_keys = _f64(raw_keys)
    ring = _f64(compressor_state_cache)
    raw_positions = np.asarray(raw_positions).astype(np.int64)
    ring_bt = np.asarray(compressor_state_block_table).astype(np.int64)
    token_to_req = np.asarray(token_to_req).astype(np.int64)
    qsl = np.asarray(query_start_loc).astype(np.int64)
    logical_positions = np.asarray(logical_positions).astype(np.int64)
    compressed_slots = np.asarray(compressed_slots).astype(np.int64)
    C = int(compress_ratio)

    _require(raw_keys.ndim == 3 and raw_keys.shape[1] == 1,
             f"raw_keys must be [R,1,Dk], got {raw_keys.shape}")
    R, _, Dk = raw_keys.shape
    _require(ring.ndim == 4 and ring.shape[2] == 1 and ring.shape[3] == Dk,
             f"compressor_state_cache must be [Bs,S,1,{Dk}], got {ring.shape}")
    Bs, S = ring.shape[:2]
    _require(C >= 1 and S >= C, f"compress_ratio={C} must be in [1, S={S}]")
    _require(raw_positions.shape[0] == R and raw_positions.shape[-1] >= 3,
             f"raw_positions must be [{R},1,3], got {raw_positions.shape}")
    _require(ring_bt.ndim == 2 and ring_bt.shape[1] >= 1,
             f"compressor_state_block_table must be [NRq, >=1], got {ring_bt.shape}")
    _require(qsl.ndim == 1 and qsl.size >= 1, "query_start_loc must be 1-D and non-empty")
    for name, arr in (("token_to_req", token_to_req), ("logical_positions", logical_positions),
                      ("compressed_slots", compressed_slots)):
        _require(arr.shape == (R,), f"{name} must be [{R}], got {arr.shape}")
    rope = None
    if rope_cache is not None:
        rope = np.asarray(rope_cache).astype(np.int64)
        _require(rope.shape[:2] == (Bs, S) and rope.shape[-1] >= 3,
                 f"rope_cache must be [{Bs},{S},1,3], got {rope.shape}")
    raw_pos = raw_positions.reshape(R, 3)  # [R, 1, 3] -> [R, 3]; works for R == 0
    num_requests = qsl.size - 1

    pooled = np.zeros((R, 1, Dk), dtype=np.float64)
    first = np.zeros((R, 3), dtype=np.int64)
    for r in range(R):
        req = int(token_to_req[r])
        if not (0 <= req < num_requests):
            continue
        qs, qe = int(qsl[req]), int(qsl[req + 1])
        e = int(logical_positions[r])  # Python ints: positions near 2**31 stay exact
        if not (qs <= r < qe) or e < C - 1 or compressed_slots[r] < 0:
            continue
        chunk_start = e - (r - qs)
        b = int(ring_bt[req, 0]) if req < ring_bt.shape[0] else -1
        ring_ok = 0 <= b < Bs

        total = np.zeros(Dk)
        for pos in range(e - C + 1, e + 1):  # oldest member first, as the kernel sums
            if pos >= chunk_start:
                total = total + raw_keys[qs + pos - chunk_start, 0]
            elif ring_ok:
                total = total + ring[b, pos % S, 0]
        pooled[r, 0] = bf16_round(total / C)

        f = e - C + 1
        if rope is None:
            first[r] = (f, f, f)
        elif f >= chunk_start:
            first[r] = raw_pos[qs + f - chunk_start]
        elif ring_ok:
            first[r] = rope[b, f % S].reshape(-1)[:3]
        # else: first member in an invalid ring block -> positions stay 0
    return pooled, first


# --------------------------------------------------------------------------------------
# store_cache_rows
# --------------------------------------------------------------------------------------


def store_cache_rows_oracle(cache, slot_mapping, rows) -> np.ndarray:
    """Oracle of store_cache_rows: a copy of `cache` [pages, P, 1, width] with rows stored.

    Row i goes to slot s = slot_mapping[i] (page s // P, offset s % P) when
    0 <= s < pages * P, converted to the cache dtype; other rows are dropped and every
    untargeted slot keeps its exact bits. Rows aimed at the same slot are written in index
    order, so the last one wins here; the GPU original does not define an order for that
    case, so tests should not rely on it.
    """
    cache = np.asarray(cache)
    _require(cache.ndim == 4 and cache.shape[2] == 1,
             f"cache must be [pages,P,1,width], got {cache.shape}")
    pages, P, _, width = cache.shape
    rows = np.asarray(rows)
    if rows.ndim == 3:
        _require(rows.shape[1] == 1, f"rows must be [n,width] or [n,1,width], got {rows.shape}")
        rows = rows[:, 0, :]
    _require(rows.ndim == 2 and rows.shape[1] == width,
             f"rows must be [n,{width}] or [n,1,{width}], got {rows.shape}")
    slots = np.asarray(slot_mapping).astype(np.int64).reshape(-1)
    _require(slots.shape[0] == rows.shape[0],
             f"slot_mapping has {slots.shape[0]} entries for {rows.shape[0]} rows")

    out = cache.copy()
    converted = rows.astype(cache.dtype)  # float32 -> bf16 rounds to nearest even
    for i, s in enumerate(slots):
        if 0 <= s < pages * P:
            out[s // P, s % P, 0, :] = converted[i]
    return out
