"""Pallas implementation of sparse paged attention (Triton lowering on GPU).

One program per (row, KV head, split), like the originals: it walks the tiles
dealt to its split (tiles s, s+S, s+2S, ...), gathers the K/V rows of each tile
straight out of the cache, and keeps an online base-2 softmax. With one split
the program applies the sigmoid gate and writes the bf16 output itself; with
several it writes an fp32 partial + base-2 LSE and a second Pallas kernel
merges the splits and applies the gate (or, with ``PallasLaunch(merge="fused")``,
the last split program of each (row, KV head) to finish merges them in the same
launch: ``_merge_if_last``).

Design choices (and why):

* The cache is never copied or transposed. The fused ``[NB, Hk, P, 2D]``
  buffer is viewed (free reshape) as ``[NB*Hk*P, 2D]`` rows; K is columns
  ``[0, D)`` and V ``[D, 2D)`` of a row, addressed inside the kernel. The
  split layout is two ``[NB*P*Hk, D]`` row tables. Every pallas input uses
  ``no_block_spec``: on GPU the ref is a bare pointer and each load is pointer
  arithmetic, so nothing is staged.
* In-kernel arrays must have power-of-two shapes, but the query group G is 12
  or 6. Rather than masking the q/gate loads and the output store (masked
  gathers/scatters do not run in interpret mode), the padded query rows
  ``i >= G`` are *clamped* to head G-1: they load head G-1's query and gate,
  compute exactly head G-1's result, and store it to head G-1's address.
  Duplicate stores of identical values are harmless and no mask is needed.
  The same trick covers selection columns past W and splits past S.
* Invalid entries: the cache row is clamped to row 0 (always in range); on GPU
  the gather is a masked load (``other=0``), in interpret mode the loaded K/V
  are zeroed with ``jnp.where`` -- never by a multiply, because unreferenced
  pages may hold NaN and NaN * 0 = NaN.
* K is gathered straight into a [D, BN] tile (the addresses put D on axis 0),
  so Q.K^T is a plain [M, D] x [D, BN] dot with no transpose op, and the
  [M, BN] scores feed P.V directly. (docs/spec.md §9 notes the suggested K.q^T; on
  sm_90 that variant needs a shared-memory round trip to transpose the
  probabilities every tile -- see notes/pallas.md.)
* fp8 caches are loaded as they are stored (e4m3, or uint8 bytes that are
  bitcast to e4m3 in registers) and converted after the load, so the memory
  traffic is the fp8 bytes. The k/v scales arrive as a (2,) fp32 input, not as
  constants, so a new scale value does not recompile.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from qsa_jax import config
from qsa_jax.config import pallas_launch, pallas_tiling
from qsa_jax.ops import _vma
from qsa_jax.ops._pallas_support import interpret, next_pow2, pl, plgpu, why_not  # noqa: F401
from qsa_jax.ops.sparse_attention.base import (
    F16_QUERY_MAX_SHIFT, F16_QUERY_TOP_EXPONENT, LOG2_E, MASKED_SCORE, SparseAttentionProblem, as_e4m3,
    head_row_stride, normalised, operand_dtypes)

def _attention_kernel(q_ref, k_ref, v_ref, idx_ref, bt_ref, req_ref, gate_ref, *refs,
                      p: SparseAttentionProblem, block_m: int, one_split: bool,
                      masked: bool, prefetch: bool, fp8_keys_via_f16: bool = False,
                      fp8_value_pairs: bool = False, fp8_keys_f16_dot: bool = False,
                      fused_merge: bool = False, merge_block_d: int = 0):
    # With k/v scales a (2,) fp32 ref [score scale, output scale] precedes the outputs.
    # With ``fused_merge`` (several splits) the zeroed arrival counters follow as an input,
    # aliased to the last output (see _merge_if_last).
    scales_ref, out_refs = (refs[0], refs[1:]) if p.scaled else (None, refs)
    kv = p.kv
    cfg = p.config
    bn, num_splits, num_tiles = cfg.block_n, cfg.num_splits, cfg.num_tiles
    d, g, heads, w = p.head_dim, p.group_size, p.num_query_heads, p.selection_width
    k_col = 0
    v_col = d if kv.fused else 0

    row = pl.program_id(0)
    head = pl.program_id(1)
    split = pl.program_id(2)

    # Flat [R*H] indices of this program's query heads (gate and output rows);
    # padded ones repeat head G-1 (see module docstring). q's rows may sit in a
    # larger table (StridedQuery), at their own addresses.
    group = jnp.minimum(lax.broadcasted_iota(jnp.int32, (block_m,), 0), g - 1)
    q_rows = row * heads + head * g + group
    q = q_ref[p.queries.row(row, head * g + group), :]  # [M, D] bf16

    request = req_ref[row]
    request_ok = (request >= 0) & (request < p.num_requests)
    safe_request = jnp.clip(request, 0, p.num_requests - 1)
    count = jnp.minimum(idx_ref[row, w], w)
    # ceil(count / BN) capped at num_tiles; count <= 0 gives <= 0 tiles.
    tile_end = jnp.minimum(num_tiles, (count + bn - 1) // bn)
    # Tiles split, split+S, ... < tile_end.
    num_steps = (jnp.maximum(tile_end - split, 0) + num_splits - 1) // num_splits
    head_offset = head * head_row_stride(kv)
    columns = lax.broadcasted_iota(jnp.int32, (bn,), 0)
    dims = lax.broadcasted_iota(jnp.int32, (d,), 0)
    scale = scales_ref[0] if p.scaled else (d ** -0.5) * LOG2_E
    key_dtype, value_dtype = operand_dtypes(p)
    # fp8 V in even/odd column halves (config.pallas_fp8_value_pairs): P.V is two dots
    # of D/2 columns each, with one accumulator per half, interleaved back at the end.
    value_pairs = fp8_value_pairs and p.is_fp8
    # fp8 K as fp16 for q.K^T (config.pallas_fp8_keys_f16_dot): q is rescaled by 2^shift per
    # row into fp16's range once, and the scores by 2^-shift, both exact powers of two.
    if fp8_keys_f16_dot and p.is_fp8:
        key_dtype = jnp.float16
        q, row_scale = _f16_query(q, scale)
    else:
        row_scale = None

    def tile_entries(tile):
        """Cache rows and validity of one tile's BN selected entries (always in
        bounds, also for a tile past the end)."""
        return selected_cache_rows(p, idx_ref, bt_ref, row, request_ok, safe_request,
                                   tile * bn + columns, w, head_offset)

    def load_tile(cache_row, valid):
        # K is gathered already transposed ([D, BN]: the address, not a
        # transpose op, puts D on axis 0), so Q.K^T needs no data movement,
        # and the scores come out [M, BN] -- the layout P.V consumes as-is.
        # fp8 (e4m3 values or bytes) is converted in registers, after the masked load.
        keys_t = _load_rows(k_ref, cache_row[None, :], (k_col + dims)[:, None], valid[None, :], masked)
        values = _load_rows(v_ref, cache_row[:, None], (v_col + dims)[None, :], valid[:, None], masked)
        keys_t = as_e4m3(keys_t)
        if fp8_keys_via_f16 and p.is_fp8 and key_dtype == jnp.bfloat16:  # exact; config.pallas_fp8_keys_via_f16
            keys_t = keys_t.astype(jnp.float16).astype(jnp.float32)
        values = as_e4m3(values)
        if value_pairs:
            # Columns 2c and 2c+1 of a row are adjacent bytes: Triton reads them out of
            # shared memory as one 16-bit word and converts the pair with one instruction,
            # instead of one byte load per element plus repacking (notes/pallas.md, session 7).
            even, odd = lax.unstack(values.astype(value_dtype).reshape(bn, d // 2, 2), axis=-1)
            return keys_t.astype(key_dtype), (even, odd)
        return keys_t.astype(key_dtype), values.astype(value_dtype)

    def attend(state, keys_t, values, valid):
        acc, norm, run_max = state  # [M, D] ([M, D/2] x 2 with value_pairs), [M], [M] fp32
        scores = jnp.dot(q, keys_t, preferred_element_type=jnp.float32)  # [M, BN]
        scores = scores * scale if row_scale is None else scores * row_scale[:, None]
        scores = jnp.where(valid[None, :], scores, MASKED_SCORE)
        new_max = jnp.maximum(run_max, jnp.max(scores, axis=1))
        alpha = jnp.exp2(run_max - new_max)
        probs = jnp.where(valid[None, :], jnp.exp2(scores - new_max[:, None]), 0.0)
        # P.V with bf16 (fp8 cache: fp16) probabilities; the normaliser sums the fp32 ones.
        # Written acc * alpha + dot: Triton's combine pass makes it dot(p, v, acc * alpha).
        probs_v = probs.astype(value_dtype)
        if value_pairs:
            acc = tuple(a * alpha[:, None] + jnp.dot(probs_v, v, preferred_element_type=jnp.float32)
                        for a, v in zip(acc, values))
        else:
            acc = acc * alpha[:, None] + jnp.dot(probs_v, values, preferred_element_type=jnp.float32)
        return acc, norm * alpha + jnp.sum(probs, axis=1), new_max

    acc0 = jnp.zeros((block_m, d // 2 if value_pairs else d), jnp.float32)
    init = ((acc0, acc0) if value_pairs else acc0, jnp.zeros((block_m,), jnp.float32),
            jnp.full((block_m,), MASKED_SCORE, jnp.float32))
    if prefetch:
        # Software-pipelined by hand: the index -> block-table loads of the next
        # tile are issued while this tile's K/V gather is in flight, so each
        # step waits for one dependent HBM round trip instead of three. Same
        # arithmetic in the same order: results are bit-identical.
        def body(step, carry):
            state, cache_row, valid = carry
            keys_t, values = load_tile(cache_row, valid)
            upcoming = tile_entries(split + (step + 1) * num_splits)
            return (attend(state, keys_t, values, valid),) + upcoming

        (acc, norm, run_max), _, _ = lax.fori_loop(
            0, num_steps, body, (init,) + tile_entries(split))
    else:
        def body(step, state):
            cache_row, valid = tile_entries(split + step * num_splits)
            keys_t, values = load_tile(cache_row, valid)
            return attend(state, keys_t, values, valid)

        acc, norm, run_max = lax.fori_loop(0, num_steps, body, init)

    if value_pairs:  # columns 2c and 2c+1 back side by side
        acc = lax.stack(acc, axis=-1).reshape(block_m, d)
    has_values = norm > 0
    safe_norm = jnp.maximum(norm, 1.0e-20)
    out = normalised(acc, norm, scales_ref[1] if p.scaled else None)
    lse = jnp.where(has_values, run_max + jnp.log2(safe_norm), -jnp.inf)
    if one_split:
        o_ref, *residual_refs = out_refs
        gate = gate_ref[q_rows, :].astype(jnp.float32)
        o_ref[q_rows, :] = _gated(out, gate)
        if residual_refs:  # kept for the backward pass (backward.py)
            attn_ref, lse_out_ref = residual_refs
            attn_ref[q_rows, :] = out.astype(jnp.bfloat16)
            lse_out_ref[q_rows] = lse
    elif fused_merge:
        _, o_ref, *residual_refs, part_ref, lse_ref, counter_ref = out_refs  # [0]: the counters input
        part_ref[split, q_rows, :] = out
        lse_ref[split, q_rows] = lse
        _merge_if_last(p, part_ref, lse_ref, gate_ref, o_ref, residual_refs, counter_ref, row, head,
                       block_d=merge_block_d, on_gpu=masked)
    else:
        part_ref, lse_ref = out_refs
        part_ref[split, q_rows, :] = out
        lse_ref[split, q_rows] = lse


def _merge_if_last(p: SparseAttentionProblem, part_ref, lse_ref, gate_ref, o_ref, residual_refs, counter_ref,
                   row, head, *, block_d: int, on_gpu: bool):
    """The fused merge (``PallasLaunch(merge="fused")``), after this split program stored
    its partial and LSE: count its arrival at (row, KV head); the program that arrives last
    merges the G query heads of that (row, KV head) over all splits, D in ``block_d``
    chunks, exactly as ``_merge_kernel`` does (same helpers, same order).

    Memory ordering: Pallas' Triton lowering emits ``atomic_add`` as ``tt.atomic_rmw`` with
    acq_rel semantics at GPU scope, executed by one thread of the program, and returns the
    value before the add. The CTA barrier before it orders every thread's partial stores
    before that thread's release; the last arrival's acquire (Triton broadcasts its result
    to the other threads through shared memory, behind a barrier) orders its partial loads
    after every other program's release. Checked on the sm_90 lowering (tests/test_fused_merge.py).
    The counters start at zero every call (a zeroed buffer made by the caller).
    """
    num_splits = p.config.num_splits
    block_s = next_pow2(num_splits)
    g, heads = p.group_size, p.num_query_heads
    if on_gpu:  # the interpreter runs programs one by one and has no barrier rule
        plgpu.debug_barrier()
    arrived = plgpu.atomic_add(counter_ref, row * p.num_kv_heads + head, jnp.ones((), jnp.int32))

    @pl.when(arrived == num_splits - 1)
    def _merge():
        # Unrolled over the G heads x D chunks and software-pipelined by hand: the merge is
        # a serial chain in one program, and each chunk's sum over splits crosses warps
        # (a CTA barrier, which no load is moved across), so every load is issued one step
        # ahead in program order: the next head's LSEs and gate chunks (the gate comes
        # from HBM) while this head is merged, the next chunk's partials while this
        # chunk is summed. Same helpers, same arithmetic per chunk as _merge_kernel.
        split_rows = _split_rows(num_splits, block_s)
        chunks = [pl.ds(c * block_d, block_d) for c in range(p.head_dim // block_d)]
        steps = [(i, c) for i in range(g) for c in range(len(chunks))]
        qrow = lambda i: row * heads + head * g + i  # noqa: E731

        def head_loads(i):
            return _load_lse(lse_ref, qrow(i), split_rows), [gate_ref[qrow(i), cols] for cols in chunks]

        def partial(step):
            i, c = steps[step]
            return part_ref[split_rows[0], qrow(i), chunks[c]]

        next_head, next_partial = head_loads(0), partial(0)
        for step, (i, c) in enumerate(steps):
            if c == 0:
                (lse, gates), weights = next_head, None
                if i + 1 < g:
                    next_head = head_loads(i + 1)
            this_partial = next_partial
            if step + 1 < len(steps):
                next_partial = partial(step + 1)
            if weights is None:
                weights = _merge_weights(lse, split_rows)
            _merge_columns(this_partial, lambda gate=gates[c]: gate, o_ref, residual_refs, qrow(i), chunks[c],
                           split_rows, weights)


def selected_cache_rows(p: SparseAttentionProblem, idx_ref, bt_ref, row, request_ok, safe_request,
                        cols, limit, head_offset):
    """Cache rows and validity of selection columns ``cols`` [BN] of ``row`` (index and
    block-table loads, always in bounds). Columns at or past ``limit`` count as padding
    (-1): W here. The backward resolves the same entries with the same rules once in XLA
    (``backward_pallas.entry_lists`` / ``entry_rows``), so both read the same cache rows."""
    kv = p.kv
    # Columns >= W (last partial tile) read a clamped column, then become -1.
    tokens = idx_ref[row, jnp.minimum(cols, p.selection_width - 1)]
    tokens = jnp.where(cols < limit, tokens, -1)
    safe_tok = jnp.maximum(tokens, 0)
    # safe_tok >= 0: truncating div/rem are floor div/mod here and much
    # cheaper in Triton than Python-style floor semantics.
    logical_page = lax.div(safe_tok, kv.page_size)
    valid = request_ok & (tokens >= 0) & (logical_page < p.table_width)
    page = bt_ref[safe_request, jnp.minimum(logical_page, p.table_width - 1)]
    valid = valid & (page >= 0) & (page < kv.num_pages)
    # Invalid entries address row 0 (always in range); the loads zero them.
    cache_row = jnp.where(
        valid, kv.row_index(page, lax.rem(safe_tok, kv.page_size), 0) + head_offset, 0)
    return cache_row, valid


def _f16_query(q, scale):
    """(q * 2^shift as fp16 [M, D], scale * 2^-shift [M]) with a power-of-two shift per row.

    For q.K^T with fp16 K: an fp16 K (exact for e4m3) saves the f16 -> f32 -> bf16 steps of
    every K element of every tile, for one rescale of q per program. The scores are the
    bf16 product's bit for bit when the fp16 dot sums its products as the bf16 dot does
    (config.pallas_fp8_keys_f16_dot): q * 2^shift is exact (power of two, in range) and
    exactly representable in fp16 for every element within 2^-31 of the row's largest;
    each product q_i * 2^shift * k_i is exact, so the fp32 sum is the bf16 one times
    2^shift (scaling by a power of two commutes with rounding away from under/overflow),
    and (sum * 2^shift) * (scale * 2^-shift) rounds once to the same value as sum * scale.
    Elements more than 2^32 below their row's largest lose low bits (no effect
    at the scores' precision); an all-zero row gets the largest shift and stays zero."""
    qf = q.astype(jnp.float32)
    top = jnp.max(jnp.abs(qf), axis=1)
    exponent = ((lax.bitcast_convert_type(top, jnp.int32) >> 23) & 0xFF) - 127
    shift = jnp.clip(F16_QUERY_TOP_EXPONENT - exponent, -F16_QUERY_MAX_SHIFT, F16_QUERY_MAX_SHIFT)
    up = lax.bitcast_convert_type((shift + 127) << 23, jnp.float32)  # 2^shift
    down = lax.bitcast_convert_type((127 - shift) << 23, jnp.float32)  # 2^-shift
    return (qf * up[:, None]).astype(jnp.float16), scale * down


def _load_rows(ref, row_index, col_index, valid, masked: bool):
    """Gather ``ref[row_index, col_index]`` (broadcast), zero where not ``valid``.

    ``row_index`` is already clamped to a safe row for invalid entries, so the
    plain gather never leaves the array. On GPU the load is also masked
    (``other=0``): invalid entries then cost no memory traffic and Triton can
    pipeline the gather as an async copy straight into shared memory (a select
    after the load would sit between the load and the dot). The interpreter
    cannot run masked gathers, so there the zeros come from ``jnp.where`` --
    never from a multiply, since an unreferenced page may hold NaN.
    """
    if masked:
        return plgpu.load(ref.at[row_index, col_index], mask=valid, other=0.0)
    values = ref[row_index, col_index]
    return jnp.where(valid, values, jnp.zeros_like(values))


def _gated(attention, gate_fp32):
    """bf16(bf16(attention) * sigmoid(gate)), written out so Triton sees plain ops."""
    rounded = attention.astype(jnp.bfloat16).astype(jnp.float32)
    return (rounded * (1.0 / (1.0 + jnp.exp(-gate_fp32)))).astype(jnp.bfloat16)


def _split_rows(num_splits: int, block_s: int):
    """The merge's [S_pow2] split rows: clamped to S-1 past the real splits, and which are real."""
    splits = lax.broadcasted_iota(jnp.int32, (block_s,), 0)
    in_range = splits < num_splits
    return jnp.minimum(splits, num_splits - 1), in_range


def _load_lse(lse_ref, qrow, split_rows):
    safe_splits, in_range = split_rows
    return jnp.where(in_range, lse_ref[safe_splits, qrow], -jnp.inf)


def _merge_weights(lse, split_rows):
    """Weights exp2(lse - max lse) over the splits of one query row, their sum and the max.
    The merge kernel and the fused merge share these helpers: same arithmetic, same order."""
    _, in_range = split_rows
    lse_max = jnp.max(lse)
    has_values = lse_max > -jnp.inf
    weights = jnp.where(in_range & has_values, jnp.exp2(lse - jnp.where(has_values, lse_max, 0.0)), 0.0)
    return weights, jnp.sum(weights), lse_max


def _merge_columns(partial, load_gate, o_ref, residual_refs, qrow, cols, split_rows, merge_weights):
    """Merge the splits' ``partial`` [S_pow2, block_d] of query row ``qrow``, columns ``cols``;
    gate (``load_gate()``: the gate chunk, loaded there or earlier); store."""
    _, in_range = split_rows
    weights, denominator, lse_max = merge_weights
    # Out-of-range splits re-read split S-1; zero them with where (weight 0
    # alone would keep a NaN/inf partial, which cannot occur, but be exact).
    partial = jnp.where(in_range[:, None], partial, 0.0)
    merged = jnp.sum(partial * weights[:, None], axis=0)
    merged = jnp.where(denominator > 0, merged / jnp.where(denominator > 0, denominator, 1.0), 0.0)
    gate = load_gate().astype(jnp.float32)
    o_ref[qrow, cols] = _gated(merged, gate)
    if residual_refs:  # for the backward pass; every D chunk stores the same LSE
        attn_ref, lse_out_ref = residual_refs
        attn_ref[qrow, cols] = merged.astype(jnp.bfloat16)
        lse_out_ref[qrow] = jnp.where(
            denominator > 0, lse_max + jnp.log2(jnp.where(denominator > 0, denominator, 1.0)), -jnp.inf)


def _merge_kernel(part_ref, lse_ref, gate_ref, o_ref, *residual_refs, num_splits: int, block_s: int,
                  block_d: int):
    # One program per (row * H + head, D chunk): weights exp2(lse - max lse) over splits.
    qrow = pl.program_id(0)
    cols = pl.ds(pl.program_id(1) * block_d, block_d)
    split_rows = _split_rows(num_splits, block_s)
    weights = _merge_weights(_load_lse(lse_ref, qrow, split_rows), split_rows)
    _merge_columns(part_ref[split_rows[0], qrow, cols], lambda: gate_ref[qrow, cols], o_ref, residual_refs,
                   qrow, cols, split_rows, weights)


def run(problem: SparseAttentionProblem, q, kv_arrays, logical_indices, block_table,
        token_to_req, output_gate, scales=None, *, residuals: bool = False):
    """bf16 [rows, H, D]; with ``residuals`` (for backward.py) also the ungated attention
    in bf16 [rows, H, D] and the merged base-2 LSE [rows, H] fp32, written by the same
    kernels as extra outputs (the gated output is computed exactly as without them).
    Launched as ``config.pallas_launch(problem)`` says (``problem.launch`` overrides), at
    ``config.pallas_tiling(problem)`` (Pallas's own split count where the measured table names one)."""
    tiling = pallas_tiling(problem)
    p = problem if tiling == problem.config else dataclasses.replace(problem, config=tiling)
    rows, heads, d = p.num_rows, p.num_query_heads, p.head_dim
    if rows == 0:
        out = jnp.zeros((0, heads, d), jnp.bfloat16)
        return (out, out, jnp.zeros((0, heads), jnp.float32)) if residuals else out
    result = split_kernel(p, q, kv_arrays, logical_indices, block_table, token_to_req, output_gate,
                          scales, residuals=residuals)
    if p.config.num_splits == 1 or pallas_launch(p).merge == "fused":
        if residuals:
            out, attention, lse = result
            return out.reshape(rows, heads, d), attention.reshape(rows, heads, d), lse.reshape(rows, heads)
        return result.reshape(rows, heads, d)
    partial, lse = result
    return merge_kernel(p, partial, lse, output_gate, residuals=residuals)


def split_kernel(p: SparseAttentionProblem, q, kv_arrays, logical_indices, block_table,
                 token_to_req, output_gate, scales=None, *, residuals: bool = False):
    """The attention kernel alone: bf16 output [rows*H, D] with one split or the fused
    merge (``PallasLaunch.merge``), else the fp32 partials [S, rows*H, D] and base-2 LSEs
    [S, rows*H] for ``merge_kernel``.
    The fp8 K conversion order follows ``config.pallas_fp8_keys_via_f16`` (bit-identical)."""
    rows, heads, d = p.num_rows, p.num_query_heads, p.head_dim
    kv = p.kv
    launch = pallas_launch(p)
    num_splits = p.config.num_splits
    block_m = max(16, next_pow2(p.group_size))  # tl.dot needs >= 16 rows
    interpreted = interpret()

    # Free reshapes only (contiguous arrays): no copy of the cache or q.
    if kv.fused:
        k_rows = v_rows = kv_arrays[0].reshape(kv.num_rows, 2 * d)
    else:
        k_rows = kv_arrays[0].reshape(kv.num_rows, d)
        v_rows = kv_arrays[1].reshape(kv.num_rows, d)
    q2 = q.reshape(-1, d)  # the query table: q itself, or a StridedQuery's table
    gate2 = output_gate.reshape(rows * heads, d)

    one_split = num_splits == 1
    fused = not one_split and launch.merge == "fused"
    output = jax.ShapeDtypeStruct((rows * heads, d), jnp.bfloat16)
    output = (output, output, jax.ShapeDtypeStruct((rows * heads,), jnp.float32)) if residuals else (output,)
    partials = (jax.ShapeDtypeStruct((num_splits, rows * heads, d), jnp.float32),
                jax.ShapeDtypeStruct((num_splits, rows * heads), jnp.float32))
    if one_split:
        out_shape = output if residuals else output[0]
    elif fused:  # the merged output(s), the partials (scratch), the arrival counters
        out_shape = output + partials + (jax.ShapeDtypeStruct((rows * p.num_kv_heads,), jnp.int32),)
    else:
        out_shape = partials
    kernel = functools.partial(_attention_kernel, p=p, block_m=block_m, one_split=one_split,
                               masked=not interpreted, prefetch=launch.prefetch,
                               fp8_keys_via_f16=config.pallas_fp8_keys_via_f16(),
                               fp8_value_pairs=config.pallas_fp8_value_pairs(),
                               fp8_keys_f16_dot=config.pallas_fp8_keys_f16_dot(),
                               fused_merge=fused, merge_block_d=launch.merge_block_d)
    inputs = (q2, k_rows, v_rows, logical_indices, block_table, token_to_req, gate2)
    inputs += (scales,) if p.scaled else ()
    aliases = {}
    if fused:
        # Zeroed per call (a memset on the GPU): the kernel counts arrivals into it in place.
        aliases = {len(inputs): len(out_shape) - 1}
        inputs += (jnp.zeros((rows * p.num_kv_heads,), jnp.int32),)
    result = _vma.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(rows, p.num_kv_heads, num_splits),
        in_specs=[pl.no_block_spec] * len(inputs),
        out_specs=jax.tree.map(lambda _: pl.no_block_spec, out_shape),
        input_output_aliases=aliases,
        compiler_params=plgpu.CompilerParams(num_warps=launch.num_warps, num_stages=launch.num_stages),
        interpret=interpreted,
        name="qsa_sparse_attention",
    )(*inputs)
    if fused:
        merged = result[:len(output)]
        return merged if residuals else merged[0]
    return result


def merge_kernel(p: SparseAttentionProblem, partial, lse, output_gate, *, residuals: bool = False):
    """The split merge + gate epilogue: bf16 [rows, H, D] from ``split_kernel``'s partials
    (D columns per program and warps: ``merge_block_d``/``merge_warps`` of the launch)."""
    rows, heads, d = p.num_rows, p.num_query_heads, p.head_dim
    num_splits = p.config.num_splits
    launch = pallas_launch(p)
    block_d = launch.merge_block_d
    out_shape = jax.ShapeDtypeStruct((rows * heads, d), jnp.bfloat16)
    if residuals:  # + ungated attention (bf16) and merged LSE, for the backward pass
        out_shape = (out_shape, out_shape, jax.ShapeDtypeStruct((rows * heads,), jnp.float32))
    merged = _vma.pallas_call(
        functools.partial(_merge_kernel, num_splits=num_splits, block_s=next_pow2(num_splits),
                          block_d=block_d),
        out_shape=out_shape,
        grid=(rows * heads, d // block_d),
        in_specs=[pl.no_block_spec] * 3,
        out_specs=jax.tree.map(lambda _: pl.no_block_spec, out_shape),
        compiler_params=plgpu.CompilerParams(num_warps=launch.merge_warps, num_stages=1),
        interpret=interpret(),
        name="qsa_merge_splits",
    )(partial, lse, output_gate.reshape(rows * heads, d))
    if residuals:
        out, attention, merged_lse = merged
        return out.reshape(rows, heads, d), attention.reshape(rows, heads, d), merged_lse.reshape(rows, heads)
    return merged.reshape(rows, heads, d)

