"""Sparse paged attention: argument checking and cache addressing.

Shared by every implementation (xla / pallas / triton): the checks run on
static shapes and dtypes before anything is traced or launched, and the cache
addressing below is the one place that knows the two KV layouts.

KV layouts accepted (``kv`` argument):

* fused (vLLM's own buffer): one array ``[NB, Hk, P, 2D]``; K is channels
  ``[0, D)`` and V channels ``[D, 2D)``. vLLM's K/V tensors are strided views of
  it that DLPack cannot import, so the fused buffer is passed whole and each
  implementation addresses the two halves itself.
* split: a pair ``(k_cache, v_cache)``, each ``[NB, P, Hk, D]``.

Either way the cache is viewed, without a copy, as a 2-D table of D-wide rows:
``rows_view[row, half, :]`` with ``row = kv_row_index(page, token, head)``
and ``half`` 0 for K, 1 for V (fused) — see ``KVLayout``.

Cache dtypes (vLLM 0.34.0): bf16, or fp8 e4m3 as ``float8_e4m3fn`` or as its
raw bytes in ``uint8`` (how vLLM allocates an fp8 cache). Every implementation
decodes the bytes by reinterpreting them as ``float8_e4m3fn`` (exact; the two
NaN codes stay NaN, where 0.34.0's sm_80 byte decode reads them as +-480),
converts K to q's dtype (bf16, exact) for q.K^T and V to fp16 (exact) for
P.V, whose probabilities are then rounded to fp16 instead of bf16.

Scales (``k_scale``/``v_scale``, vLLM 0.34.0's per-layer dequantisation
factors): the scores are scaled by D^-0.5 * k_scale and the normalised output
by v_scale, as ``acc * (v_scale / max(l, 1e-20))``; the split LSE keeps the
unscaled normaliser. Passing them selects 0.34.0's arithmetic also for a bf16
cache, whose scale *values* 0.34.0 ignores (it uses D^-0.5 and 1.0); without
them the arithmetic is 0.30.0's (``acc / max(l, 1e-20)``). The two differ in
the last fp32 bit of some outputs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from qsa_jax.config import (TABLE_NAMES, PallasLaunch, SparseAttentionConfig, TritonLaunch, select_config,
                            table_tiling)
from qsa_jax.ops._arrays import require_arrays

# Scores start here and invalid entries get this score: a finite "minus
# infinity" keeps exp2(max_old - max_new) finite when a tile has no valid
# entry (an all -inf tile would give inf - inf = NaN).
MASKED_SCORE = -1.0e20
LOG2_E = 1.4426950408889634
# fp16 q.K^T for an fp8 cache (Pallas ``_f16_query``, the jax-triton kernel's QK_FP16):
# q * 2^shift puts a row's largest |q| in [2^14, 2^15): below fp16's 65504, and every bf16
# value down to 2^-31 of it keeps all 8 significant bits (its last bit stays >= 2^-24, fp16's
# subnormal spacing); smaller ones lose low bits, far below the scores' fp32 rounding.
F16_QUERY_TOP_EXPONENT = 14
# |shift| bound: 2^shift and 2^-shift stay normal fp32 (the largest bf16 needs -113; rows
# whose largest |q| is below 2^-112 are clamped, which only moves them lower in fp16's range).
F16_QUERY_MAX_SHIFT = 126


@dataclasses.dataclass(frozen=True)
class KVLayout:
    """Geometry of a paged K/V cache in either layout (static, hashable).

    The arrays travel separately (``kv_arrays``: ``(kv_cache,)`` when fused,
    ``(k_cache, v_cache)`` when split) so that this can be a jit static argument.
    """

    fused: bool
    num_pages: int
    page_size: int
    num_kv_heads: int
    head_dim: int

    @property
    def num_rows(self) -> int:
        return self.num_pages * self.page_size * self.num_kv_heads

    def rows_view(self, kv_arrays) -> tuple[jax.Array, jax.Array]:
        """K and V as ``[N, halves, D]`` arrays of D-wide cache rows.

        K is ``k3[:, k_half]`` and V ``v3[:, v_half]`` (see ``halves``). Reshapes
        of a contiguous array are free in XLA: no cache-sized copy is made.
        """
        n, d = self.num_rows, self.head_dim
        if self.fused:
            flat = kv_arrays[0].reshape(n, 2, d)
            return flat, flat
        return kv_arrays[0].reshape(n, 1, d), kv_arrays[1].reshape(n, 1, d)

    @property
    def halves(self) -> tuple[int, int]:
        """Index of K and V in the middle axis of ``rows_view``."""
        return (0, 1) if self.fused else (0, 0)

    def row_index(self, page, token, head):
        """Row of ``rows_view`` holding (page, token-in-page, KV head).

        int32 is safe: a cache of 2**31 rows of >= 32 bytes would exceed any
        GPU's memory, and ``validate_kv`` rejects larger geometries.
        """
        if self.fused:  # [NB, Hk, P, 2D]
            return (page * self.num_kv_heads + head) * self.page_size + token
        return (page * self.page_size + token) * self.num_kv_heads + head  # [NB, P, Hk, D]



# Cache element formats by dtype: bf16, e4m3 values, e4m3 bytes.
KV_FORMATS = {jnp.dtype(jnp.bfloat16): "bf16", jnp.dtype(jnp.float8_e4m3fn): "e4m3",
              jnp.dtype(jnp.uint8): "e4m3_bytes"}


def kv_format(arrays) -> str:
    """The format name (``KV_FORMATS``) of a checked cache's arrays."""
    return KV_FORMATS[jnp.dtype(arrays[0].dtype)]


GATE_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))


def as_e4m3(tile):
    """fp8 e4m3 values of a cache tile: uint8 bytes are reinterpreted (free, exact)."""
    return lax.bitcast_convert_type(tile, jnp.float8_e4m3fn) if tile.dtype == jnp.uint8 else tile


def operand_dtypes(problem: "SparseAttentionProblem"):
    """(K dtype for q.K^T, V and probability dtype for P.V) -- vLLM 0.34.0's choice:
    bf16/bf16 for a bf16 cache; bf16/fp16 for fp8 (both conversions of e4m3 are exact)."""
    return jnp.bfloat16, (jnp.float16 if problem.is_fp8 else jnp.bfloat16)


def _shape(x) -> tuple[int, ...]:
    return tuple(int(s) for s in np.shape(x))


def as_kv_layout(kv) -> tuple[KVLayout, tuple[Any, ...]]:
    """Check a ``kv`` argument (fused array or (k, v) pair): (layout, arrays)."""
    if isinstance(kv, (tuple, list)):
        if len(kv) != 2:
            raise ValueError(f"kv must be the fused kv_cache or a (k_cache, v_cache) pair; got {len(kv)} arrays")
        k, v = kv
        require_arrays(k_cache=k, v_cache=v)
        if len(_shape(k)) != 4:
            raise ValueError(f"k_cache must be [pages, page_size, kv_heads, head_dim]; got shape {_shape(k)}")
        if _shape(v) != _shape(k):
            raise ValueError(f"v_cache shape {_shape(v)} must equal k_cache shape {_shape(k)}")
        if k.dtype != v.dtype:
            raise TypeError(f"k_cache and v_cache dtypes differ: {k.dtype} vs {v.dtype}")
        nb, p, hk, d = _shape(k)
        cache, arrays = KVLayout(False, nb, p, hk, d), (k, v)
    else:
        require_arrays(kv_cache=kv)
        shape = _shape(kv)
        if len(shape) != 4 or shape[3] % 2:
            raise ValueError(
                f"kv_cache must be [pages, kv_heads, page_size, 2*head_dim]; got shape {shape}")
        nb, hk, p, d2 = shape
        cache, arrays = KVLayout(True, nb, p, hk, d2 // 2), (kv,)
    if not (cache.num_pages and cache.page_size and cache.num_kv_heads):
        raise ValueError(
            "kv cache must be nonempty: got pages={}, page_size={}, kv_heads={}".format(
                cache.num_pages, cache.page_size, cache.num_kv_heads))
    if cache.num_rows >= 2**31:
        raise ValueError("kv cache has 2**31 or more rows; row indices would overflow int32")
    if jnp.dtype(arrays[0].dtype) not in KV_FORMATS:
        raise TypeError("kv cache must be bfloat16, float8_e4m3fn or uint8 (e4m3 bytes); "
                        f"got {arrays[0].dtype}")
    return cache, arrays


@functools.partial(jax.tree_util.register_dataclass, data_fields=["table"],
                   meta_fields=["num_rows", "num_heads", "row_stride", "head_stride", "offset"])
@dataclasses.dataclass(frozen=True)
class StridedQuery:
    """Queries stored inside a larger array, read by address instead of copied.

    Head ``h`` of row ``r`` is the D-wide row ``table[offset + r * row_stride +
    h * head_stride]`` of the 2-D ``table`` ``[N, D]``. A compact q ``[R, H, D]``
    is the special case ``table = q.reshape(R * H, D)``, ``row_stride = H``,
    ``head_stride = 1``. The point is vLLM's q: a view of the fused qkv
    projection ``[T, (H + 2 Hk) * D]`` (row stride ``(H + 2 Hk) * D`` elements).
    Slicing it out in JAX would materialise a copy before the kernel; the
    kernels here load q rows from the whole projection instead.

    A pytree: ``table`` is the only array; the rest is static (a new layout
    compiles a new kernel, like a new shape).
    """

    table: Any
    num_rows: int
    num_heads: int
    row_stride: int
    head_stride: int = 1
    offset: int = 0

    def __post_init__(self):
        # Checked here, not only with the call's other arguments: the layout is static, and
        # 4.0 == 4 would let a float field match a memoised int one.
        for name in ("num_rows", "num_heads", "row_stride", "head_stride", "offset"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"StridedQuery.{name} must be a non-negative int; got {value!r}")

    @classmethod
    def from_columns(cls, rows, *, start: int, num_heads: int, head_dim: int) -> "StridedQuery":
        """q = columns ``[start, start + num_heads * head_dim)`` of each row of the 2-D
        ``rows`` ``[R, C]`` (e.g. ``start=0`` in vLLM's qkv). The reshape to D-wide rows
        is free; ``C`` and ``start`` must be multiples of ``head_dim``."""
        shape = _shape(rows)
        if len(shape) != 2 or shape[1] % head_dim or start % head_dim:
            raise ValueError(
                f"StridedQuery.from_columns needs a 2-D [rows, C] array with C and start multiples of "
                f"head_dim={head_dim}; got shape {shape}, start={start}")
        per_row = shape[1] // head_dim
        return cls(rows.reshape(shape[0] * per_row, head_dim), shape[0], num_heads, per_row, 1,
                   start // head_dim)


@dataclasses.dataclass(frozen=True)
class QueryLayout:
    """Where q's rows sit in the query table the kernels receive (static, hashable).

    Row ``(r, h)`` of q is table row ``offset + r * row_stride + h * head_stride``.
    """

    row_stride: int
    head_stride: int
    offset: int

    @staticmethod
    def compact(num_heads: int) -> "QueryLayout":
        return QueryLayout(num_heads, 1, 0)

    def row(self, r, h):
        # Skip the no-op terms so a compact q traces to the plain r*H + h.
        index = r * self.row_stride + (h if self.head_stride == 1 else h * self.head_stride)
        return index + self.offset if self.offset else index


def query_table(q):
    """The array the implementations receive for ``q``: the ``[N, D]`` table of a
    ``StridedQuery``, or q itself (its free ``[R*H, D]`` reshape is the table)."""
    return q.table if isinstance(q, StridedQuery) else q


def _check_strided_query(q: StridedQuery, head_dim: int) -> tuple[tuple[int, int, int], QueryLayout]:
    table = _shape(q.table)
    if len(table) != 2 or table[1] != head_dim:
        raise ValueError(
            f"StridedQuery.table must be [N, head_dim={head_dim}] (D-wide query rows); got shape {table}")
    # Its int fields were checked when it was built (StridedQuery.__post_init__).
    rows, heads = int(q.num_rows), int(q.num_heads)
    layout = QueryLayout(int(q.row_stride), int(q.head_stride), int(q.offset))
    if rows and heads:
        last = layout.row(rows - 1, heads - 1)
        if last >= table[0]:
            raise ValueError(
                f"StridedQuery addresses table row {last} (row {rows - 1}, head {heads - 1}) but the "
                f"table has {table[0]} rows")
        if table[0] * head_dim >= 2**31:
            raise ValueError("StridedQuery.table has 2**31 or more elements; offsets would overflow int32")
    return (rows, heads, head_dim), layout


@dataclasses.dataclass(frozen=True)
class SparseAttentionProblem:
    """Static description of one call (everything a kernel is specialised on)."""

    num_rows: int
    num_query_heads: int
    head_dim: int
    selection_width: int  # W: columns of logical_indices minus the count column
    num_requests: int  # NR: rows of block_table
    table_width: int  # BTW
    kv: KVLayout
    config: SparseAttentionConfig
    # True when the caller passed ``config=``; an implementation with a tuned
    # table of its own must then use ``config`` as given.
    config_explicit: bool = False
    # Rows of q in the query table (``query_table``); compact q when None.
    q_layout: QueryLayout | None = None
    kv_format: str = "bf16"  # KV_FORMATS
    # k_scale/v_scale given: vLLM 0.34.0's arithmetic, with the fp32 pair from
    # ``scale_operand`` as an extra (traced) kernel operand.
    scaled: bool = False
    # Pipelining depth the config's table measured best (Pallas); None: the
    # implementation's default. Never set with an explicit ``config=``.
    num_stages: int | None = None
    # use_prefill_config, kept only where it changed the tiling, and the table the tiling
    # came from: a shard on a mesh picks its own tiling from its own shape with them
    # (``for_shard``; ops/_sharding.py).
    prefill_tiling: bool = False
    table: str | None = None
    # The caller's ``launch=`` (launch knobs of one implementation, no numeric effect);
    # None: every knob at its default (qsa_jax.config.pallas_launch / triton_launch).
    launch: PallasLaunch | TritonLaunch | None = None

    def for_shard(self, num_rows: int, num_query_heads: int, num_kv_heads: int) -> "SparseAttentionProblem":
        """This call's problem on one shard of a mesh: its own rows and heads, and (unless
        ``config=`` fixed it) the tiling and stages its own rows x KV heads pick from the
        same table, as one GPU of that tensor-parallel size would."""
        kv = dataclasses.replace(self.kv, num_kv_heads=num_kv_heads)
        changes = dict(num_rows=num_rows, num_query_heads=num_query_heads, kv=kv)
        if not self.config_explicit:
            changes["config"], changes["num_stages"] = table_choice(
                num_rows, num_kv_heads, self.selection_width, self.prefill_tiling, self.is_fp8, self.table)
        return dataclasses.replace(self, **changes)

    @property
    def is_fp8(self) -> bool:
        return self.kv_format != "bf16"

    @property
    def queries(self) -> QueryLayout:
        return self.q_layout or QueryLayout.compact(self.num_query_heads)

    @property
    def num_kv_heads(self) -> int:
        return self.kv.num_kv_heads

    @property
    def group_size(self) -> int:
        return self.num_query_heads // self.kv.num_kv_heads


def table_choice(rows: int, num_kv_heads: int, width: int, use_prefill_config: bool, is_fp8: bool,
                 table: str | None) -> tuple[SparseAttentionConfig, int | None]:
    """(tiling, pipelining depth or None) that ``table`` picks for this many rows x KV heads:
    the one place a call (and each shard of one on a mesh) reads the config tables."""
    cfg = select_config(rows, num_kv_heads, use_prefill_config, width, is_fp8, table=table)
    return cfg, table_tiling(rows * num_kv_heads, use_prefill_config, is_fp8=is_fp8, table=table).stages


def prefill_flag_selects(programs: int, is_fp8: bool, table: str | None) -> bool:
    """Whether ``use_prefill_config=True`` picks another entry of ``table`` than False at ``programs``
    (rows x KV heads): another tiling, or (a measured table) another pipelining depth or implementation
    (``config.sparse_attention_order`` reads the entry again). Where it does not, both flags are one
    executable."""
    return (table_tiling(programs, True, is_fp8=is_fp8, table=table)
            != table_tiling(programs, False, is_fp8=is_fp8, table=table))


def check_sparse_attention_args(
    q, kv, logical_indices, block_table, token_to_req, output_gate,
    *, use_prefill_config: bool, config: Sequence[int] | str | None,
    scales_given: tuple[bool, bool] = (False, False),
    launch: PallasLaunch | TritonLaunch | None = None,
) -> SparseAttentionProblem:
    """Validate all arguments (shapes and dtypes only: works on tracers).

    Covers every check of the originals and a few more (gate shape, config
    sanity). Raises ``ValueError`` for shapes and ``TypeError`` for dtypes, with
    the offending argument named. ``config`` is a tiling, or a table name for
    ``select_config`` (None: its default); ``scales_given`` says whether k_scale
    and v_scale were passed (their values are checked by ``scale_operand``);
    ``launch``: None or a ``PallasLaunch``/``TritonLaunch`` (matched to the
    implementation by the caller).
    """
    require_arrays(q=q.table if isinstance(q, StridedQuery) else q, logical_indices=logical_indices,
                   block_table=block_table, token_to_req=token_to_req, output_gate=output_gate)
    cache, arrays = as_kv_layout(kv)
    fmt = kv_format(arrays)
    given = dict(zip(("k_scale", "v_scale"), scales_given))
    if any(given.values()) and not all(given.values()):
        missing = [name for name, ok in given.items() if not ok]
        raise ValueError(f"k_scale and v_scale go together: {missing[0]} is missing")
    if fmt != "bf16" and not all(given.values()):
        raise ValueError(f"an fp8 kv cache ({arrays[0].dtype}) needs its dequantisation scales "
                         "k_scale and v_scale")
    q_layout = None
    if isinstance(q, StridedQuery):
        qs, q_layout = _check_strided_query(q, cache.head_dim)
        if q_layout == QueryLayout.compact(qs[1]) and _shape(q.table)[0] == qs[0] * qs[1]:
            q_layout = None  # the table is exactly a compact q
        q = q.table
    else:
        qs = _shape(q)
    if len(qs) != 3:
        raise ValueError(f"q must be [rows, query_heads, head_dim]; got shape {qs}")
    rows, heads, d = qs
    if d != cache.head_dim:
        raise ValueError(f"q head_dim {d} does not match the kv cache head_dim {cache.head_dim}")
    if heads == 0 or heads % cache.num_kv_heads:
        raise ValueError(
            f"q has {heads} query heads, not a positive multiple of the cache's {cache.num_kv_heads} KV heads")
    if d < 16 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two >= 16; got {d}")
    li = _shape(logical_indices)
    if len(li) != 2 or li[0] != rows:
        raise ValueError(f"logical_indices must be [rows={rows}, W+1]; got shape {li}")
    if li[1] < 2:
        raise ValueError(
            f"logical_indices needs selection columns plus the trailing count column; got {li[1]} columns")
    bt = _shape(block_table)
    if len(bt) != 2 or not all(bt):
        raise ValueError(f"block_table must be a nonempty [requests, pages_per_request] array; got shape {bt}")
    if _shape(token_to_req) != (rows,):
        raise ValueError(f"token_to_req must be [rows={rows}]; got shape {_shape(token_to_req)}")
    gs = _shape(output_gate)
    # vLLM reads the gate with view_as(q): any shape of R·H·D elements, row-major.
    if gs != qs and not (int(np.prod(gs)) == rows * heads * d and gs[:1] == (rows,)):
        raise ValueError(f"output_gate must have q's shape {qs} (or [rows, heads*head_dim]); got {gs}")

    if q.dtype != jnp.bfloat16:
        raise TypeError(f"q must be bfloat16; got {q.dtype}")
    # The kernels read the gate as fp32, as the originals do (vLLM's model passes bf16).
    if output_gate.dtype not in GATE_DTYPES:
        raise TypeError(f"output_gate must be bfloat16, float16 or float32; got {output_gate.dtype}")
    for name, arr in (("logical_indices", logical_indices), ("block_table", block_table),
                      ("token_to_req", token_to_req)):
        if arr.dtype != jnp.int32:
            raise TypeError(f"{name} must be int32; got {arr.dtype}")

    if launch is not None:
        if not isinstance(launch, (PallasLaunch, TritonLaunch)):
            raise TypeError(f"launch must be None, a PallasLaunch or a TritonLaunch; got {type(launch).__name__}")
        if launch.merge_block_d is not None and d % launch.merge_block_d:
            raise ValueError(f"launch.merge_block_d={launch.merge_block_d} must divide head_dim={d}")

    width = li[1] - 1
    explicit = not (config is None or isinstance(config, str))
    stages = None
    if not explicit:
        if config is not None and config not in TABLE_NAMES:
            raise ValueError(f"config must be a tiling (block_n, num_warps, num_tiles, num_splits), a table "
                             f"name {TABLE_NAMES} or None; got {config!r}")
        cfg, stages = table_choice(rows, cache.num_kv_heads, width, bool(use_prefill_config), fmt != "bf16", config)
    else:
        cfg = check_tiling(config, width)
    # The flag is kept where it changes the table's entry.
    prefill_tiling = not explicit and bool(use_prefill_config) and prefill_flag_selects(
        rows * cache.num_kv_heads, fmt != "bf16", config)
    return SparseAttentionProblem(rows, heads, d, width, bt[0], bt[1], cache, cfg,
                                  config_explicit=explicit, q_layout=q_layout, kv_format=fmt,
                                  scaled=all(given.values()), num_stages=stages,
                                  prefill_tiling=prefill_tiling, table=None if explicit else config,
                                  launch=launch)


def check_tiling(config, width: int) -> SparseAttentionConfig:
    """An explicit ``config`` as a ``SparseAttentionConfig``, checked against the selection
    width W: ``ValueError`` naming the field that cannot launch or would drop columns."""
    try:
        cfg = SparseAttentionConfig(*(operator.index(x) for x in config))
    except TypeError:
        raise ValueError(f"config must be four ints (block_n, num_warps, num_tiles, num_splits), a table "
                         f"name {TABLE_NAMES} or None; got {config!r}") from None
    if cfg.block_n < 16 or cfg.block_n & (cfg.block_n - 1):
        raise ValueError(f"config.block_n must be a power of two >= 16; got {cfg.block_n}")
    if not 1 <= cfg.num_warps <= 32 or cfg.num_warps & (cfg.num_warps - 1):
        raise ValueError(f"config.num_warps must be a power of two in [1, 32]; got {cfg.num_warps}")
    # The kernels walk num_tiles tiles of block_n columns: fewer than W needs would drop
    # selected tokens without a word. More only add empty tiles (and splits: the tests'
    # way to reach many splits at small W); the originals always pass this ceil.
    tiles = -(-width // cfg.block_n)
    if cfg.num_tiles < tiles:
        raise ValueError(f"config.num_tiles must be >= ceil(W / block_n) = ceil({width} / {cfg.block_n}) = "
                         f"{tiles}, or the last selection columns are never read; got {cfg.num_tiles}")
    if not 1 <= cfg.num_splits <= cfg.num_tiles:
        raise ValueError(f"config.num_splits must be in [1, num_tiles={cfg.num_tiles}]; got {cfg.num_splits}")
    return cfg


_F32_NORMAL = (float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max))


def check_host_scale(name: str, value, head_dim: int | None = None) -> float | None:
    """A concrete scale as a Python float (None when traced), checked: finite and > 0 as the
    fp32 the kernels receive (a normal number: 1e39 would be inf there, 1e-46 zero, and a
    subnormal is flushed to zero on the GPU); with ``head_dim``, so is the score multiplier
    D^-0.5 k_scale log2(e) derived from it."""
    if isinstance(value, jax.core.Tracer):
        return None
    # float() would also take "0.5", True and a complex's real part: a real number only.
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        real = jnp.issubdtype(value.dtype, jnp.floating) or jnp.issubdtype(value.dtype, jnp.integer)
    else:
        real = not isinstance(value, (str, bytes, bool, complex))
    try:
        f = float(value) if real else None
    except (TypeError, ValueError):
        f = None
    if f is None:
        raise TypeError(f"{name} must be a float; got {type(value).__name__} {value!r}")
    return _checked_scale(name, f, head_dim)


@functools.lru_cache(maxsize=1024)
def _checked_scale(name: str, f: float, head_dim: int | None) -> float:
    # Once per distinct value (a layer's scales repeat every call); a failure is not cached.
    if not (math.isfinite(f) and f > 0):
        raise ValueError(f"{name} must be finite and > 0; got {f!r}")
    low, high = _F32_NORMAL
    with np.errstate(over="ignore", under="ignore"):
        derived = [("", float(np.float32(f)))]
        if head_dim is not None:
            derived.append((f" (with D = {head_dim}, the score multiplier D^-0.5 * k_scale * log2(e))",
                            score_scale(head_dim, f)))
    for what, x in derived:
        if not low <= x <= high:
            raise ValueError(f"{name} = {f!r} is outside fp32's normal range [{low:.3g}, {high:.3g}]{what}: "
                             f"the kernels would compute with {x!r}")
    return f


def score_scale(head_dim: int, k_scale: float) -> float:
    """vLLM 0.34.0's score multiplier: fp32(fp32(D^-0.5 * k_scale) * fp32(log2 e)) (the
    kernel receives the product as an fp32 scalar and converts it to base 2 in fp32)."""
    return float(np.float32(np.float32(head_dim ** -0.5 * k_scale) * np.float32(LOG2_E)))


def _host_pair(head_dim: int, k_scale: float, v_scale: float) -> np.ndarray:
    return np.array([score_scale(head_dim, k_scale), v_scale], np.float32)


@functools.lru_cache(maxsize=1024)
def _scale_pair(head_dim: int, k_scale: float, v_scale: float) -> jax.Array:
    # One device array per distinct (D, k_scale, v_scale): a layer's scales are constant,
    # so a call costs a dictionary lookup, not fp32 arithmetic and a host-to-device copy.
    # Made concrete even when the first call comes from inside a caller's jit: a cached
    # tracer would leak out of that trace into every later call. Private: never handed to a
    # caller, who could donate or delete it under every later call (``kv_scales`` makes its own).
    with jax.ensure_compile_time_eval():
        return jnp.asarray(_host_pair(head_dim, k_scale, v_scale))


@jax.tree_util.register_pytree_node_class
class KVScales:
    """vLLM 0.34.0's k/v scales prepared on the host for a head dimension: the kernels'
    fp32 operand ``[D^-0.5 * k_scale * log2(e), v_scale]`` with the score multiplier
    rounded from float64, as 0.34.0 rounds it.

    Made by ``kv_scales`` and passed as ``sparse_attention(..., scales=)``. A pytree whose
    one leaf is the operand, so it can be an argument of a caller's jit (or a model's
    state) without recompiling per value, and still give the bits host floats give.
    Raw traced ``k_scale`` instead multiplies D^-0.5 by k_scale in fp32, one fp32 rounding
    more: at D = 128 (D^-0.5 is not a power of two) 17-35% of k_scale values land an ulp
    away from 0.34.0's multiplier, by how XLA associates the product.
    """

    __slots__ = ("operand", "head_dim")

    def __init__(self, operand, head_dim: int):
        self.operand = operand  # [2] fp32: score multiplier (base 2), output scale
        self.head_dim = head_dim

    def tree_flatten(self):
        return (self.operand,), self.head_dim

    @classmethod
    def tree_unflatten(cls, head_dim, children):
        return cls(children[0], head_dim)

    def __repr__(self):
        return f"KVScales(head_dim={self.head_dim}, operand={self.operand!r})"


def kv_scales(k_scale: float, v_scale: float, *, head_dim: int) -> KVScales:
    """``KVScales`` from host floats, checked as ``sparse_attention`` checks them (finite,
    > 0, inside fp32's normal range with the score multiplier): ``ValueError`` or
    ``TypeError`` naming the argument. Call it once per layer, not per step: each call
    makes a new array (the caller's to keep, donate or delete), uncommitted on JAX's default
    device, which JAX moves to the call's device like any uncommitted argument (committed
    with ``jax.device_put``, it must be on the device of the call's arrays)."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)):
        raise TypeError(f"kv_scales: head_dim must be an int; got {type(head_dim).__name__} {head_dim!r}")
    if head_dim <= 0:
        raise ValueError(f"kv_scales: head_dim must be > 0; got {head_dim!r}")
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(value, jax.core.Tracer):
            raise TypeError(f"kv_scales: {name} must be a host float (the point is rounding the "
                            f"score multiplier from float64 on the host); got a traced value")
    d = int(head_dim)
    ks = check_host_scale("k_scale", k_scale, d)
    vs = check_host_scale("v_scale", v_scale)
    with jax.ensure_compile_time_eval():  # concrete even when called inside a caller's jit
        return KVScales(jnp.asarray(_host_pair(d, ks, vs)), d)


def _prepared_operand(problem: SparseAttentionProblem, scales):
    if not isinstance(scales, KVScales):
        raise TypeError(f"sparse_attention: scales must be a qsa_jax.KVScales (from qsa_jax.kv_scales); "
                        f"got {type(scales).__name__}")
    if scales.head_dim != problem.head_dim:
        raise ValueError(f"sparse_attention: scales were prepared for head_dim {scales.head_dim}, but q "
                         f"has head_dim {problem.head_dim} (the score multiplier depends on it)")
    operand = scales.operand
    dtype, shape = getattr(operand, "dtype", None), getattr(operand, "shape", None)
    if dtype != jnp.float32 or tuple(shape or ()) != (2,):
        raise ValueError(f"sparse_attention: scales.operand must be a float32 array of shape (2,) "
                         f"(make it with qsa_jax.kv_scales); got {type(operand).__name__} "
                         f"{dtype} {shape}")
    return operand


def scale_operand(problem: SparseAttentionProblem, k_scale, v_scale, scales=None):
    """The kernels' fp32 ``[score scale (log2 units), output scale]``, or None without scales.

    Host values are checked (finite, > 0; ``ValueError``/``TypeError`` naming the
    argument) and the pair is cached on the device. Traced scales (a caller's jit)
    are used as given, unchecked, and D^-0.5 * k_scale is then rounded in fp32
    rather than from float64 (at most an ulp of the scale apart; ``scales``, a
    ``KVScales``, keeps the float64 rounding under a trace). A bf16 cache
    checks host values the same way but does not use them, as vLLM 0.34.0 does not
    (the shim, 0.34.0's drop-in, skips the check for a bf16 cache).
    """
    if not problem.scaled:
        return None
    if scales is not None:
        operand = _prepared_operand(problem, scales)
        return operand if problem.is_fp8 else _scale_pair(problem.head_dim, 1.0, 1.0)
    ks, vs = check_host_scale("k_scale", k_scale, problem.head_dim), check_host_scale("v_scale", v_scale)
    d = problem.head_dim
    if not problem.is_fp8:
        return _scale_pair(d, 1.0, 1.0)
    if ks is not None and vs is not None:
        return _scale_pair(d, ks, vs)
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if np.size(value) != 1:
            raise ValueError(f"{name} must be a scalar; got shape {np.shape(value)}")
    k = jnp.asarray(k_scale, jnp.float32).reshape(())
    v = jnp.asarray(v_scale, jnp.float32).reshape(())
    return jnp.stack([(jnp.float32(d ** -0.5) * k) * jnp.float32(LOG2_E), v])


def entry_rows(problem: SparseAttentionProblem, tokens, block_table, token_to_req):
    """Cache row (per KV head 0) and validity of each selected token.

    ``tokens`` is any int32 array of logical token ids of shape [R, ...]. An
    entry is valid iff its request is in range, the token is >= 0, its logical
    page is inside the block table and the physical page is in [0, NB). Invalid
    entries get row 0 of head 0 — a safe address — and must be masked by the
    caller with ``jnp.where`` (never by multiplying: the page may hold NaN).
    Returns (row_of_head0, valid); add ``head`` via ``KVLayout.row_index``
    linearity: row(page, tok, h) = row(page, tok, 0) + h * head_stride.
    """
    kv = problem.kv
    extra = (1,) * (tokens.ndim - 1)
    req = token_to_req.reshape((-1,) + extra)
    req_ok = (req >= 0) & (req < problem.num_requests)
    safe_req = jnp.clip(req, 0, problem.num_requests - 1)
    safe_tok = jnp.maximum(tokens, 0)
    logical_page = safe_tok // kv.page_size
    valid = req_ok & (tokens >= 0) & (logical_page < problem.table_width)
    page = block_table[safe_req, jnp.minimum(logical_page, problem.table_width - 1)]
    valid &= (page >= 0) & (page < kv.num_pages)
    page = jnp.where(valid, page, 0)
    row = kv.row_index(page, jnp.where(valid, safe_tok % kv.page_size, 0), 0)
    return row, valid


def head_row_stride(kv: KVLayout) -> int:
    """Row distance between consecutive KV heads of one (page, token)."""
    return kv.page_size if kv.fused else 1


def gate_epilogue(attention_fp32, output_gate):
    """Round the attention output to bf16, multiply by sigmoid(gate) in fp32, store bf16."""
    rounded = attention_fp32.astype(jnp.bfloat16).astype(jnp.float32)
    gate = jax.nn.sigmoid(output_gate.astype(jnp.float32))
    return (rounded * gate).astype(jnp.bfloat16)


def merge_splits(partial_out, partial_lse):
    """Merge split-K partials: [S, ...rows, D] normalised outputs and [S, ...rows] base-2 LSEs.

    Weights are exp2(lse - max lse); splits with no valid entry have
    lse = -inf and weight 0; a row with no valid entry anywhere gives 0.
    """
    lse_max = jnp.max(partial_lse, axis=0)
    has_values = lse_max > -jnp.inf
    weights = jnp.where(has_values, jnp.exp2(partial_lse - jnp.where(has_values, lse_max, 0.0)), 0.0)
    denominator = jnp.sum(weights, axis=0)
    merged = jnp.sum(partial_out * weights[..., None], axis=0)
    return jnp.where((denominator > 0)[..., None], merged / jnp.where(denominator > 0, denominator, 1.0)[..., None], 0.0)


def merged_lse(partial_lse):
    """Base-2 LSE of the merged softmax from the splits' LSEs [S, ...] (-inf when all
    are empty): lse_max + log2(sum of the merge weights), the statistics the merge
    already forms, kept for the backward pass."""
    lse_max = jnp.max(partial_lse, axis=0)
    has_values = lse_max > -jnp.inf
    safe_max = jnp.where(has_values, lse_max, 0.0)
    total = jnp.sum(jnp.exp2(partial_lse - safe_max), axis=0)
    return jnp.where(has_values, safe_max + jnp.log2(jnp.where(has_values, total, 1.0)), -jnp.inf)


def normalised(acc, normalizer, output_scale=None):
    """acc / max(l, 1e-20) (vLLM 0.30.0), or acc * (output_scale / max(l, 1e-20)) (0.34.0,
    whenever scales are passed); 0 where the split saw no valid entry."""
    has_values = normalizer > 0
    safe = jnp.maximum(normalizer, 1.0e-20)
    out = acc / safe[..., None] if output_scale is None else acc * (output_scale / safe)[..., None]
    return jnp.where(has_values[..., None], out, 0.0)


def finish_split(acc, normalizer, running_max, output_scale=None):
    """Normalised partial output and base-2 LSE of one split (0 / -inf when empty).
    The LSE keeps the unscaled normaliser: the merge weights stay those of softmax."""
    has_values = normalizer > 0
    safe = jnp.maximum(normalizer, 1.0e-20)
    out = normalised(acc, normalizer, output_scale)
    lse = jnp.where(has_values, running_max + jnp.log2(safe), -jnp.inf)
    return out, lse
