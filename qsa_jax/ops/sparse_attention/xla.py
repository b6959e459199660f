"""Plain-XLA implementation of sparse paged attention (the reference).

It follows the kernels' arithmetic step by step — the same tiles, the same
round-robin deal of tiles to splits, the same running maximum and bf16
rounding of the probabilities — so that it agrees with the originals to fp32
rounding, not just to bf16 tolerance. Vectorised over rows, KV heads and
splits; a ``lax.scan`` walks the tiles of each split in order.

Memory: one step gathers ``rows x splits x block_n x kv_heads x D`` keys and
values, never the whole selection.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from qsa_jax.ops import _vma
from qsa_jax.ops.sparse_attention.base import (
    LOG2_E, MASKED_SCORE, SparseAttentionProblem, as_e4m3, entry_rows, finish_split,
    gate_epilogue, head_row_stride, merge_splits, merged_lse, operand_dtypes)


def run(problem: SparseAttentionProblem, q, kv_arrays, logical_indices,
        block_table, token_to_req, output_gate, scales=None, *, residuals: bool = False):
    """The bf16 output [R, H, D]; with ``residuals`` also what the backward keeps
    (``backward.py``): the ungated attention rounded to bf16 [R, H, D] and the
    base-2 LSE of the merged softmax [R, H] fp32 (-inf for a row with no entry)."""
    p = problem
    cfg = p.config
    rows, heads, d = p.num_rows, p.num_query_heads, p.head_dim
    hk, g, w = p.num_kv_heads, p.group_size, p.selection_width
    bn, splits, num_tiles = cfg.block_n, cfg.num_splits, cfg.num_tiles
    if rows == 0:
        out = jnp.zeros((0, heads, d), jnp.bfloat16)
        return (out, out, jnp.zeros((0, heads), jnp.float32)) if residuals else out
    kv = p.kv

    # Tiles a row consumes: ceil(min(count, W) / block_n), capped at num_tiles;
    # a count <= 0 consumes none (floor division keeps negatives <= 0).
    count = jnp.minimum(logical_indices[:, w], w)
    tile_end = jnp.clip((count + bn - 1) // bn, 0, num_tiles)

    # Lay the columns out as [rows, step, split, block_n]: split s handles tiles
    # s, s + S, s + 2S, ... so step i of split s is tile s + i*S.
    steps = -(-num_tiles // splits)
    padded = steps * splits * bn
    tokens = logical_indices[:, :w]
    if padded > w:
        tokens = jnp.pad(tokens, ((0, 0), (0, padded - w)), constant_values=-1)
    else:
        tokens = tokens[:, :padded]
    tokens = tokens.reshape(rows, steps, splits, bn)
    tile_id = (jnp.arange(steps)[:, None] * splits + jnp.arange(splits)[None, :])  # [steps, S]
    row0, valid = entry_rows(p, tokens, block_table, token_to_req)
    valid &= (tile_id[None, :, :, None] < tile_end[:, None, None, None])

    k_rows, v_rows = kv.rows_view(kv_arrays)
    k_half, v_half = kv.halves
    head_offsets = jnp.arange(hk, dtype=jnp.int32) * head_row_stride(kv)
    if p.q_layout is None:
        qg = q.reshape(rows, hk, g, d)
    else:  # q read out of a larger table (StridedQuery): a gather of its rows
        q_rows = p.q_layout.row(jnp.arange(rows)[:, None], jnp.arange(heads)[None, :])
        qg = q.reshape(-1, d)[q_rows].reshape(rows, hk, g, d)
    # 0.30.0: a compile-time constant; with scales (0.34.0): the fp32 operand.
    scale = scales[0] if p.scaled else (d ** -0.5) * LOG2_E
    key_dtype, value_dtype = operand_dtypes(p)

    def step(carry, xs):
        acc, norm, run_max = carry  # [R,S,Hk,G,D], [R,S,Hk,G], [R,S,Hk,G]
        row_s, valid_s = xs  # [R,S,BN]
        r = row_s[..., None] + head_offsets  # [R,S,BN,Hk]
        # fp8: decode after the gather (only the tile's bytes), exact in both dtypes.
        keys = as_e4m3(k_rows[r, k_half]).astype(key_dtype)  # [R,S,BN,Hk,D]
        values = as_e4m3(v_rows[r, v_half]).astype(value_dtype)
        vmask = valid_s[..., None, None]
        # Zero with where, not a multiply: unreferenced pages may hold NaN.
        keys = jnp.where(vmask, keys, 0)
        values = jnp.where(vmask, values, 0)
        scores = jnp.einsum("rkgd,rsnkd->rskgn", qg, keys,
                            preferred_element_type=jnp.float32) * scale
        smask = valid_s[:, :, None, None, :]
        scores = jnp.where(smask, scores, MASKED_SCORE)
        new_max = jnp.maximum(run_max, scores.max(axis=-1))
        alpha = jnp.exp2(run_max - new_max)
        probs = jnp.where(smask, jnp.exp2(scores - new_max[..., None]), 0.0)
        # P.V uses bf16 (fp8 cache: fp16) probabilities; the normaliser sums the unrounded ones.
        pv = jnp.einsum("rskgn,rsnkd->rskgd", probs.astype(value_dtype), values,
                        preferred_element_type=jnp.float32)
        acc = acc * alpha[..., None] + pv
        norm = norm * alpha + probs.sum(axis=-1)
        return (acc, norm, new_max), None

    # Inside a caller's shard_map the carries vary as the inputs do (a loop's types must match).
    init = _vma.like((jnp.zeros((rows, splits, hk, g, d), jnp.float32),
                      jnp.zeros((rows, splits, hk, g), jnp.float32),
                      jnp.full((rows, splits, hk, g), MASKED_SCORE, jnp.float32)),
                     q, kv_arrays, logical_indices, block_table, token_to_req, output_gate, scales)
    xs = (jnp.moveaxis(row0, 1, 0), jnp.moveaxis(valid, 1, 0))
    (acc, norm, run_max), _ = lax.scan(step, init, xs)

    out, lse = finish_split(acc, norm, run_max, scales[1] if p.scaled else None)  # [R,S,Hk,G,D], [R,S,Hk,G]
    if splits == 1:
        attention, lse = out[:, 0], lse[:, 0]
    else:
        lse = jnp.moveaxis(lse, 1, 0)
        attention = merge_splits(jnp.moveaxis(out, 1, 0), lse)
        lse = merged_lse(lse)
    attention = attention.reshape(rows, heads, d)
    gated = gate_epilogue(attention, output_gate.reshape(rows, heads, d))
    if residuals:
        return gated, attention.astype(jnp.bfloat16), lse.reshape(rows, heads)
    return gated


def why_not() -> str | None:
    return None  # plain XLA runs on every backend
