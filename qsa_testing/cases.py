"""Deterministic NumPy input builders shared by tests, golden recording and benchmarks.

Selections follow how vLLM fills ``logical_indices`` (docs/spec.md §5.2): for a row at
query position ``pos`` with ``visible = (pos + 1) // 4`` complete compressed
blocks, the tokens of ``min(visible, blocks)`` distinct blocks in indexer
(random) order, 4 tokens each; then the open group's causal tail
``4 * ((pos + 1) // 4) .. pos``; then -1; the last column holds the count.

bf16 arrays are ``ml_dtypes.bfloat16`` NumPy arrays; they convert to jax/torch
without loss.
"""

from __future__ import annotations

import dataclasses
import os

import ml_dtypes
import numpy as np

from qsa_jax.config import select_config

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
BF16_NAN_BITS = np.uint16(0x7FC0)


def rows_from_env(variable: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """The row counts a GPU parity test runs: ``default``, or the comma-separated counts in the
    environment variable ``variable`` (a narrowed run, which then checks less)."""
    value = os.environ.get(variable)
    return tuple(int(r) for r in value.split(",")) if value else default


def bf16_random(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(BF16)


def off_grid_gate(rng: np.random.Generator, gate: np.ndarray, dtype=np.float32) -> np.ndarray:
    """``gate`` times a fresh factor in [0.9, 1.1), in ``dtype``: values bf16 cannot hold, for
    checking that a float gate is read at its width (as the originals read any float gate)."""
    return (gate.astype(np.float32) * rng.uniform(0.9, 1.1, gate.shape).astype(np.float32)).astype(dtype)


@dataclasses.dataclass
class SparseAttentionCase:
    """Inputs of one sparse-attention call (fused kv_cache layout)."""

    name: str
    q: np.ndarray  # [R, H, D] bf16
    kv_cache: np.ndarray  # [NB, Hk, P, 2D] bf16 (K = [..., :D], V = [..., D:])
    logical_indices: np.ndarray  # [R, W+1] int32
    block_table: np.ndarray  # [NR, BTW] int32
    token_to_req: np.ndarray  # [R] int32
    output_gate: np.ndarray  # [R, H, D] bf16
    use_prefill_config: bool = False
    kv_shape: tuple = ()  # [NB, Hk, P, 2D]

    def __post_init__(self):
        if self.kv_cache is not None:
            self.kv_shape = tuple(self.kv_cache.shape)

    @property
    def head_dim(self) -> int:
        return self.q.shape[2]

    @property
    def selection_width(self) -> int:
        return self.logical_indices.shape[1] - 1

    @property
    def num_kv_heads(self) -> int:
        return self.kv_shape[1]

    @property
    def page_size(self) -> int:
        return self.kv_shape[2]

    def split_caches(self) -> tuple[np.ndarray, np.ndarray]:
        """Contiguous [NB, P, Hk, D] K and V caches (the split layout)."""
        d = self.head_dim
        kv = self.kv_cache.transpose(0, 2, 1, 3)
        return np.ascontiguousarray(kv[..., :d]), np.ascontiguousarray(kv[..., d:])

    def config(self):
        """vLLM 0.30.0's tiling for this case (the goldens' and the 0.30 originals'), on any device."""
        return select_config(self.q.shape[0], self.num_kv_heads, self.use_prefill_config,
                             self.selection_width, table="vllm-0.30")

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), np.ndarray)}


def selection_row(rng: np.random.Generator, pos: int, blocks: int, width: int,
                  block: int = 4) -> np.ndarray:
    """One packed row: selected tokens, tail, -1 padding, count (length width + 1)."""
    visible = (pos + 1) // block
    chosen = rng.choice(visible, size=min(visible, blocks), replace=False) if visible else np.zeros(0, int)
    tokens = (chosen[:, None] * block + np.arange(block)[None, :]).reshape(-1)
    tail = np.arange(block * ((pos + 1) // block), pos + 1)
    sel = np.concatenate([tokens, tail]).astype(np.int32)
    row = np.full(width + 1, -1, np.int32)
    row[: sel.size] = sel
    row[width] = sel.size
    return row


def sparse_attention_case(
    rng: np.random.Generator, *, name: str = "case", rows: int, num_query_heads: int,
    num_kv_heads: int, head_dim: int, page_size: int, selection_blocks: int,
    context_tokens: int, num_requests: int | None = None, spare_pages: int = 3,
    num_pages: int | None = None, use_prefill_config: bool = False,
    selection_width: int | None = None, make_cache: bool = True,
) -> SparseAttentionCase:
    """A realistic case: ``num_requests`` requests of ``context_tokens`` tokens.

    Rows are dealt to requests round-robin; each row's position is drawn in the
    last quarter of its request's context. Block tables map each request's
    logical pages to distinct physical pages of a pool of ``num_pages`` (default:
    just enough plus ``spare_pages`` never-referenced ones). ``selection_width``
    defaults to ``4 * selection_blocks + 3`` (a wider one pads with -1). With
    ``make_cache=False`` the cache is left to the caller (``kv_cache`` is None;
    its shape is ``case.kv_shape``), e.g. to draw a multi-GB pool on the GPU.
    """
    nr = num_requests or max(1, rows)
    width = selection_width or selection_blocks * 4 + 3
    pages_per_req = -(-context_tokens // page_size)
    nb = num_pages or nr * pages_per_req + spare_pages
    if nb >= nr * pages_per_req:
        perm = rng.permutation(nb)[: nr * pages_per_req]
    else:  # a pool smaller than all contexts: requests share physical pages
        perm = rng.integers(0, nb, nr * pages_per_req)
    block_table = perm.reshape(nr, pages_per_req).astype(np.int32)
    token_to_req = (np.arange(rows) % nr).astype(np.int32)
    lo = max(0, context_tokens - max(1, context_tokens // 4))
    positions = rng.integers(lo, context_tokens, rows)
    indices = np.stack([selection_row(rng, int(p), selection_blocks, width) for p in positions]) \
        if rows else np.zeros((0, width + 1), np.int32)
    d = head_dim
    return SparseAttentionCase(
        name=name,
        q=bf16_random(rng, (rows, num_query_heads, d)),
        kv_cache=bf16_random(rng, (nb, num_kv_heads, page_size, 2 * d)) if make_cache else None,
        kv_shape=(nb, num_kv_heads, page_size, 2 * d),
        logical_indices=indices,
        block_table=block_table,
        token_to_req=token_to_req,
        output_gate=bf16_random(rng, (rows, num_query_heads, d), scale=2.0),
        use_prefill_config=use_prefill_config,
    )


def referenced_rows(case: SparseAttentionCase, config=None) -> np.ndarray:
    """Boolean [NB, P] mask of cache rows some consumed, valid entry reads.

    An entry is read iff it lies in a tile the kernel consumes and is valid
    (request, token >= 0, page in table, physical page in range).
    """
    cfg = config or case.config()
    nb, hk, p, _ = case.kv_cache.shape
    nr, btw = case.block_table.shape
    w = case.selection_width
    mask = np.zeros((nb, p), bool)
    for r in range(case.q.shape[0]):
        req = int(case.token_to_req[r])
        if not 0 <= req < nr:
            continue
        count = min(int(case.logical_indices[r, w]), w)
        if count <= 0:
            continue
        end = min(cfg.num_tiles, -(-count // cfg.block_n)) * cfg.block_n
        toks = case.logical_indices[r, : min(end, w)]
        toks = toks[(toks >= 0) & (toks // p < btw)]
        pages = case.block_table[req, toks // p]
        ok = (pages >= 0) & (pages < nb)
        mask[pages[ok], (toks % p)[ok]] = True
    return mask


# Unreferenced K rows are scaled up by this power of two (exact in bf16): a stray score is then
# ~8x the valid ones' spread and takes most of its softmax wherever it lands.
POISON_K_SCALE = 8.0


def poison_unreferenced(case: SparseAttentionCase, config=None) -> SparseAttentionCase:
    """Make every cache row that no consumed valid entry reads show up if it is read.

    Such a row gets its K multiplied by ``POISON_K_SCALE`` (finite, large scores) and NaN in
    its V. A read that reaches the P.V product (any weight, even 0, times NaN) turns the
    output NaN, and a stray K that is not masked takes the softmax with a large finite
    score. NaN in K would not show: it makes the split's normaliser NaN, the split is then
    dropped as empty and the row reads 0 -- what an empty row should give (docs/spec.md §6.5).
    A correct kernel selects (``where``/masked load) before any arithmetic, so it never sees
    either value; invalid entries' clamped address (row 0) may be one of these rows.
    Deterministic and draws no random numbers (the callers' streams stay as they were).
    """
    mask = referenced_rows(case, config)
    d = case.head_dim
    kv = case.kv_cache.copy()
    stray = np.broadcast_to(~mask[:, None, :], kv.shape[:3])  # [NB, Hk, P]
    kv[..., :d][stray] = (kv[..., :d][stray].astype(np.float32) * POISON_K_SCALE).astype(BF16)
    bits = kv.view(np.uint16)
    bits[..., d:][stray] = BF16_NAN_BITS
    case.kv_cache = kv
    return case


def poison_unread_values(case: SparseAttentionCase, config=None) -> SparseAttentionCase:
    """Huge finite K and NaN V in every cache row that no consumed valid entry reads.

    Unlike ``poison_unreferenced`` (NaN in K too), every stray read shows: NaN in K would only
    make the split that reads it look empty and be dropped (docs/spec.md §6.5), while NaN in V
    reaches the output."""
    unread = ~referenced_rows(case, config)
    kv = case.kv_cache.astype(np.float32)
    d = case.head_dim
    rows = np.broadcast_to(unread[:, None, :, None], kv.shape[:3] + (1,))
    kv[..., :d] = np.where(rows, 64.0, kv[..., :d])
    kv[..., d:] = np.where(rows, np.nan, kv[..., d:])
    case.kv_cache = kv.astype(BF16)
    return case


def small_edge_case(rng: np.random.Generator, name: str, *, rows: int = 10,
                    selection_blocks: int = 8) -> SparseAttentionCase:
    """The CPU checks' small fresh case: 4 query heads on 2 KV heads, D 16, pages of 8, 4
    requests of 64 tokens, every degenerate row kind (``add_edge_rows``; 10 rows hold one of
    each) and finite-K / NaN-V poison in every unread cache row (``poison_unread_values``)."""
    case = sparse_attention_case(rng, name=name, rows=rows, num_query_heads=4, num_kv_heads=2, head_dim=16,
                                 page_size=8, selection_blocks=selection_blocks, context_tokens=64,
                                 num_requests=4)
    return poison_unread_values(add_edge_rows(rng, case))


def prepend_poison_page(case: SparseAttentionCase, k_value: float, v_value: float) -> SparseAttentionCase:
    """``case`` with a new physical page 0 holding only ``k_value`` in K and ``v_value`` in V,
    every other page moved up by one in the block table. A masked-off entry's address is
    clamped to page 0 (``max(page, 0)``), so a load without its mask then reads poison even
    where the old page 0 was referenced."""
    d = case.head_dim
    kv = case.kv_cache.astype(np.float32)
    page = np.concatenate([np.full_like(kv[:1, ..., :d], k_value), np.full_like(kv[:1, ..., d:], v_value)], axis=-1)
    table = case.block_table
    return dataclasses.replace(case, kv_cache=np.concatenate([page, kv]).astype(BF16),
                               block_table=np.where(table >= 0, table + 1, table).astype(table.dtype))


def add_edge_rows(rng: np.random.Generator, case: SparseAttentionCase) -> SparseAttentionCase:
    """Rewrite rows of a case (in place) into every degenerate kind, cycling.

    Kinds: count 0; negative count; count > W; all -1 with a positive count;
    invalid request (-1 and NR); logical page past the block table; physical
    page out of range (-1 and >= NB in the table); duplicated tokens; -1 holes
    inside the count.
    """
    li = case.logical_indices
    w = case.selection_width
    nr, btw = case.block_table.shape
    nb = case.kv_cache.shape[0]
    p = case.page_size
    rows = li.shape[0]
    bt = case.block_table
    kinds = ["count0", "negcount", "count_gt_w", "all_minus1", "req_neg", "req_big",
             "past_table", "page_oob", "dups", "holes"]
    for r in range(rows):
        kind = kinds[r % len(kinds)]
        count = int(li[r, w])
        if kind == "count0":
            li[r, w] = 0
        elif kind == "negcount":
            li[r, w] = -5
        elif kind == "count_gt_w":
            li[r, w] = w + 7
        elif kind == "all_minus1":
            li[r, :w] = -1
        elif kind == "req_neg":
            case.token_to_req[r] = -1
        elif kind == "req_big":
            case.token_to_req[r] = nr
        elif kind == "past_table" and count > 0:
            li[r, : max(1, count // 2)] = btw * p + rng.integers(0, 3 * p, max(1, count // 2))
        elif kind == "page_oob" and count > 0:
            req = int(case.token_to_req[r])
            if 0 <= req < nr:
                lp = int(li[r, 0]) // p
                bt[req, lp] = -1 if r % 2 else nb + 3
        elif kind == "dups" and count > 2:
            k = count // 3
            li[r, k : 2 * k] = li[r, :k]
        elif kind == "holes" and count > 2:
            li[r, rng.choice(count, size=max(1, count // 4), replace=False)] = -1
    return case


def gpu_kernel_case(rows: int, *, num_query_heads: int, num_kv_heads: int) -> SparseAttentionCase:
    """A GPU-sized case for kernel-vs-kernel checks: the real D = 256 and W = 2051, pages of
    64, every degenerate row kind, and every cache row the kernels must not read poisoned
    (``poison_unreferenced``)."""
    rng = np.random.default_rng(rows)
    case = sparse_attention_case(
        rng, rows=rows, num_query_heads=num_query_heads, num_kv_heads=num_kv_heads, head_dim=256,
        page_size=64, selection_blocks=512, context_tokens=4096, num_requests=min(rows, 4))
    add_edge_rows(rng, case)
    return poison_unreferenced(case)


def qkv_with_query(q: np.ndarray, kv_heads: int, *, leading_heads: int = 0) -> tuple[np.ndarray, int]:
    """q embedded in a fused-projection-like ``[R, (leading + H + 2 Hk) * D]`` bf16 array
    (vLLM's qkv, optionally with other heads before q), every other column NaN.

    Returns (qkv, first q column). A kernel that reads anything but q's own
    columns sees NaN and shows it in its output.
    """
    rows, heads, d = q.shape
    width = (leading_heads + heads + 2 * kv_heads) * d
    bits = np.full((rows, width), BF16_NAN_BITS, np.uint16)
    start = leading_heads * d
    bits[:, start:start + heads * d] = np.ascontiguousarray(q).view(np.uint16).reshape(rows, heads * d)
    return bits.view(BF16), start


# ---------------------------------------------------------------------------------
# Indexer operators


@dataclasses.dataclass
class CompressCase:
    name: str
    raw_keys: np.ndarray  # [R, 1, Dk] bf16
    raw_positions: np.ndarray  # [R, 1, 3] int64
    compressor_state_cache: np.ndarray  # [Bs, S, 1, Dk] bf16
    compressor_state_block_table: np.ndarray  # [NRq, 1] int32
    token_to_req: np.ndarray  # [R] int32
    query_start_loc: np.ndarray  # [NRq + 1] int32
    logical_positions: np.ndarray  # [R] int32 (vLLM passes int64 positions too)
    compressed_slots: np.ndarray  # [R] int32
    compress_ratio: int
    rope_cache: np.ndarray | None  # [Bs, S, 1, 3] int64 or None

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), np.ndarray)}


def compress_case(rng: np.random.Generator, *, name: str = "compress", chunk_lens, head_dim: int = 128,
                  ring: int = 4, ratio: int = 4, with_rope: bool = True, spare_blocks: int = 2,
                  edge: bool = False, position_base: int = 0) -> CompressCase:
    """Requests with chunks of ``chunk_lens`` rows continuing a context.

    Each request's chunk starts at a random position (so groups span the ring
    and the raw rows). With ``edge``, rows are also made invalid in every way
    (bad request ids, no compressed slot, too-early positions, a request whose
    ring block is out of range).
    """
    nrq = len(chunk_lens)
    rows = int(sum(chunk_lens))
    qsl = np.concatenate([[0], np.cumsum(chunk_lens)]).astype(np.int32)
    starts = position_base + rng.integers(0, 40, nrq)
    token_to_req = np.repeat(np.arange(nrq), chunk_lens).astype(np.int32)
    row_in_req = np.arange(rows) - qsl[token_to_req]
    logical_positions = (starts[token_to_req] + row_in_req).astype(np.int64)
    bs = nrq + spare_blocks
    block_table = rng.permutation(bs)[:nrq].reshape(nrq, 1).astype(np.int32)
    raw_positions = np.stack([logical_positions, logical_positions + 1, logical_positions // 2], -1)
    raw_positions = raw_positions.reshape(rows, 1, 3).astype(np.int64)
    rope = rng.integers(0, 2**31 - 1, (bs, ring, 1, 3)).astype(np.int64) if with_rope else None
    slots = rng.integers(0, 10_000, rows).astype(np.int32)
    if edge and rows:
        kinds = rows // 6 + 1
        slots[rng.choice(rows, kinds, replace=False)] = -1
        token_to_req[rng.choice(rows, kinds, replace=False)] = rng.choice([-1, nrq, nrq + 5])
        if nrq > 1:
            block_table[rng.integers(0, nrq), 0] = rng.choice([-1, bs + 4])
    return CompressCase(
        name=name,
        raw_keys=bf16_random(rng, (rows, 1, head_dim)),
        raw_positions=raw_positions,
        compressor_state_cache=bf16_random(rng, (bs, ring, 1, head_dim)),
        compressor_state_block_table=block_table,
        token_to_req=token_to_req,
        query_start_loc=qsl,
        logical_positions=logical_positions.astype(np.int32),
        compressed_slots=slots,
        compress_ratio=ratio,
        rope_cache=rope,
    )


@dataclasses.dataclass
class StoreCase:
    name: str
    cache: np.ndarray  # [pages, P, 1, width]
    slot_mapping: np.ndarray  # [n] int32/int64
    rows: np.ndarray  # [n, width] or [n, 1, width]

    def arrays(self) -> dict[str, np.ndarray]:
        return {"cache": self.cache, "slot_mapping": self.slot_mapping, "rows": self.rows}


def store_case(rng: np.random.Generator, *, name: str = "store", n: int, pages: int, page_size: int,
               width: int = 140, rows_dtype=BF16, cache_dtype=BF16, invalid_fraction: float = 0.2,
               three_d: bool = False) -> StoreCase:
    """Distinct valid slots plus -1 and past-the-end slots."""
    total = pages * page_size
    slots = rng.choice(total, size=min(n, total), replace=False).astype(np.int64)
    slots = np.resize(slots, n)
    bad = rng.random(n) < invalid_fraction
    slots[bad] = rng.choice([-1, total, total + 17, -(2**20)], size=int(bad.sum()))
    rows = rng.standard_normal((n, width)).astype(np.float32).astype(rows_dtype)
    if three_d:
        rows = rows[:, None, :]
    return StoreCase(name, bf16_random(rng, (pages, page_size, 1, width)).astype(cache_dtype),
                     slots.astype(np.int32), rows)
