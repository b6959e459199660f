"""Exact sparse attention in float64: the operator's definition with no tiling and no rounding.

For row r, KV head h and query head j of h's group (docs/spec.md §3), over the row's valid
entries e = (page, slot) (validity exactly as in ``qsa_testing.oracle``: request in range,
token >= 0, logical page inside the block table, physical page in [0, NB))::

    out[r, j] = softmax_e(q[r, j] . K[e, h] * D**-0.5 * k_scale) @ V[e, h] * v_scale
                * sigmoid(gate[r, j])

computed in float64 from the inputs' values, with none of the kernels' roundings (no bf16
probabilities, no bf16 attention output, no bf16 store). A row with no valid entry gives
exactly 0. This is the yardstick of the *accuracy* contract (``qsa_testing.agreement``):
every tiling is measured by its distance from this, while the tiling-faithful oracle
(``qsa_testing.oracle``) reproduces one tiling's roundings for the *fidelity* contract.

Which columns count
-------------------
By definition the columns ``c < min(count, W)`` (count = the last column; vLLM pads the
rest with -1). The kernels, however, consume whole tiles of ``block_n`` columns, so a
non-negative index past the count but inside the last consumed tile is used by them.
``block_n=None`` (the default) takes the definition; ``block_n=BN`` (and optionally
``num_tiles``) takes the set a kernel with that tiling consumes:
``c < min(ceil(count / BN), num_tiles) * BN`` and ``c < W``. The two agree whenever the
columns past the count hold -1, which is how vLLM fills them; pass ``block_n`` to compare
a kernel with data that does not.

Dequantised caches: K/V of any float dtype are taken at their value (cast to float64), so an
fp8 cache works as is; ``k_scale`` / ``v_scale`` are the per-tensor dequantisation scales.
"""

from __future__ import annotations

import numpy as np

from qsa_testing.oracle import _valid_entries

__all__ = ["exact_attention", "exact_attention_fetched", "consumed_columns", "spread_rows"]

# Rows gathered per chunk: bounds the float64 K/V gather ([rows, Hk, W, D] each) to ~130 MB
# at the real shapes (W = 2051, Hk = 2, D = 256: 8.4 MB per row for K, as much for V).
_ROWS_PER_CHUNK = 8


def spread_rows(num_rows: int, at_most: int = 16) -> np.ndarray:
    """Up to ``at_most`` row indices spread evenly over a batch (first and last included):
    where the exact result is computed for GPU-sized batches."""
    return np.unique(np.linspace(0, num_rows - 1, min(num_rows, at_most)).astype(np.int64))


def consumed_columns(counts, width: int, *, block_n: int | None = None,
                     num_tiles: int | None = None) -> np.ndarray:
    """Boolean [R, W]: which columns of each row count (see the module docstring)."""
    counts = np.minimum(np.asarray(counts, np.int64), width)
    if block_n is None:
        end = counts
    else:
        tiles = -(-width // block_n) if num_tiles is None else num_tiles
        end = np.minimum(np.clip(-(-counts // block_n), 0, tiles) * block_n, width)
    return np.arange(width)[None, :] < np.maximum(end, 0)[:, None]


def _split_caches(kv):
    """(K, V) in the logical [NB, P, Hk, D] layout (views, own dtype), from either layout;
    only the gathered rows are converted to float64."""
    if isinstance(kv, (tuple, list)):
        k, v = (np.asarray(a) for a in kv)
        if k.shape != v.shape or k.ndim != 4:
            raise ValueError(f"k_cache/v_cache must both be [NB,P,Hk,D]; got {k.shape} and {v.shape}")
        return k, v
    kv = np.asarray(kv)
    if kv.ndim != 4 or kv.shape[3] % 2:
        raise ValueError(f"kv_cache must be [NB,Hk,P,2D]; got {kv.shape}")
    d = kv.shape[3] // 2
    kv = kv.transpose(0, 2, 1, 3)  # [NB, P, Hk, 2D]
    return kv[..., :d], kv[..., d:]


def exact_attention(q, kv, logical_indices, block_table, token_to_req, output_gate, *,
                    k_scale: float = 1.0, v_scale: float = 1.0, block_n: int | None = None,
                    num_tiles: int | None = None, rows=None) -> np.ndarray:
    """Exact sparse attention, float64 [R, H, D] (``len(rows)`` rows when ``rows`` is given).

    ``kv``: the fused cache [NB, Hk, P, 2D] or a (k_cache, v_cache) pair [NB, P, Hk, D], any
    float dtype. ``rows``: optional row indices to compute (for large GPU-sized cases).
    ``block_n`` / ``num_tiles``: which columns count (module docstring).
    """
    k_cache, v_cache = _split_caches(kv)
    q = np.asarray(q)
    gate = np.asarray(output_gate)
    li = np.asarray(logical_indices).astype(np.int64)
    bt = np.asarray(block_table).astype(np.int64)
    t2r = np.asarray(token_to_req).astype(np.int64)
    if q.ndim != 3 or gate.shape != q.shape:
        raise ValueError(f"q and output_gate must both be [R,H,D]; got {q.shape} and {gate.shape}")
    R, H, D = q.shape
    NB, P, Hk, Dk = k_cache.shape
    if Dk != D or H % Hk:
        raise ValueError(f"cache [NB,P,Hk,D]={k_cache.shape} does not fit q [R,H,D]={q.shape}")
    if li.ndim != 2 or li.shape[0] != R or li.shape[1] < 2 or t2r.shape != (R,) or bt.ndim != 2:
        raise ValueError(f"metadata shapes do not fit R={R}: logical_indices {li.shape}, "
                         f"token_to_req {t2r.shape}, block_table {bt.shape}")
    G = H // Hk
    W = li.shape[1] - 1
    rows = np.arange(R) if rows is None else np.asarray(rows, np.int64).reshape(-1)
    out = np.zeros((rows.size, H, D))
    scale = D ** -0.5 * float(k_scale)

    for start in range(0, rows.size, _ROWS_PER_CHUNK):
        rr = rows[start:start + _ROWS_PER_CHUNK]
        used = consumed_columns(li[rr, W], W, block_n=block_n, num_tiles=num_tiles)
        valid, page, slot = _valid_entries(li[rr, :W], t2r[rr], bt, P, NB)
        valid &= used  # [n, W]
        # Gather every column (invalid ones at the safe page 0 / slot 0), then overwrite the
        # invalid ones with 0: NaN in unreferenced pages never reaches the arithmetic.
        # Gathered straight into [n, Hk, W, D] so both products run on contiguous operands.
        heads = np.arange(Hk)[None, :, None]
        page, slot, invalid = page[:, None, :], slot[:, None, :], ~valid[:, None, :]
        keys = k_cache[page, slot, heads].astype(np.float64)
        values = v_cache[page, slot, heads].astype(np.float64)
        keys[np.broadcast_to(invalid, keys.shape[:3])] = 0.0
        values[np.broadcast_to(invalid, values.shape[:3])] = 0.0
        qg = q[rr].astype(np.float64).reshape(-1, Hk, G, D)
        scores = np.matmul(qg, keys.swapaxes(-1, -2)) * scale  # [n, Hk, G, W]
        mask = valid[:, None, None, :]
        scores = np.where(mask, scores, -np.inf)
        top = scores.max(axis=-1, keepdims=True)
        has = np.isfinite(top)  # False only for rows without a valid entry
        weights = np.where(mask, np.exp(scores - np.where(has, top, 0.0)), 0.0)
        total = weights.sum(axis=-1, keepdims=True)
        attn = np.matmul(weights, values) / np.where(has, total, 1.0)
        attn = np.where(has, attn, 0.0).reshape(-1, H, D) * float(v_scale)
        g = gate[rr].astype(np.float64)
        with np.errstate(over="ignore"):  # exp(-g) overflows to inf for g << 0: sigmoid 0
            out[start:start + rr.size] = attn / (1.0 + np.exp(-g))
    return out


def exact_attention_fetched(q, fetch_rows, cache_shape, logical_indices, block_table, token_to_req,
                            output_gate, *, rows, **kwargs) -> np.ndarray:
    """``exact_attention`` on some rows of a cache that lives elsewhere (a multi-GB GPU pool).

    ``cache_shape``: the fused cache's [NB, Hk, P, 2D]; ``fetch_rows(pages, slots)`` returns the
    fused rows ``kv_cache[pages, :, slots, :]`` ([n, Hk, 2D], any float dtype) for the given
    int64 pages and slots. Only the distinct (page, slot) pairs these rows' valid entries
    name are fetched; they become a one-token-per-page cache that the rows address directly,
    so every entry keeps its validity and its values. Keyword arguments go to
    ``exact_attention`` (k_scale, v_scale, block_n, num_tiles).
    """
    nb, hk, p, d2 = cache_shape
    li = np.asarray(logical_indices).astype(np.int64)
    rows = np.asarray(rows, np.int64).reshape(-1)
    w = li.shape[1] - 1
    valid, page, slot = _valid_entries(li[rows, :w], np.asarray(token_to_req)[rows],
                                       np.asarray(block_table).astype(np.int64), p, nb)
    flat = np.where(valid, page * p + slot, -1)
    wanted, position = np.unique(flat[valid], return_inverse=True)
    fetched = np.asarray(fetch_rows(wanted // p, wanted % p)) if wanted.size else \
        np.zeros((0, hk, d2), np.float32)
    compact = np.zeros((max(wanted.size, 1), hk, 1, d2), fetched.dtype)
    compact[:wanted.size, :, 0] = fetched
    tokens = np.full(flat.shape, -1, np.int64)
    tokens[valid] = position
    indices = np.concatenate([tokens, li[rows, w:]], axis=1)
    table = np.arange(compact.shape[0], dtype=np.int64)[None, :]
    return exact_attention(np.asarray(q)[rows], compact, indices, table, np.zeros(rows.size, np.int64),
                           np.asarray(output_gate)[rows], **kwargs)
