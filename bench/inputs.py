"""Benchmark inputs: geometries (real or CPU-reduced), page pools, fresh selection sets.

Selections follow docs/spec.md §5.2 (and ``qsa_testing.cases``): for a row at
position ``pos`` in the last quarter of a ``context``-token request, the tokens of
``blocks`` distinct random compressed blocks of 4 (indexer order), then the causal
tail of the open group (<= 3 tokens), then -1, and the count in the last column.

Set 0 of every case comes from ``qsa_testing.cases.sparse_attention_case`` (with
``make_cache=False``); sets 1..N-1 are drawn on the device by ``index_sets`` with
the same distribution, so N sets of thousands of rows cost milliseconds.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from qsa_jax import arg_specs
from qsa_testing import cases as C


@dataclasses.dataclass(frozen=True)
class BenchGeometry:
    """One TP geometry at the size the benchmark runs it."""

    name: str
    num_query_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    selection_blocks: int  # top-k 4-token blocks per row
    context_tokens: int  # tokens of every request
    pool_pages: int  # pages of the K/V pool

    @property
    def selection_width(self) -> int:
        return self.selection_blocks * arg_specs.TOKENS_PER_BLOCK + arg_specs.MAX_TAIL

    @property
    def pool_bytes(self) -> int:
        return self.pool_pages * self.num_kv_heads * self.page_size * 2 * self.head_dim * 2

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(selection_width=self.selection_width, pool_bytes=self.pool_bytes)
        return d


GPU_CONTEXT = 65536
CPU_CONTEXT = 4096
CPU_PAGE = 64
CPU_BLOCKS = 64  # W = 259
CPU_POOL_PAGES = 96


def geometry(name: str, *, cpu: bool, pool_gb: float) -> BenchGeometry:
    g = arg_specs.GEOMETRIES[name]
    if cpu:
        return BenchGeometry(name, g.num_query_heads, g.num_kv_heads, g.head_dim, CPU_PAGE,
                             CPU_BLOCKS, CPU_CONTEXT, CPU_POOL_PAGES)
    page_bytes = g.num_kv_heads * g.page_size * 2 * g.head_dim * 2
    pages = max(64, int(pool_gb * 2**30) // page_bytes)
    return BenchGeometry(name, g.num_query_heads, g.num_kv_heads, g.head_dim, g.page_size,
                         arg_specs.SELECTION_BLOCKS, GPU_CONTEXT, pages)


# --- K/V pool ------------------------------------------------------------------------

def make_pool(geo: BenchGeometry, *, gpu: bool, seed: int, fp8: bool = False):
    """The fused [NB, Hk, P, 2D] pool: (torch tensor or None, jax array).

    bf16 normal values, or with ``fp8`` the same values rounded to float8_e4m3fn.
    On the GPU it is drawn by torch on the device and imported zero-copy into JAX
    (DLPack), so the originals and JAX read the same bytes; an fp8 pool travels as
    its uint8 bytes (which ``qsa_jax.sparse_attention`` takes as e4m3).
    """
    shape = (geo.pool_pages, geo.num_kv_heads, geo.page_size, 2 * geo.head_dim)
    if gpu:
        import torch

        gen = torch.Generator(device="cuda").manual_seed(seed)
        kv_t = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        if fp8:
            kv_t = kv_t.to(torch.float8_e4m3fn)
        torch.cuda.synchronize()
        return kv_t, jax.dlpack.from_dlpack(kv_t.view(torch.uint8) if fp8 else kv_t)
    kv = jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(jnp.bfloat16)
    if fp8:
        kv = kv.astype(jnp.float8_e4m3fn)
    return None, kv.block_until_ready()


# --- selection sets ------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("rows", "context", "blocks", "width"))
def _index_set(key, *, rows: int, context: int, blocks: int, width: int):
    """One [rows, width+1] int32 packed selection (see module docstring)."""
    b = arg_specs.TOKENS_PER_BLOCK
    kpos, kblk = jax.random.split(key)
    lo = max(0, context - max(1, context // 4))
    pos = jax.random.randint(kpos, (rows,), lo, context, dtype=jnp.int32)
    visible = (pos + 1) // b
    max_visible = context // b
    scores = jax.random.uniform(kblk, (rows, max_visible))
    scores = jnp.where(jnp.arange(max_visible)[None, :] < visible[:, None], scores, -1.0)
    k = min(blocks, max_visible)
    _, chosen = jax.lax.top_k(scores, k)  # distinct blocks, random order
    nsel = jnp.minimum(visible, blocks)
    tokens = (chosen[:, :, None] * b + jnp.arange(b)[None, None, :]).reshape(rows, k * b)
    tail_start = b * ((pos + 1) // b)
    tail_len = pos + 1 - tail_start
    col = jnp.arange(width)[None, :]
    nt = (nsel * b)[:, None]
    from_tokens = jnp.take_along_axis(tokens, jnp.clip(col, 0, k * b - 1), axis=1)
    tail_tok = tail_start[:, None] + (col - nt)
    sel = jnp.where(col < nt, from_tokens,
                    jnp.where(col - nt < tail_len[:, None], tail_tok, -1))
    count = (nsel * b + tail_len)[:, None]
    return jnp.concatenate([sel, count], axis=1).astype(jnp.int32)


def index_sets(seed: int, n: int, rows: int, geo: BenchGeometry) -> list[jax.Array]:
    """``n`` fresh selection sets drawn on the default device."""
    keys = jax.random.split(jax.random.key(seed), n)
    out = [_index_set(keys[i], rows=rows, context=geo.context_tokens,
                      blocks=geo.selection_blocks, width=geo.selection_width) for i in range(n)]
    return [x.block_until_ready() for x in out]


@dataclasses.dataclass
class SparseInputs:
    """JAX arrays of one (geometry, rows) case; ``idx`` holds N selection sets."""

    q: jax.Array
    gate: jax.Array
    block_table: jax.Array
    token_to_req: jax.Array  # set 0's (the checked call's)
    idx: list
    valid_entries: list  # per set: number of valid (consumed) entries over all rows
    t2r: list = None  # per set: its token_to_req (``own_requests``), else ``token_to_req`` N times

    def __post_init__(self):
        if self.t2r is None:
            self.t2r = [self.token_to_req] * len(self.idx)


def sparse_inputs(geo: BenchGeometry, rows: int, n: int, seed: int,
                  num_requests: int | None = None, own_requests: bool = False) -> SparseInputs:
    """``num_requests``: requests the rows are dealt to (default: one per row; set 0 of
    the selections only -- ``index_sets`` draws positions without requests).
    ``own_requests`` (``bench.run --cold-l2``): set i's rows are requests i*rows .. i*rows+rows-1
    of a block table of rows*n requests, each mapped to random pages of the pool, so the sets
    read different K/V (every request has the same context, so any set's positions fit any)."""
    rng = np.random.default_rng(seed)
    case = C.sparse_attention_case(
        rng, rows=rows, num_query_heads=geo.num_query_heads, num_kv_heads=geo.num_kv_heads,
        head_dim=geo.head_dim, page_size=geo.page_size, selection_blocks=geo.selection_blocks,
        context_tokens=geo.context_tokens, num_pages=geo.pool_pages, make_cache=False,
        num_requests=rows * n if own_requests else num_requests)
    w = geo.selection_width
    idx = [jnp.asarray(case.logical_indices)]
    if n > 1:
        idx += index_sets(seed + 1, n - 1, rows, geo)
    # Every entry below the count is a valid token of a valid page in these
    # sets (and every entry past it is -1), so valid entries = sum of counts.
    valid = [int(jnp.sum(jnp.clip(x[:, w], 0, w))) for x in idx]
    t2r = [jnp.asarray(np.arange(i * rows, (i + 1) * rows, dtype=np.int32)) for i in range(n)] \
        if own_requests else None
    out = SparseInputs(jnp.asarray(case.q), jnp.asarray(case.output_gate), jnp.asarray(case.block_table),
                       t2r[0] if own_requests else jnp.asarray(case.token_to_req), idx, valid, t2r)
    jax.block_until_ready((out.q, out.gate, out.block_table, out.token_to_req, out.idx, out.t2r))
    return out


def sparse_bytes(geo: BenchGeometry, rows: int, valid_entries: float, kv_bytes: int = 2) -> dict:
    """Byte model of one sparse-attention call (see bench/README.md); ``kv_bytes`` per
    cache element (2 bf16, 1 fp8)."""
    d, h, hk = geo.head_dim, geo.num_query_heads, geo.num_kv_heads
    kv = valid_entries * hk * 2 * d * kv_bytes  # K and V rows of every valid entry
    qgo = 3 * rows * h * d * 2  # q read, gate read, out written, bf16
    return {"kv": kv, "q_gate_out": qgo, "total": kv + qgo}


# --- indexer ops ---------------------------------------------------------------------

def indexer_chunk_lens(rng: np.random.Generator, rows: int) -> list[int]:
    """Decode batches (one row per request) up to 512 rows, else 8 prefill chunks."""
    if rows <= 512:
        return [1] * rows
    return [int(x) for x in rng.multinomial(rows, [1 / 8] * 8)]


def compress_sets(seed: int, n: int, rows: int, ring: int) -> list[C.CompressCase]:
    rng = np.random.default_rng(seed)
    lens = indexer_chunk_lens(rng, rows)
    return [C.compress_case(rng, name=f"compress{i}", chunk_lens=lens,
                            head_dim=arg_specs.INDEXER_HEAD_DIM, ring=ring,
                            ratio=arg_specs.TOKENS_PER_BLOCK, with_rope=True,
                            position_base=int(rng.integers(0, 60000)))
            for i in range(n)]


def compress_bytes(rows: int) -> dict:
    dk, c = arg_specs.INDEXER_HEAD_DIM, arg_specs.TOKENS_PER_BLOCK
    keys = rows * c * dk * 2  # C members read (ring or raw), bf16
    pooled = rows * dk * 2  # pooled row written
    positions = rows * 3 * 8 * 2  # first positions read (rope ring / raw) + written, int64
    return {"keys": keys, "pooled": pooled, "positions": positions, "total": keys + pooled + positions}


def store_pages(n: int) -> int:
    return max(64, n + 2)


def store_sets(seed: int, n_calls: int, n: int, ring: int):
    """The cache [pages, ring, 1, 140] bf16 and N (slot_mapping int32, rows [n, 140] bf16)."""
    rng = np.random.default_rng(seed)
    pages = store_pages(n)
    width = arg_specs.INDEXER_ROW_WIDTH
    cache = C.bf16_random(rng, (pages, ring, 1, width))
    sets = []
    for _ in range(n_calls):
        slots = rng.choice(pages * ring, size=n, replace=False).astype(np.int32)
        sets.append((slots, C.bf16_random(rng, (n, width))))
    return cache, sets


def store_bytes(n: int) -> dict:
    width = arg_specs.INDEXER_ROW_WIDTH
    return {"rows_read": n * width * 2, "rows_written": n * width * 2, "slots": n * 4,
            "total": n * (2 * width * 2 + 4)}
