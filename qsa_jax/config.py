"""Launch configuration of the sparse-attention kernels, chosen from static shapes.

Every implementation takes its tiling from here, so one table decides how the
selection columns are cut into tiles and how tiles are dealt to split-K
programs. The default is the originals' table (vLLM 0.30.0, tuned on GB300);
the tiling is part of the numerical contract (the bf16 rounding of the
probabilities depends on which tiles share a running maximum), so outputs agree
with the originals best when the same config is used.
"""

from __future__ import annotations

import functools
from typing import NamedTuple


class SparseAttentionConfig(NamedTuple):
    """Tiling of one sparse-attention launch.

    Compares equal to the originals' ``(BLOCK_N, num_warps, num_tiles, num_splits)``
    tuple.
    """

    block_n: int  # selection columns per tile (one K/V gather + two small matmuls)
    num_warps: int  # warps per program (Triton-lowered kernels only)
    num_tiles: int  # ceil(W / block_n): tiles a full row would have
    num_splits: int  # split-K programs per (row, KV head); tiles dealt round-robin


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def select_config(
    num_rows: int,
    num_kv_heads: int,
    use_prefill_config: bool,
    num_columns: int,
) -> SparseAttentionConfig:
    """The originals' config table, keyed on ``num_rows * num_kv_heads``.

    ``num_columns`` is the selection width W (without the trailing count
    column). ``use_prefill_config`` only matters above 2048 programs, where a
    prefill batch prefers narrower tiles with one warp.
    """
    if num_rows < 0 or num_kv_heads <= 0 or num_columns <= 0:
        raise ValueError(
            f"select_config needs num_rows >= 0, num_kv_heads > 0, num_columns > 0; got "
            f"num_rows={num_rows}, num_kv_heads={num_kv_heads}, num_columns={num_columns}")
    programs = num_rows * num_kv_heads
    # (block_n, wanted splits, warps) by number of (row, KV head) programs: few
    # programs need many splits to fill the GPU, many programs need none.
    if programs > 2048:
        block_n, splits, warps = (32, 1, 1) if use_prefill_config else (64, 1, 2)
    elif programs <= 24:
        block_n, splits, warps = 32, 64, 4
    elif programs <= 32:
        block_n, splits, warps = 32, 16, 1
    elif programs <= 64:
        block_n, splits, warps = 32, 8, 1
    elif programs <= 128:
        block_n, splits, warps = 32, 4, 1
    elif programs <= 256:
        block_n, splits, warps = 32, 8, 1
    elif programs <= 512:
        block_n, splits, warps = 64, 4, 2
    else:
        block_n, splits, warps = 64, 1, 2
    num_tiles = _cdiv(num_columns, block_n)
    # A split with no tile would only write an empty partial: cap at the tile count.
    return SparseAttentionConfig(block_n, warps, num_tiles, min(splits, num_tiles))


def reachable_configs(
    num_kv_heads: int, num_columns: int, max_rows: int = 8192
) -> list[SparseAttentionConfig]:
    """Every config ``select_config`` can return for rows 1..max_rows and both flags."""
    found = {
        select_config(rows, num_kv_heads, flag, num_columns)
        for rows in range(1, max_rows + 1)
        for flag in (False, True)
    }
    return sorted(found)


# ---------------------------------------------------------------------------------
# Hopper (sm_90) adjustments used by the "triton" implementation (appended; see
# notes/triton.md for the measurements behind them).


def tune_config_for_hopper(
    config: SparseAttentionConfig, num_rows: int, num_kv_heads: int
) -> SparseAttentionConfig:
    """The triton implementation's config on an H100/H200, from the originals' ``config``.

    Only knobs that keep the originals' rounding are changed: the tiling
    (``block_n``) and the tiles each split walks decide which probabilities
    share a running maximum, and changing them moves results by ~2e-3
    relative (measured), past the 1e-3 agreement bar. Exception: when a
    split count leaves only the last tile doubled up (64 splits of 65 tiles),
    giving that tile its own split changes only the <= 3 tail columns.
    """
    programs = num_rows * num_kv_heads
    splits = config.num_splits
    if config.num_tiles == splits + 1 and programs <= 24:
        splits = config.num_tiles
    return config._replace(num_splits=splits)


@functools.lru_cache(maxsize=None)
def running_on_hopper() -> bool:
    """Whether JAX's default device is a Hopper GPU (compute capability 9.x): the
    device the launch tables below were measured on. Elsewhere the kernels launch
    with the originals' table as is."""
    import jax

    try:
        device = jax.devices()[0]
    except RuntimeError:
        return False
    return str(getattr(device, "compute_capability", "")).startswith("9.")


def pallas_hopper_launch(config: SparseAttentionConfig) -> tuple[int, int]:
    """(num_warps, num_stages) for the Pallas sparse-attention kernel on Hopper.

    Used only when the caller did not pass ``config=`` (the tiling itself --
    block_n, num_tiles, num_splits -- is never changed: it fixes the numerics).
    The Pallas kernel compiles to the originals' instruction mix, except that at
    one warp its [16, 256] fp32 accumulator plus the pipelined tile spill ~5x
    more than the original's (ptxas: 780 vs 160 bytes); two warps have no
    spills (notes/pallas.md). Other configs keep the table's warps.
    """
    warps = 2 if config.num_warps == 1 else config.num_warps
    return warps, 2


def pallas_prefetch(config: SparseAttentionConfig) -> bool:
    """Whether the Pallas sparse-attention kernel loads the next tile's indices and
    block-table entries while the current tile's K/V gather is in flight.

    No numeric effect (same arithmetic, same order). Off until measured on Hopper
    (notes/pallas.md); the jax-triton kernel's prefetch helped at 32-64 rows and
    hurt at BN 64 with several splits (notes/triton.md).
    """
    del config
    return False


# The merge's D chunk when the batch is small: the jax-triton merge's 64 (notes/triton.md).
MERGE_SMALL_BATCH_BLOCK_D = 64
# Up to this many (row, head) pairs the merge splits D, for more programs than SMs.
MERGE_SPLIT_D_MAX_PAIRS = 256


def pallas_merge_block_d(pairs: int, head_dim: int) -> int:
    """D columns per program of the Pallas split merge, for ``pairs`` = rows x heads.

    The same arithmetic for every element, but on the GPU the sum over splits can
    associate differently with another block shape (last-bit differences before the
    bf16 rounding, seen at 4 rows TP1 in bench.decode_sweep; none at 1 row; none in
    interpret mode); parity with the originals is tested at both settings. At decode
    one program per (row, head) gives 6-24 programs for 132 SMs, each a chain of
    dependent loads over the whole [splits, D] slab: the H200 trace had the
    Pallas merge at 3.6-4.0 µs per call at 1 row against 2.0-2.3 µs for the jax-triton
    merge, which splits D in 64-wide chunks. With many pairs the chunks only add
    programs (the jax-triton merge was 2.7x slower than the Pallas one at 64 rows,
    TP1), so D stays whole there.
    """
    if pairs <= MERGE_SPLIT_D_MAX_PAIRS and head_dim % MERGE_SMALL_BATCH_BLOCK_D == 0:
        return min(head_dim, MERGE_SMALL_BATCH_BLOCK_D)
    return head_dim
