"""Pallas backward of sparse paged attention (Triton lowering on GPU, interpreter on CPU).

The gradient contract and the formulas are in ``backward.py``. Layout of the work:

* XLA pre-passes: over [R, H, D], dA = dO * sigmoid(gate), delta = rowsum(dA * A)
  and dgate (``backward.gate_pre_pass``); over [R, W] int32, the cache row of every
  entry to walk (``entry_lists``: the same validity and consumed-tile rules as the
  forward, from ``base.entry_rows``; in the order ``ORDERS`` describes).
* One kernel, one program per (row, KV head, split): like the forward it gathers the
  K/V rows of its tiles straight out of the cache (K and V transposed, [D, BN], by
  address) and rebuilds the probabilities from the stored LSE, p = exp2(s - lse):
  no softmax statistics pass and nothing [rows, H, W] is ever materialised -- per
  program the live arrays are [G, BN] and [BN, D].
  - dq for the program's G query heads accumulates in registers over its tiles;
    with one split it is stored, with several it is added atomically to an fp32
    [R*H, D] buffer.
  - dK/dV of a tile ([BN, D] each; the G query heads already summed by the dots) are
    added with fp32 atomics (relaxed order, 4-wide: ``_add_rows``) into one fp32
    accumulator [rows, 2D], dK | dV per cache row, over the whole cache or only the pages
    the block table names (``named_pages``); it converts to the fused cache's layout
    without a reshuffle: rows that select the same token and
    requests that share pages accumulate. Invalid entries (padding, past the count,
    bad request/page) are masked out of the atomics, so unreferenced rows stay
    exactly 0. Atomics make the summation order, hence the last bits of dK/dV (and
    of dq with several splits), run-dependent on the GPU: not deterministic.
* ``order="inverted"`` (token-major dK/dV; the default wherever it can launch, see
  ``resolve_order``): the kernel above computes only dq, and ``_inverted_kernel`` computes
  dK/dV per block of cache slots from the inverse of the entry lists (``inverted_index``):
  fp32 sums in registers, each cache row written once in the cache dtype -- no atomics, no
  cache-sized fp32 accumulator, deterministic dK/dV (dq still takes atomics when a row is
  split).
* Padded query rows (G -> a power of two >= 16) repeat head G-1, as in the forward;
  they are masked out of the dK/dV sums and of the dq atomics.

In interpret mode Pallas's atomic add neither takes a mask nor accumulates repeated
indices within one call, so there each entry's row is added in turn (programs run
one after another there, so a read-modify-write is exact).

Precision: dots take bf16 operands (q, K, V, and dA, p, dS rounded to bf16) with fp32
accumulation, like the forward's P.V; the measured error against the float64 gradient
is stated in tests/test_backward.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from qsa_jax.ops import _vma
from qsa_jax.ops._pallas_support import interpret, next_pow2, pl, plgpu
from qsa_jax.ops._relaxed_atomics import relaxed_atomic_add
from qsa_jax.ops.sparse_attention import backward as B
from qsa_jax.ops.sparse_attention.base import (
    LOG2_E, SparseAttentionProblem, as_e4m3, entry_rows, head_row_stride)
from qsa_jax.ops.sparse_attention.pallas import _load_rows

# Backward tile: [BN, D] fp32 dK and dV contributions live in registers per tile.
# Compiled for sm_90 on the CPU machine (Triton 3.6, ptxas -v; notes/backward.md) at
# D = 256, G = 12: BN 32 / 4 warps uses 255 registers and spills, BN 32 / 8 warps 184
# registers and no spills (173-180 since the entries are resolved in XLA), BN 64 / 8
# warps spills again. Tunable per call.
DEFAULT_BLOCK_N = 32
DEFAULT_WARPS = 8
# The dK/dV/dq atomics' memory order (see _add_rows): relaxed, 2.7x faster than Pallas's
# acquire-release for the whole kernel on an H200 (notes/backward.md, session 5).
RELAXED_ATOMICS = True
# How each row's entries are walked (pallas_backward's ``order``):
# * "selection": in the selection's column order; splits (only at small row counts, to
#   fill the GPU) take tiles round-robin. Each entry's dK/dV goes to a random cache
#   row, so with caches larger than the L2 nearly every fp32 atomic misses it: a DRAM
#   read and a later write-back of 2 KB per (entry, KV head).
# * "sorted": each row's valid entries sorted by cache row, and split s of every row
#   takes the same share [s/S, (s+1)/S) of its sorted list (one 32-entry tile per
#   program by default). The grid runs split-major, so the programs in flight at a time
#   all add into the same 1/S of the cache: a row's several referencing rows hit its
#   accumulator while it is still in the L2. Costs: an XLA sort of [R, W] int32, and
#   per program a q/dA load and an atomic dq add ([G, D] fp32). An experiment until
#   measured (notes/backward.md, session 6).
# * "inverted": token-major dK/dV (``_inverted_kernel``). dq comes from the "selection"
#   walk with its dK/dV part switched off; dK/dV from one program per (block of
#   ``block_n`` consecutive cache slots of a page, KV head) that walks the rows
#   referencing its block (``inverted_index``, built per call in XLA), sums dK/dV in fp32
#   registers and writes each cache row once in the cache dtype: no atomics, no
#   cache-sized accumulator, deterministic.
ORDERS = ("selection", "sorted", "inverted")
# order=None: "inverted" where it can launch at its default knobs (resolve_order), else this
# one. H200, session 10 (bench/results/nvidia-h200_2026-12-04/session10/): the inverted
# backward with its dq walk at 2 warps took 1.05 / 5.02 / 9.12 ms at TP1 64 / 1024 / 2048
# rows (one request per row) against 1.98 / 10.62 / 19.46 for "selection", 2.54 against 5.99
# at TP4 1024, 9.64 against 19.74 ms for one 2048-token sequence; temp memory 6-185 MB
# against up to ~2 GB with one request per row (the selection walk's fp32 accumulator over
# the cache; 142-288 MB for one long sequence, whose named pages are few).
DEFAULT_WALK = "inverted"
FALLBACK_WALK = "selection"
# The inverted kernel: cache slots per program (a multiple of the selection's 4-token
# blocks; >= 16 for Triton's dots; must divide the page size) and (row, query head)
# lanes per step of its walk (the M of its dots). Compiled for sm_90 on the CPU machine
# (tools/sm90_compile_grad.py --order inverted, D = 256, 8 warps): 32 lanes 106 registers,
# 52 KB shared (two programs per SM); 64 lanes 234 registers, 88 KB (one); no spills.
INVERTED_BLOCK_ROWS = 16
INVERTED_LANES = 32
# Its warps: 2. Its dots are [lanes, block_n] = [32, 16] tiles, which 8 warps likely cover
# by repeating work. H200, TP1 1024 rows, one request per row (session 9): the kernel took
# 6.76 ms at 8 warps, 4.68 at 4 and 2.99 at 2; at 8 warps Nsight read 4.3x the HMMA
# instructions of the selection walk (which computes dq as well). At 2 warps ptxas gives 255
# registers and 8-28 bytes of spill stores (sm_90 on CPU; not read on the GPU), against 133
# registers and none at 4.
INVERTED_WARPS = 2
# The inverted order's dq walk (the kernel above without its dK/dV tile): H200, session 10,
# TP1 1024 rows: 3.11 ms at 8 warps, 1.90 at 4, 1.61 at 2 (TP4: 1.55 / 1.02 / 0.82 ms);
# sm_90 on CPU (session 9): 191-237 registers at 2 warps, no spills.
INVERTED_DQ_WARPS = 2
# Enough (row, KV head, split) programs to fill an H200 (132 SMs) a few times over.
TARGET_PROGRAMS = 512


def _dot(a, b, contract):
    """fp32-accumulated dot contracting axis ``contract[0]`` of a with ``contract[1]`` of b."""
    return lax.dot_general(a, b, ((contract[:1], contract[1:]), ((), ())),
                           preferred_element_type=jnp.float32)


def _scales(p: SparseAttentionProblem, scales_ref):
    """(score multiplier, dq/dK factor, output scale or None): ``backward.gradient_scales``
    read from the kernel's scale operand (fp32), or the 0.30.0 constants without one."""
    if scales_ref is None:
        score_scale, scale, _ = B.gradient_scales(p, None, jnp.float32)
        return score_scale, scale, None
    multiplier = scales_ref[0]
    return multiplier, multiplier * (1.0 / LOG2_E), scales_ref[1]


def _times(x, factor):
    """x * factor; nothing at all without a factor (the unscaled kernels stay as they were)."""
    return x if factor is None else x * factor


def _decoded(tile):
    """A gathered cache tile as the dots' bf16: e4m3 values (or their uint8 bytes) convert
    exactly; a bf16 tile is returned as is."""
    return tile if tile.dtype == jnp.bfloat16 else as_e4m3(tile).astype(jnp.bfloat16)


def _add_rows(ref, row_index, col0: int, values, valid, interpreted: bool, relaxed: bool):
    """ref[row_index[i], col0 : col0 + width] += values[i] for every i with valid[i] (fp32)."""
    if not interpreted:
        cols = col0 + lax.broadcasted_iota(jnp.int32, (values.shape[1],), 0)
        mask = jnp.broadcast_to(valid[:, None], values.shape)
        # Relaxed order is enough: these atomics only accumulate (no program reads the
        # sums or publishes other memory through them), and the results are read by
        # XLA after the launch has completed. See qsa_jax/ops/_relaxed_atomics.py.
        add = relaxed_atomic_add if relaxed else plgpu.atomic_add
        add(ref, (row_index[:, None], cols[None, :]), values, mask=mask)
        return

    span = pl.ds(col0, values.shape[1])

    def body(i, carry):
        r = row_index[i]
        value = lax.dynamic_index_in_dim(values, i, keepdims=False)
        ref[r, span] = ref[r, span] + jnp.where(valid[i], value, 0.0)
        return carry

    lax.fori_loop(0, row_index.shape[0], body, 0)


def _backward_kernel(q_ref, k_ref, v_ref, rows_ref, acc_rows_ref, da_ref, delta_ref, lse_ref, end_ref,
                     _dq_in, _dkv_in, *refs, p: SparseAttentionProblem, block_m: int,
                     block_n: int, num_splits: int, contiguous: bool, compact: bool, interpreted: bool,
                     relaxed: bool, with_dkv: bool = True):
    # With k/v scales a (2,) fp32 ref [score multiplier, output scale] precedes the outputs.
    scales_ref, (dq_ref, dkv_ref) = (refs[0], refs[1:]) if p.scaled else (None, refs)
    kv = p.kv
    d, g, heads = p.head_dim, p.group_size, p.num_query_heads
    bn = block_n
    k_col, v_col = 0, (d if kv.fused else 0)
    row, head, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)

    lanes = lax.broadcasted_iota(jnp.int32, (block_m,), 0)
    real = lanes < g  # padded lanes repeat head G-1 (see the module docstring)
    group = jnp.minimum(lanes, g - 1)
    q_rows = row * heads + head * g + group
    q = q_ref[p.queries.row(row, head * g + group), :]  # [M, D] bf16
    da16 = da_ref[q_rows, :]  # [M, D] bf16: the dots' operand (delta was formed from it too)
    delta = delta_ref[q_rows]
    lse = lse_ref[q_rows]

    end = end_ref[row]  # entries [0, end) of the row's list are the ones to walk
    tiles = (end + bn - 1) // bn
    if contiguous:  # split s: tiles [ceil(s T / S), ceil((s+1) T / S)), the same share of every row
        first = (split * tiles + num_splits - 1) // num_splits
        num_steps = ((split + 1) * tiles + num_splits - 1) // num_splits - first
    else:  # round-robin: split s takes tiles s, s + S, ...
        first = split
        num_steps = (jnp.maximum(tiles - split, 0) + num_splits - 1) // num_splits
    stride = 1 if contiguous else num_splits
    head_offset = head * head_row_stride(kv)
    columns = lax.broadcasted_iota(jnp.int32, (bn,), 0)
    dims = lax.broadcasted_iota(jnp.int32, (d,), 0)
    score_scale, scale, value_scale = _scales(p, scales_ref)

    def body(step, dq_acc):
        cols = (first + step * stride) * bn + columns
        entry = rows_ref[row, jnp.minimum(cols, p.selection_width - 1)]
        valid = (cols < end) & (entry >= 0)
        cache_row = jnp.where(valid, entry + head_offset, 0)  # row 0: a safe address
        if compact:  # the accumulator holds the named pages only (named_pages)
            acc_entry = acc_rows_ref[row, jnp.minimum(cols, p.selection_width - 1)]
            acc_row = jnp.where(valid, acc_entry + head_offset, 0)
        else:
            acc_row = cache_row
        # Both gathered [D, BN] by address; zeros (never NaN) where invalid.
        keys_t = _decoded(_load_rows(k_ref, cache_row[None, :], (k_col + dims)[:, None], valid[None, :],
                                     not interpreted))
        values_t = _decoded(_load_rows(v_ref, cache_row[None, :], (v_col + dims)[:, None], valid[None, :],
                                       not interpreted))
        scores = jnp.dot(q, keys_t, preferred_element_type=jnp.float32) * score_scale
        # The stored LSE turns scores into probabilities directly (-inf LSE only
        # for rows with no valid entry, which the where discards).
        probs = jnp.where(valid[None, :], jnp.exp2(scores - lse[:, None]), 0.0)  # [M, BN]
        dp = _times(jnp.dot(da16, values_t, preferred_element_type=jnp.float32), value_scale)
        ds = probs * (dp - delta[:, None])
        dq_acc = dq_acc + _dot(ds.astype(jnp.bfloat16), keys_t, (1, 1))  # [M, D]
        if not with_dkv:  # order="inverted": dK/dV come from _inverted_kernel
            return dq_acc
        ds_kv = jnp.where(real[:, None], ds, 0.0).astype(jnp.bfloat16)
        p_kv = jnp.where(real[:, None], probs, 0.0).astype(jnp.bfloat16)
        d_keys = _dot(ds_kv, q, (0, 0)) * scale  # [BN, D]
        d_values = _times(_dot(p_kv, da16, (0, 0)), value_scale)
        # One fp32 accumulator row per cache row: dK in columns [0, D), dV in [D, 2D).
        _add_rows(dkv_ref, acc_row, 0, d_keys, valid, interpreted, relaxed)
        _add_rows(dkv_ref, acc_row, d, d_values, valid, interpreted, relaxed)
        return dq_acc

    dq = lax.fori_loop(0, num_steps, body, jnp.zeros((block_m, d), jnp.float32)) * scale
    if num_splits == 1:
        dq_ref[q_rows, :] = dq  # padded lanes store head G-1's identical value
    else:
        _add_rows(dq_ref, q_rows, 0, dq, real, interpreted, relaxed)


def _inverted_kernel(q_ref, k_ref, v_ref, pages_ref, starts_ref, ref_rows_ref, counts_ref, da_ref,
                     delta_ref, lse_ref, zeros_ref, *refs, p: SparseAttentionProblem, block_rows: int,
                     lanes: int, compact: bool, interpreted: bool):
    """dK|dV of one (block of ``block_rows`` cache slots, KV head), written once.

    ``dkv_ref``: with ``compact`` the cache-shaped, zero-filled gradient (aliased to
    ``zeros_ref``), whose named pages' rows the blocks write directly (the compacted slots
    map to them through ``pages_ref``; padding pages write nothing); else the accumulator
    [cache rows, 2D] itself, every row written.

    The block's references (rows that select any of its slots, ``inverted_index``) are
    walked ``lanes`` (row, query head) pairs at a time -- the references flattened with
    their G heads, so a G of 12 pads no lane. Per step: p and dS of the lanes against
    the block's K/V ([lanes, BR], weighted by how many times the lane's row selects
    each slot; 0 where it selects none), and dK += dSᵀq, dV += pᵀdA ([BR, D] fp32).
    """
    scales_ref, (dkv_ref,) = (refs[0], refs[1:]) if p.scaled else (None, refs)
    kv = p.kv
    d, g, heads, br = p.head_dim, p.group_size, p.num_query_heads, block_rows
    k_col, v_col = 0, (d if kv.fused else 0)
    block, head = pl.program_id(0), pl.program_id(1)
    slot0 = block * br  # blocks never straddle a page: br divides the page size
    acc_page, token0 = slot0 // kv.page_size, slot0 % kv.page_size
    page = jnp.minimum(pages_ref[acc_page], kv.num_pages - 1) if compact else acc_page  # padding pages: no refs
    tokens = token0 + lax.broadcasted_iota(jnp.int32, (br,), 0)
    cache_row = kv.row_index(page, tokens, head)
    start, end = starts_ref[block], starts_ref[block + 1]
    pairs = (end - start) * g
    dims = lax.broadcasted_iota(jnp.int32, (d,), 0)
    # An empty block loads nothing (masked on the GPU) and writes zeros.
    live = jnp.broadcast_to(end > start, (1, br))
    keys_t = _decoded(_load_rows(k_ref, cache_row[None, :], (k_col + dims)[:, None], live, not interpreted))
    values_t = _decoded(_load_rows(v_ref, cache_row[None, :], (v_col + dims)[:, None], live, not interpreted))
    lane = lax.broadcasted_iota(jnp.int32, (lanes,), 0)
    slots = lax.broadcasted_iota(jnp.int32, (br,), 0)
    score_scale, scale, value_scale = _scales(p, scales_ref)

    def body(step, carry):
        d_keys, d_values = carry
        pair = step * lanes + lane
        ok = pair < pairs
        pair = jnp.minimum(pair, pairs - 1)  # past the end: repeat the last lane, masked below
        ref, j = start + pair // g, pair % g
        row = ref_rows_ref[ref]
        q = q_ref[p.queries.row(row, head * g + j), :]  # [M, D] bf16
        flat = row * heads + head * g + j
        da16 = da_ref[flat, :]
        delta, lse = delta_ref[flat], lse_ref[flat]
        times = counts_ref[ref[:, None], slots[None, :]]  # [M, BR] multiplicities
        use = ok[:, None] & (times > 0)
        scores = jnp.dot(q, keys_t, preferred_element_type=jnp.float32) * score_scale
        # where, never a multiply: a slot nobody here selects may hold NaN (and huge K).
        probs = jnp.where(use, jnp.exp2(scores - lse[:, None]), 0.0)  # [M, BR]
        dp = _times(jnp.dot(da16, values_t, preferred_element_type=jnp.float32), value_scale)
        ds = jnp.where(use, probs * (dp - delta[:, None]), 0.0)
        weight = times.astype(jnp.float32)  # a token selected twice counts twice
        d_keys = d_keys + _dot((ds * weight).astype(jnp.bfloat16), q, (0, 0)) * scale  # [BR, D]
        d_values = d_values + _times(_dot((probs * weight).astype(jnp.bfloat16), da16, (0, 0)), value_scale)
        return d_keys, d_values

    zero = jnp.zeros((br, d), jnp.float32)
    d_keys, d_values = lax.fori_loop(0, (pairs + lanes - 1) // lanes, body, (zero, zero))
    if not compact:
        out_row = kv.row_index(acc_page, tokens, head)
        dkv_ref[out_row[:, None], dims[None, :]] = d_keys.astype(dkv_ref.dtype)
        dkv_ref[out_row[:, None], (d + dims)[None, :]] = d_values.astype(dkv_ref.dtype)
        return
    # The named page's own rows; a padding page (index NB) has no rows and writes nothing
    # (its clamped rows belong to a real page that another program writes).
    named = jnp.broadcast_to(pages_ref[acc_page] < kv.num_pages, (br, d))
    out_row = kv.row_index(page, tokens, head)[:, None]
    for cols, values in ((dims, d_keys), (d + dims, d_values)):
        _store_rows(dkv_ref, out_row, cols[None, :], values.astype(dkv_ref.dtype), named, not interpreted)


def _store_rows(ref, row_index, col_index, values, valid, masked: bool):
    """``ref[row_index, col_index] = values`` where ``valid``; elsewhere ``ref`` keeps its
    contents. On the GPU a masked store; the interpreter (programs run one after another)
    writes back what it read where not ``valid``."""
    if masked:
        plgpu.store(ref.at[row_index, col_index], values, mask=valid)
        return
    ref[row_index, col_index] = jnp.where(valid, values, ref[row_index, col_index])


def inverted_index(p: SparseAttentionProblem, acc, num_slots: int, block_rows: int):
    """The inverse of the entry lists, per block of ``block_rows`` accumulator slots.

    ``acc``: [R, W] head-0 accumulator rows of the valid entries, -1 elsewhere (``entry_lists``,
    "selection"); ``num_slots``: accumulator pages x page size (slot = page * P + token).
    Returns (starts [num_blocks + 1], ref_rows [R*W], counts [R*W, block_rows]) int32 (counts
    int16 for W < 2**15): the
    references of block b are ``starts[b] .. starts[b+1]``, each a row that selects some of
    the block's slots, ``counts`` times each (duplicated entries count once per occurrence).
    Built with one stable sort of the valid entries by block (row-major positions, so rows
    stay ascending inside a block) and scans; static sizes (R*W references at most).
    """
    kv = p.kv
    rows, width = acc.shape
    n = rows * width
    if n >= 2**31:
        raise ValueError(f"order='inverted' needs rows x W < 2**31 entries; got {rows} x {width}")
    flat = acc.reshape(-1)
    valid = flat >= 0
    if kv.fused:  # head-0 row = page * Hk * P + token
        span = kv.num_kv_heads * kv.page_size
        slot = (flat // span) * kv.page_size + flat % span
    else:  # head-0 row = (page * P + token) * Hk
        slot = flat // kv.num_kv_heads
    num_blocks = num_slots // block_rows
    block = jnp.where(valid, slot // block_rows, num_blocks)  # invalid entries sort last
    block_s, position = lax.sort((block, jnp.arange(n, dtype=jnp.int32)), num_keys=1, is_stable=True)
    row = position // width
    sub = jnp.where(valid, slot % block_rows, 0)[position]
    live = block_s < num_blocks
    new = live & jnp.concatenate([jnp.ones((1,), bool),
                                  (block_s[1:] != block_s[:-1]) | (row[1:] != row[:-1])])
    before = jnp.cumsum(new, dtype=jnp.int32)  # references started up to each entry
    target = jnp.where(live, before - 1, n)  # row n: dropped
    ref_rows = jnp.zeros((n,), jnp.int32).at[target].set(row, mode="drop")
    # A multiplicity is at most W: int16 when that fits (half the bytes of this, the
    # largest array of the index: R*W x block_rows).
    count_dtype = jnp.int16 if width < 2**15 else jnp.int32
    counts = jnp.zeros((n, block_rows), count_dtype).at[target, sub].add(1, mode="drop")
    first = jnp.searchsorted(block_s, jnp.arange(num_blocks + 1, dtype=jnp.int32), side="left")
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), before])[first]
    return starts.astype(jnp.int32), ref_rows, counts


def default_splits(p: SparseAttentionProblem, block_n: int) -> int:
    tiles = -(-p.selection_width // block_n)
    programs = max(1, p.num_rows * p.num_kv_heads)
    return max(1, min(tiles, -(-TARGET_PROGRAMS // programs)))


def named_pages(p: SparseAttentionProblem, block_table):
    """The accumulator's pages when it can be smaller than the cache, else None.

    Only pages that the block table names can receive a gradient. When the table has
    fewer entries than the cache has pages (static: NR x BTW < NB, e.g. one long
    sequence in a large pool), the fp32 accumulator holds just those: (pages [K] int32,
    the named physical pages ascending, padded with NB; slot [NB] int32, each page's
    place in ``pages`` or -1), K = NR x BTW. Its zero fill and conversion then cost K
    pages instead of NB; the gradient of every other page is a plain bf16 zero.
    """
    kv = p.kv
    bound = p.num_requests * p.table_width
    if bound >= kv.num_pages:
        return None
    named = block_table.reshape(-1)
    named = jnp.where((named >= 0) & (named < kv.num_pages), named, kv.num_pages)
    pages = jnp.unique(named, size=bound, fill_value=kv.num_pages).astype(jnp.int32)
    slot = jnp.full((kv.num_pages,), -1, jnp.int32).at[pages].set(
        jnp.arange(bound, dtype=jnp.int32), mode="drop")  # the NB padding is dropped
    return pages, slot


def _kv_cotangent(p: SparseAttentionProblem, kv_arrays, dkv, compaction, dtype=None):
    """The fp32 accumulator (dK | dV per row, ``compaction``'s pages or the whole cache)
    in ``kv_arrays``' layout and ``dtype`` (None: the cache's): for the fused cache a
    conversion in place of the row order it already has (and, for the selection walk with
    compaction, a scatter of whole pages; the inverted walk writes its named pages in place
    and arrives without compaction)."""
    kv, d = p.kv, p.head_dim
    if compaction is None:
        if kv.fused:
            return (dkv.reshape(kv_arrays[0].shape).astype(kv_arrays[0].dtype if dtype is None else dtype),)
        return B.kv_cotangent(p, kv_arrays, dkv[:, :d], dkv[:, d:], dtype)
    pages = compaction[0]
    per_page = dkv.reshape((pages.shape[0],) + kv_arrays[0].shape[1:-1] + (2 * d,))
    halves = (per_page,) if kv.fused else (per_page[..., :d], per_page[..., d:])
    # Padding pages (index NB) fall outside the cache and are dropped.
    dtypes = [a.dtype if dtype is None else dtype for a in kv_arrays]
    return tuple(jnp.zeros(a.shape, t).at[pages].set(h.astype(t), mode="drop")
                 for a, h, t in zip(kv_arrays, halves, dtypes))


def entry_lists(p: SparseAttentionProblem, logical_indices, block_table, token_to_req, order: str,
                compaction=None):
    """Per row, the head-0 cache rows of the entries the backward walks [R, W] int32, their
    rows in the accumulator (the same array without ``compaction``) and how many leading
    ones to walk [R] -- resolved once in XLA (a few MB), not per KV head and split in the
    kernel.

    "selection": the selection's own column order (-1 where an entry is invalid), up to
    the end of the tiles the forward consumed. "sorted": only the valid entries, in
    ascending cache row (see ORDERS).
    """
    kv, w = p.kv, p.selection_width
    row0, valid = entry_rows(p, logical_indices[:, :w], block_table, token_to_req)
    valid &= B.used_columns(p, logical_indices, jnp.arange(w, dtype=jnp.int32))
    if compaction is None:
        acc0 = row0
    else:  # the same (token, head 0) offset inside the page, in the page's accumulator slot
        page, offset = row0 // (kv.num_kv_heads * kv.page_size), row0 % (kv.num_kv_heads * kv.page_size)
        acc0 = compaction[1][page] * (kv.num_kv_heads * kv.page_size) + offset
    if order == "selection":
        end = jnp.minimum(B.consumed_end(p, logical_indices), w)  # columns the forward consumed
        entries = jnp.where(valid, row0, -1).astype(jnp.int32)
        acc = entries if compaction is None else jnp.where(valid, acc0, -1).astype(jnp.int32)
        return entries, acc, end.astype(jnp.int32)
    # Invalid entries sort last (past the end, never walked).
    key = jnp.where(valid, row0, jnp.iinfo(jnp.int32).max).astype(jnp.int32)
    if compaction is None:
        entries = jnp.sort(key, axis=1)
        acc = entries
    else:
        entries, acc = lax.sort((key, acc0.astype(jnp.int32)), dimension=1, num_keys=1)
    return entries, acc, jnp.sum(valid, axis=1, dtype=jnp.int32)


def pallas_backward(problem: SparseAttentionProblem, q, kv_arrays, logical_indices, block_table,
                    token_to_req, output_gate, attention, lse, d_out, scales=None, *, block_n: int | None = None,
                    num_splits: int | None = None, num_warps: int | None = None,
                    relaxed_atomics: bool | None = None, order: str | None = None,
                    lanes: int | None = None, dq_warps: int | None = None, kv_dtype=None):
    """Cotangents (dq table, dkv_arrays, dgate[, dscales with ``scales``]); see the module
    docstring. ``kv_dtype``: the cache cotangents' dtype (None: the cache's, fp32 for an fp8
    cache; a mesh sums row shards' fp32 ones).
    ``relaxed_atomics=False`` lowers the fp32 atomics with Pallas's own acquire-release
    order instead (the benchmark's A/B switch; same sums); None: ``RELAXED_ATOMICS``.
    ``order``: how each row's entries are walked and split (``ORDERS``); None:
    ``resolve_order``'s choice. With "inverted", ``block_n``, ``num_warps`` and ``lanes`` are
    the dK/dV kernel's (None: ``INVERTED_BLOCK_ROWS``, ``INVERTED_WARPS``, ``INVERTED_LANES``)
    and the dq walk keeps its tile (``num_splits`` still applies to it); ``dq_warps``: the dq
    walk's warps (None: ``INVERTED_DQ_WARPS``; only with "inverted", where the walk has no
    dK/dV tile to hold -- sm_90 on CPU: no spills at 2 or 4 warps)."""
    p = problem
    rows, heads, d = p.num_rows, p.num_query_heads, p.head_dim
    kv = p.kv
    asked = order
    order = resolve_order(p, order)
    inverted = order == "inverted"
    for name, value in (("dq_warps", dq_warps), ("lanes", lanes)):
        if value is not None and not inverted:
            why = "" if asked else " (order=None chose it: the inverted walk's 16-slot blocks cannot launch here)"
            raise ValueError(f"{name} is the inverted order's knob; got it with order={order!r}{why}")
    if dq_warps is not None and (dq_warps < 1 or dq_warps & (dq_warps - 1)):
        raise ValueError(f"dq_warps must be a power of two >= 1; got {dq_warps}")
    if inverted:
        _check_inverted_launch(kv, block_n or INVERTED_BLOCK_ROWS, lanes or INVERTED_LANES, interpret())
    kv_dtype = kv_dtype or (jnp.float32 if p.is_fp8 else None)
    d_attention, delta, d_gate = B.gate_pre_pass(output_gate, attention.reshape(rows, heads, d),
                                                 d_out, jnp.float32, delta_dtype=jnp.bfloat16)
    compaction = named_pages(p, block_table)
    acc_rows = kv.num_rows if compaction is None else compaction[0].shape[0] * (kv.num_rows // kv.num_pages)
    # The dq walk of "inverted" never touches its dK/dV accumulator: a placeholder row.
    zero_kv = jnp.zeros((1 if inverted and rows else acc_rows, 2 * d), jnp.float32)
    if rows == 0:
        dq = jnp.zeros((0, heads, d), jnp.float32)
        return B.with_scale_cotangent(p, (B.dq_to_table(p, q, dq), _kv_cotangent(p, kv_arrays, zero_kv, compaction,
                                                                                 kv_dtype), d_gate),
                                      q, dq, d_attention, attention, scales)
    # "inverted": block_n is the dK/dV kernel's slots per program; dq walks with the default tile.
    bn = (None if inverted else block_n) or DEFAULT_BLOCK_N
    sorted_order = order == "sorted"
    if num_splits:
        splits = num_splits
    elif sorted_order:  # one tile per program at a full selection (see ORDERS)
        splits = -(-p.selection_width // bn)
    else:
        splits = default_splits(p, bn)
    interpreted = interpret()
    entries, acc, end = entry_lists(p, logical_indices, block_table, token_to_req,
                                    "selection" if inverted else order, compaction)
    if kv.fused:
        k_rows = v_rows = kv_arrays[0].reshape(kv.num_rows, 2 * d)
    else:
        k_rows = kv_arrays[0].reshape(kv.num_rows, d)
        v_rows = kv_arrays[1].reshape(kv.num_rows, d)
    block_m = max(16, next_pow2(p.group_size))
    kernel = functools.partial(_backward_kernel, p=p, block_m=block_m, block_n=bn,
                               num_splits=splits, contiguous=sorted_order, compact=compaction is not None,
                               interpreted=interpreted,
                               relaxed=RELAXED_ATOMICS if relaxed_atomics is None else relaxed_atomics,
                               with_dkv=not inverted)
    acc_shapes = (jax.ShapeDtypeStruct((rows * heads, d), jnp.float32),
                  jax.ShapeDtypeStruct(zero_kv.shape, jnp.float32))
    scale_input = () if scales is None else (scales.astype(jnp.float32),)
    da16 = d_attention.reshape(rows * heads, d).astype(jnp.bfloat16)
    delta = delta.reshape(rows * heads)
    lse = lse.reshape(rows * heads).astype(jnp.float32)
    dq, dkv = _vma.pallas_call(
        kernel,
        out_shape=acc_shapes,
        grid=(rows, p.num_kv_heads, splits),
        in_specs=[pl.no_block_spec] * (11 + p.scaled),
        out_specs=(pl.no_block_spec,) * 2,
        # The accumulators start as zeros and are updated in place.
        input_output_aliases={9: 0, 10: 1},  # (the scale operand, if any, is input 11)
        compiler_params=plgpu.CompilerParams(
            num_warps=(dq_warps or INVERTED_DQ_WARPS) if inverted else (num_warps or DEFAULT_WARPS),
            num_stages=2),
        interpret=interpreted,
        name="qsa_sparse_attention_backward",
    )(q.reshape(-1, d), k_rows, v_rows, entries, acc, da16, delta, lse, end,
      jnp.zeros((rows * heads, d), jnp.float32), zero_kv, *scale_input)
    if inverted:
        dkv = _inverted_dkv(p, q, k_rows, v_rows, acc, compaction, acc_rows, da16, delta, lse, scale_input,
                            kv_arrays[0].dtype if kv_dtype is None else kv_dtype, block_n or INVERTED_BLOCK_ROWS,
                            lanes or INVERTED_LANES, num_warps, interpreted)
    # The inverted walk's dK/dV is already cache-shaped (named pages written in place).
    dq = dq.reshape(rows, heads, d)
    return B.with_scale_cotangent(
        p, (B.dq_to_table(p, q, dq), _kv_cotangent(p, kv_arrays, dkv, None if inverted else compaction, kv_dtype),
            d_gate), q, dq, d_attention, attention, scales)


def resolve_order(p: SparseAttentionProblem, order: str | None) -> str:
    """The walk ``pallas_backward`` takes: ``order`` when given (checked against ``ORDERS``);
    for None ``DEFAULT_WALK``, unless that is "inverted" and it cannot launch here at its
    default knobs (its 16-slot blocks must divide the page size; R x W below 2**31 entries),
    then ``FALLBACK_WALK`` -- so a small or odd page size still gets a gradient. The
    choice never depends on the caller's knobs: those apply to the walk chosen here and are
    checked against it (an error names the walk), never silently reinterpreted."""
    if order is not None:
        if order not in ORDERS:
            raise ValueError(f"order must be one of {sorted(ORDERS)}, got {order!r}")
        return order
    if DEFAULT_WALK != "inverted":
        return DEFAULT_WALK
    try:
        _check_inverted_launch(p.kv, INVERTED_BLOCK_ROWS, INVERTED_LANES, interpret())
    except ValueError:
        return FALLBACK_WALK
    if p.num_rows * p.selection_width >= 2**31:
        return FALLBACK_WALK
    return DEFAULT_WALK


def _check_inverted_launch(kv, block_rows: int, lanes: int, interpreted: bool):
    """The inverted kernel's launch knobs, checked before anything is traced or launched:
    blocks never straddle a page, and Triton's dots take power-of-two sides >= 16 (the
    interpreter takes any size: the CPU tests use small pages)."""
    if kv.page_size % block_rows:
        raise ValueError(f"order='inverted' needs block_n dividing the page size {kv.page_size}; "
                         f"got block_n={block_rows}")
    for name, value in (("block_n", block_rows), ("lanes", lanes)):
        if value < 1 or (not interpreted and (value < 16 or value & (value - 1))):
            raise ValueError(f"order='inverted' needs {name} a power of two >= 16 on the GPU; got {value}")


def _inverted_dkv(p: SparseAttentionProblem, q, k_rows, v_rows, acc, compaction, acc_rows: int, da16,
                  delta, lse, scale_input: tuple, dtype, block_rows: int, lanes: int, num_warps: int | None,
                  interpreted: bool):
    """dK|dV from ``_inverted_kernel`` in ``dtype``: [cache rows, 2D] -- without
    ``compaction`` every row written once; with it the named pages' rows written into a
    zero-filled gradient of the whole cache (so no scatter of the pages follows)."""
    kv, d = p.kv, p.head_dim
    num_slots = acc_rows // kv.num_kv_heads
    starts, ref_rows, counts = inverted_index(p, acc, num_slots, block_rows)
    compact = compaction is not None
    pages = compaction[0] if compact else jnp.zeros((1,), jnp.int32)
    # The zero fill is XLA's (a memset); the kernel then writes only the named pages.
    zeros = jnp.zeros((kv.num_rows if compact else 1, 2 * d), dtype)
    kernel = functools.partial(_inverted_kernel, p=p, block_rows=block_rows, lanes=lanes,
                               compact=compact, interpreted=interpreted)
    return _vma.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((kv.num_rows if compact else acc_rows, 2 * d), dtype),
        grid=(num_slots // block_rows, kv.num_kv_heads),
        in_specs=[pl.no_block_spec] * (11 + len(scale_input)),
        out_specs=pl.no_block_spec,
        input_output_aliases={10: 0} if compact else {},  # (the scale operand, if any, is input 11)
        compiler_params=plgpu.CompilerParams(num_warps=num_warps or INVERTED_WARPS, num_stages=2),
        interpret=interpreted,
        name="qsa_sparse_attention_backward_inverted",
    )(q.reshape(-1, d), k_rows, v_rows, pages, starts, ref_rows, counts, da16, delta, lse, zeros, *scale_input)
