"""Launch configuration of the sparse-attention kernels, chosen from static shapes.

Every implementation takes its tiling from here, so one place decides how the
selection columns are cut into tiles and how tiles are dealt to split-K
programs. The tables are vLLM's, as data: 0.30.0 has one (tuned on GB300);
0.34.0 picks one by the GPU's compute capability and the cache dtype (sm_90,
sm_120, an fp8 override on sm_80, GB300's everywhere else). The default
follows 0.34.0 for the current device, or this project's measured table for
that device where one exists (``MEASURED_TABLES``, on the SM count it was measured
on: ``MEASURED_SM_COUNTS``); ``table="vllm-0.30"``
gives 0.30.0's choice anywhere. Off a GPU every choice is GB300's table, so
on CPU the default equals 0.30.0's.

The tiling is part of the numerical contract (the rounding of the
probabilities depends on which tiles share a running maximum), so outputs agree
with a given vLLM version best when its table is used.

How a tiling is launched lives here too, apart from the tiling: one frozen
record of knobs per implementation (``PallasLaunch``, ``TritonLaunch``: warps,
pipelining stages, prefetch, the split merge's block and warps), its default
from ``pallas_launch`` / ``triton_launch``, and the caller's override
``sparse_attention(..., launch=...)``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from qsa_jax.arg_specs import MAX_WARMUP_ROWS

if TYPE_CHECKING:  # the problem type lives with the operator, which imports this module
    from qsa_jax.ops.sparse_attention.base import SparseAttentionProblem


class SparseAttentionConfig(NamedTuple):
    """Tiling of one sparse-attention launch.

    Compares equal to the originals' ``(BLOCK_N, num_warps, num_tiles, num_splits)``
    tuple.
    """

    block_n: int  # selection columns per tile (one K/V gather + two small matmuls)
    num_warps: int  # the table's warps per program (what launches: pallas_launch / triton_launch)
    num_tiles: int  # ceil(W / block_n): tiles a full row would have
    num_splits: int  # split-K programs per (row, KV head); tiles dealt round-robin


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (Triton's in-kernel arrays have power-of-two sizes)."""
    return 1 << max(0, (int(n) - 1).bit_length())


# Above this many (row, KV head) programs vLLM's tables have one split (or two) and
# ``use_prefill_config`` chooses between a decode and a prefill tiling. A measured table whose two
# large-batch entries are one tiling may carry its bands further (the flag then picks nothing).
LARGE_BATCH_PROGRAMS = 2048


class Tiling(NamedTuple):
    """One entry of a config table: what ``select_config`` turns into a config."""

    block_n: int
    splits: int  # wanted split count; capped at the number of tiles
    warps: int
    # Software-pipelining depth of the Pallas kernel's tile loop; None: the
    # implementation's own default (vLLM's tables do not set it).
    stages: int | None = None
    # The implementation this entry was measured fastest with, which
    # ``sparse_attention(implementation=None)`` then tries first (``sparse_attention_order``);
    # None: the default order. Only a measured table sets it; it has no numeric effect
    # beyond which kernel runs the (same) tiling.
    implementation: str | None = None
    # The Pallas kernel's warps where the entry was measured with another implementation
    # and Pallas's own winner there used other warps (it then still runs when that
    # implementation cannot, or is named); None: ``warps``.
    pallas_warps: int | None = None
    # Likewise the Pallas kernel's split count (``pallas_tiling``), where the entry's count fills
    # a wave of the one-warp jax-triton kernel and Pallas, at its own warps, measured faster at
    # another; None: ``splits``. Unlike the warps it changes the rounding: Pallas then sums
    # other splits than jax-triton (both within the accuracy contract).
    pallas_splits: int | None = None

    def as_pallas_launches(self) -> "Tiling":
        """This entry as the Pallas kernel launches it: its ``pallas_splits`` and ``pallas_warps``
        where it names them (``pallas_tiling``, ``pallas_launch``)."""
        return self._replace(splits=self.pallas_splits or self.splits, warps=self.pallas_warps or self.warps)


@dataclasses.dataclass(frozen=True)
class TilingTable:
    """A config table keyed on programs = rows x KV heads.

    ``bands`` are ``(most programs, tiling)`` in ascending order and must reach
    ``LARGE_BATCH_PROGRAMS``; above the last band the flag ``use_prefill_config`` picks one of
    the two large-batch entries. Bands may go past ``LARGE_BATCH_PROGRAMS`` only where the two
    large-batch entries are the same tiling: the flag has no say below the last band, and there
    it must have none to lose.
    """

    name: str
    bands: tuple[tuple[int, Tiling], ...]
    large_decode: Tiling
    large_prefill: Tiling

    def __post_init__(self):
        bounds = [b for b, _ in self.bands]
        if bounds != sorted(bounds) or bounds[-1] < LARGE_BATCH_PROGRAMS:
            raise ValueError(f"table {self.name}: bands must ascend and reach {LARGE_BATCH_PROGRAMS} programs; "
                             f"got bounds {bounds}")
        if bounds[-1] > LARGE_BATCH_PROGRAMS and self.large_decode != self.large_prefill:
            raise ValueError(f"table {self.name}: bands past {LARGE_BATCH_PROGRAMS} programs (to {bounds[-1]}) "
                             "would take use_prefill_config's choice away; its two large-batch entries differ")

    def pick(self, programs: int, use_prefill_config: bool) -> Tiling:
        if programs > self.bands[-1][0]:
            return self.large_prefill if use_prefill_config else self.large_decode
        return next(t for bound, t in self.bands if programs <= bound)


def _table(name, bands, large_decode, large_prefill=None) -> TilingTable:
    return TilingTable(name, tuple((b, Tiling(*t)) for b, t in bands), Tiling(*large_decode),
                       Tiling(*(large_prefill or large_decode)))


# The numbers below are vLLM's (0.30.0 and 0.34.0 qsa.py ``_select_config``), restated as data.
# Few programs want many splits to fill the GPU; many programs want none.

# Tuned by vLLM on GB300. The only table of 0.30.0; in 0.34.0 the table of every GPU
# without one of its own, for bf16 and fp8 caches alike.
GB300 = _table("gb300", [(24, (32, 64, 4)), (32, (32, 16, 1)), (64, (32, 8, 1)), (128, (32, 4, 1)),
                         (256, (32, 8, 1)), (512, (64, 4, 2)), (2048, (64, 1, 2))],
               large_decode=(64, 1, 2), large_prefill=(32, 1, 1))
# vLLM 0.34.0, sm_90 (tuned by vLLM on an H20).
SM90_BF16 = _table("sm90-bf16", [(32, (64, 64, 2)), (64, (32, 16, 1)), (256, (32, 8, 1)),
                                 (2048, (32, 4, 1))],
                   large_decode=(64, 1, 2), large_prefill=(32, 1, 1))
SM90_FP8 = _table("sm90-fp8", [(24, (64, 64, 2)), (32, (32, 16, 1)), (64, (32, 8, 1)), (128, (32, 4, 1)),
                               (256, (32, 8, 1)), (2048, (32, 4, 1))],
                  large_decode=(64, 1, 2), large_prefill=(32, 1, 1))
# vLLM 0.34.0, sm_120 (RTX PRO 6000 Blackwell).
SM120_BF16 = _table("sm120-bf16", [(24, (64, 64, 8)), (64, (64, 8, 8)), (128, (32, 8, 8)),
                                   (256, (32, 8, 1)), (512, (64, 4, 2)), (2048, (32, 4, 1))],
                    large_decode=(64, 2, 2))
SM120_FP8 = _table("sm120-fp8", [(24, (64, 64, 8)), (32, (128, 8, 4)), (64, (64, 8, 4)), (128, (32, 4, 4)),
                                 (256, (128, 4, 4)), (512, (64, 4, 4)), (2048, (32, 2, 1))],
                   large_decode=(64, 1, 2), large_prefill=(32, 2, 1))

# vLLM 0.34.0's choice: exact compute capability -> (bf16 table, fp8 table); any other
# capability (and no GPU at all) gets GB300.
VLLM_034_TABLES: dict[tuple[int, int], tuple[TilingTable, TilingTable]] = {
    (9, 0): (SM90_BF16, SM90_FP8),
    (12, 0): (SM120_BF16, SM120_FP8),
}
# vLLM 0.34.0 then overrides block_n and warps for fp8 caches on these capabilities (A100:
# wider tiles for its byte-decode path); the split count stays the table's.
VLLM_034_FP8_OVERRIDES: dict[tuple[int, int], dict[str, int]] = {(8, 0): dict(block_n=128, warps=4)}

# This project's own Hopper table, measured on an H200 (2026-12-03) by
# ``python -m bench.hopper_sweep``: per bucket of programs, the fastest (block_n,
# splits, warps, stages) of 6-26 tried (6 at 4096 programs) on the TP1 and TP4 geometries in one process
# beside vLLM 0.30.0 and 0.34.0, among the configs whose error from exact float64
# attention is at most 1.10x the 0.30.0 original's (the winners measured 1.00-1.04x).
# Busy time per call of each winner against the faster original, TP1 / TP4
# (bench/results/nvidia-h200_2026-12-03/hopper_sweep/sweep.md):
#   1-2 programs 0.88-0.94x, 4 1.01x, 8 1.07-1.13x, 16 1.02-1.06x (at 4-16 programs the
#   Pallas kernel at 0.34's own tiling is as fast as 0.34; see notes/pallas.md),
#   32 0.95-0.98x, 64-128 0.87-0.89x, 256 0.80-0.86x, 512 0.87-0.88x, 1024-2048
#   0.95-0.98x, 4096 0.99-1.00x. Above 4096 programs the 4096 winner, which is also vLLM's
#   large-batch decode tiling; swept at 8192 programs on 2026-12-03 (session 6, 16 configs,
#   bench/results/nvidia-h200_2026-12-03/session6/sweep8192/): the same winner, 0.99-1.00x.
#   use_prefill_config takes it too (0.91x the originals' prefill tiling in the grid).
# The 5-8-program entry is vLLM 0.34.0's own tiling (64-wide tiles, 33 splits -- its 64 capped at
# the 33 tiles of W = 2051 --, 2 warps, 2 stages) since session 26, a tiling the sweep never tried
# there. Measured on an H100 only (not yet confirmed on an H200): Pallas at it ran 1.00 / 1.00x
# of 0.34.0 at 8 programs (TP1 / TP4) where the sweep's winner (64, 32, 4, 2) ran 1.07 / 1.08x,
# with the same error from exact attention (bench/results/nvidia-h100_2026-12-06/session25/
# call_b/bf16_ab_pallas/), and 1.00 / 0.99x against 1.08 / 1.10x at 6 programs (session26/
# call_a/bf16_ab_6/); tests/test_config.py holds the entry to both files. At 16 programs session
# 25's file keeps the sweep's entry (0.99-1.00x against 1.03-1.04x).
H200_BF16 = _table("h200-bf16-measured",
                   [(2, (32, 65, 4, 2)), (4, (64, 33, 8, 2)), (8, (64, 33, 2, 2)), (16, (16, 32, 4, 2)),
                    (32, (32, 16, 2, 2)), (64, (32, 8, 2, 3)), (128, (32, 4, 2, 3)), (256, (32, 2, 2, 3)),
                    # 529-660 programs: 3 splits, 661-792: 2, one split again from 793 (session 36, H100,
                    # bench/results/nvidia-h100_2026-12-07/session36/call_a/, call_c/). Why: the kernel's
                    # 255 registers at 2 warps leave 4 programs per SM, 528 per wave on 132 SMs, so one
                    # split just past 528 programs puts a few full-length programs in a second wave of
                    # their own: 1.03-1.13x of 0.34.0 at 544-648 programs, 1.00x at 672. Three splits
                    # make every program a third as long and so the idle tail a third as long (0.89-0.96x
                    # there); as the second wave fills, fewer splits win. Timed at 300-1056 programs,
                    # TP1 and TP4, 1-4 splits: in 529-792 each count here within 1.3% of the fastest
                    # (4 splits that much faster at 544-600); below 528 one split within 3% (3 splits
                    # faster by 2-3% at 300). The error from exact attention a little lower (2.73-2.80e-3
                    # against one split's 2.76-2.82e-3: fewer roundings of partial sums). Measured on an
                    # H100; the H200 has the same waves (132 SMs, the same registers) but more bandwidth.
                    # Session 37 (H100, session37/call_b/): past two waves, one split ran 3.7-4.9%
                    # slower than 2 at 1100 and 1200 programs (2.1-2.3 waves), level at 1320, and was
                    # the fastest at 1450 and 1584 (1.3-1.8% slower than 2 splits at 1800): 2 splits at
                    # 1057-1320.
                    (528, (32, 1, 2, 3)), (660, (32, 3, 2, 3)), (792, (32, 2, 2, 3)),
                    (1056, (32, 1, 2, 3)), (1320, (32, 2, 2, 3)), (2048, (32, 1, 2, 3))],
                   large_decode=(64, 1, 2, 2))

# fp8 caches (e4m3, scales 0.5 / 2.0) on an H200 (2026-12-03), ``python -m bench.hopper_sweep
# --kv-dtype fp8`` beside vLLM 0.34.0 (the only original with fp8), same eligibility rule
# against 0.34.0's error. Every bucket measured: 64, 256, 1024-4096 programs in
# bench/results/nvidia-h200_2026-12-03/session6/fp8_sweep/, 1-32, 128 and 512 in
# session7/fp8_sweep_small/ (tests/test_config.py checks each Pallas entry against those winners;
# the per-bucket ratios below are those Pallas winners', some since replaced by "triton" entries).
# One warp wins from 256 programs. Likely why: with 2 warps the fp8 kernel issued 498M
# instructions against 0.34.0's 303M at 1 warp, with half the issue slots busy and 42% of
# DRAM bandwidth (Nsight Compute, TP1 1024 rows). Winner against 0.34.0, TP1 / TP4:
# 1-4 programs 0.71-0.85x, 8 1.03-1.08x, 16 1.12-1.21x, 32 0.95-0.99x, 64 1.04-1.09x,
# 128 1.07-1.10x, 256 1.22-1.36x, 512 1.32-1.39x, 1024-2048 1.28-1.42x, 4096 1.06-1.11x
# (0.34.0's table launched by this project, same day: 1.48-1.56x at TP1 256-2048 rows).
# Where an entry names "triton", the jax-triton kernels run it (sparse_attention_order says
# why and what they measured): every one-warp entry (25 programs up: sessions 8-9 from 129,
# session 11 at 0.34.0's tiling for 33-128 and 257-512,
# bench/results/nvidia-h200_2026-12-04/session11/call_a/fp8_original_tiling/, session 26 for
# 25-32, on an H100), and
# 5-24 programs at 0.34.0's own tiling (64-wide tiles, 2 warps, 2 stages; 33 splits, which is
# 0.34.0's 64 capped at the 33 tiles of W = 2051, so the same launch while W <= 2112), which
# there measured 0.99-1.06x of 0.34.0 against the Pallas winners' 1.06-1.22x in one run
# (H200, 2026-12-04, bench/results/nvidia-h200_2026-12-04/session10/fp8_small_programs/).
# Pallas at that same tiling measured level with it (0.99-1.07x, session10/after_defaults/):
# the tiling is the gain; the "triton" tag keeps 0.34.0's own kernel launch and rounding.
H200_FP8 = _table("h200-fp8-measured",
                  [(2, (32, 65, 4, 2)), (4, (64, 33, 8, 2)), (8, (64, 33, 2, 2, "triton")),
                   (16, (64, 33, 2, 2, "triton")), (24, (64, 33, 2, 2, "triton")),
                   # 25-32 (session 26, H100, bench/results/nvidia-h100_2026-12-06/session26/
                   # call_g/): the entry was the Pallas sweep's (32, 16, 2 warps), which jax-triton,
                   # and with it the shim's default route for fp8 (triton-torch), ran at 1.19-1.31x
                   # of 0.34.0; at one warp (0.34.0's own tiling) jax-triton ran 0.99 / 0.91x
                   # (TP1 / TP4) against Pallas's 0.95 / 1.00x at 2 warps, which Pallas keeps.
                   # 25-528 (session 35, H100, bench/results/nvidia-h100_2026-12-07/session35/
                   # call_d/, call_e/): the split count that fills one wave of the one-warp kernel
                   # without starting a second. Its 255 registers leave 8 programs per SM, 1056 on
                   # 132 SMs, so at P programs the count is the largest of 16 / 8 / 6 / 4 / 3 / 2
                   # with count x P <= 1056 (the power-of-two buckets before it had 16 / 8 / 4 / 4 / 4
                   # splits, filling a quarter to half a wave at the bottom of each bucket and
                   # 1.5-1.9 waves at the top of 257-512). Measured at 64-512 programs, TP1 and TP4,
                   # 2-16 splits beside 0.34.0: this count was the fastest or within 2.7% of it in
                   # all 20 cases (the exact floor(1056 / P), where it is 5, 7 or 10, by at most
                   # 2.7%: not worth three more kernels to compile), 2-23% faster than the buckets'
                   # counts wherever they differ (TP1 300 programs 174.9 -> 137.1 us), and it takes
                   # the buckets' 1.07-1.10x of 0.34.0 at 132 programs to 0.97-1.01x. A count whose
                   # grid spills into a second wave ran 13-48% slower (3 at 396, 6 at 200, 8 at 140).
                   # The same error from exact attention (2.32-2.36e-3 at every count). Pallas
                   # (where jax-triton is missing, or named) keeps its own sweep's 2 warps to 132
                   # programs (1 warp spills in Pallas, session 8) and there its sweep's split
                   # counts (``pallas_splits``: 8 at 33-66, 4 at 67-132): at 2 warps the
                   # wave-filling counts ran 7-11% slower than those (call_f/pallas/: 64, 100 and
                   # 132 programs, TP1 and TP4). From 133 programs Pallas runs one warp, and there
                   # the wave-filling counts were its fastest too (call_g/pallas/: 6 splits at 150
                   # and 170 programs 16-20% faster than 4, 3 at 300 programs 20% faster than 2).
                   (32, (32, 16, 1, 2, "triton", 2)), (66, (32, 16, 1, 2, "triton", 2, 8)),
                   (132, (32, 8, 1, 2, "triton", 2, 4)),
                   (176, (32, 6, 1, 2, "triton")), (264, (32, 4, 1, 2, "triton")),
                   (352, (32, 3, 1, 2, "triton")),
                   # 513-2048 programs and the large-batch entry (use_prefill_config takes it too)
                   # were 2 splits until session 21: the Pallas sweep's winner, kept when jax-triton
                   # took the entries, and 1.05x of 0.34.0's prefill tiling there (session 9).
                   # Re-measured on an H100 (the same sm_90 table; bench/results/
                   # nvidia-h100_2026-12-05/session21/): one split -- 0.34.0's prefill tiling, no
                   # merge kernel -- is 2-9% faster than 2 splits at 768-8192 programs and 0.99x of
                   # 0.34.0's own prefill launch; at 520 programs one split is 17-21% slower. The
                   # boundary, measured in session 23 (H100): 2 splits win at 528 programs (one
                   # split +17-20%), one split from 576 (-5 to -13%). Why there: the one-warp
                   # kernel's registers leave 8 programs per SM, 1056 on the 132 SMs of an H100
                   # SXM or H200, so up to 528 programs 2 splits still run in one wave and one
                   # split would leave half the slots empty; above it, 2 splits need a second,
                   # partial wave and a merge. Sm_90 cards with fewer SMs (H100 PCIe 114, H20 78)
                   # would want the boundary lower; unmeasured, so they take vLLM 0.34.0's table
                   # (MEASURED_SM_COUNTS). These entries have no
                   # pallas_warps: where jax-triton is missing, Pallas runs them at one warp and
                   # one split, a launch its sweep did not try (its winner here had 2 splits);
                   # timed in session 23 (H100): 1.4-2.5% faster than 2 splits at 1024 and 4096
                   # programs, TP1 and TP4.
                   # Session 37 (H100, bench/results/nvidia-h100_2026-12-07/session37/call_a/, call_b/):
                   # the one split of 529-2048 programs, timed at 1-4 splits at 560-2000 programs, TP1
                   # and TP4. Past one wave (1057-1260) it ran 1.15-1.23x of 0.34.0: a few full-length
                   # programs in a second wave of their own, as in the bf16 table past 528. The counts
                   # below follow the waves of 1056: 3 splits to 704 programs (3 x 704 = two full
                   # waves), one split to 1056 (one wave), 4 splits to 1260, 2 splits to 1584 (2 x 1584
                   # = three full waves), one split from 1585 (1.5-1.94 waves). Each count here was the
                   # fastest or within 3% of it (behind by 1.3% at TP1 700 programs, where one split
                   # edges 3, and by 0.9-2.9% at TP4 750, 1260, 1320, 1380 and 1700, where TP1 and TP4
                   # disagree on the fastest) and 0.85-1.00x of 0.34.0 at every count timed (jax-triton);
                   # the old one split had been up to 19% slower than 3 splits at 560-700 (TP4) and
                   # 16-26% slower than 4 at 1080-1260. The error from exact attention is the same
                   # (2.32-2.39e-3 at every count). Pallas, where jax-triton is missing, runs these counts
                   # at one warp: at 600, 1100 and 1450 programs (TP1, session 38 call_a/fp8_pallas/) each
                   # was its fastest of 1-4 splits at one warp, though only 1.19-1.32x of 0.34.0; 2 warps
                   # were no faster but at 1100 (3 and 4 splits 6% and 5% ahead, call_b/): no override.
                   (528, (32, 2, 1, 2, "triton")), (704, (32, 3, 1, 2, "triton")),
                   (1056, (32, 1, 1, 2, "triton")), (1260, (32, 4, 1, 2, "triton")),
                   (1584, (32, 2, 1, 2, "triton")), (2048, (32, 1, 1, 2, "triton")),
                   # Session 38 (H100, bench/results/nvidia-h100_2026-12-07/session38/call_a/fp8/ and
                   # call_c/fp8_past_2048/): the large-batch entry's one split past 2048 programs, timed at
                   # 1-4 splits at 2112-3300 programs and 1-3 at 2300-4600, TP1 and TP4. Just past a whole
                   # number of waves it lost as it did past 1056: 4.8-11% slower than the fastest at
                   # 2200-2400 (2.1-2.3 waves) and 2.1-5.5% at 3300 (3.1 waves); it was the fastest at
                   # 2112, 2700, 2800 and 3168 (whole waves, or more than half of the last). Two splits,
                   # whose half-length programs fill the first half of the last wave, take 2113-2640 (to
                   # 2.5 waves) and 3169-3695 (to 3.5 waves). By 3696 one split is back in front: 3.2%
                   # ahead of 2 splits at TP1, 0.4% behind at TP4. The band ended at 3500 until session
                   # 40 (H100, bench/results/nvidia-h100_2026-12-08/session40/call_a/fp8/) timed 3550 and
                   # 3650: 2 splits the fastest or 0.9% behind (TP1 3650), one split up to 3.5% behind
                   # (TP4 3550). Each count here is within 1.8% of the fastest and 0.72-0.91x of 0.34.0.
                   # From 3696 the large-batch entry: past four waves a band would gain at most 2.7%
                   # (2 splits at TP4 4300) and lose up to 2.0% (TP1 4600).
                   (2112, (32, 1, 1, 2, "triton")), (2640, (32, 2, 1, 2, "triton")),
                   (3168, (32, 1, 1, 2, "triton")), (3695, (32, 2, 1, 2, "triton"))],
                  large_decode=(32, 1, 1, 2, "triton"))

# This project's own tables, measured on a card of the given capability, same form as
# VLLM_034_TABLES. ``table=None`` (the default) consults them first, on the cards they were
# measured on (``MEASURED_SM_COUNTS``).
MEASURED_TABLES: dict[tuple[int, int], tuple[TilingTable, TilingTable]] = {
    (9, 0): (H200_BF16, H200_FP8),
}
# The SM count of the cards each measured table was measured on: the H200 and the H100 SXM
# have 132. Other parts of the capability -- sm_90's H20 (78 SMs, the card vLLM tuned its sm_90
# table on) and H100 PCIe (114) -- take vLLM 0.34.0's table for it: how many programs fill the
# card (the one-split boundary at 528 programs is half of 8 programs x 132 SMs; the split counts
# of the small buckets) was only ever timed on 132 SMs.
MEASURED_SM_COUNTS: dict[tuple[int, int], int] = {(9, 0): 132}

TABLE_NAMES = ("vllm-0.30", "vllm-0.34")


# The implementations compiled by Triton (Pallas through XLA's Triton, and jax-triton).
TRITON_LOWERED = ("pallas", "triton")
# Triton's e4m3 type (float8e4nv) needs sm_89 (Ada, Hopper and later).
FP8_MIN_CAPABILITY = (8, 9)


def fp8_kernels_run_here() -> bool:
    """Whether the Triton-compiled kernels can read an fp8 cache on JAX's default device
    (True off an NVIDIA GPU: there the registry's own checks decide)."""
    cap = device_capability()
    return cap is None or cap >= FP8_MIN_CAPABILITY


@functools.lru_cache(maxsize=None)
def device_capability() -> tuple[int, int] | None:
    """(major, minor) compute capability of JAX's default device; None off an NVIDIA GPU."""
    import jax

    try:
        return _as_capability(getattr(jax.devices()[0], "compute_capability", None))
    except (RuntimeError, ValueError):  # no backend, or not a CUDA "major.minor" string
        return None


@functools.lru_cache(maxsize=None)
def device_sm_count() -> int | None:
    """Streaming multiprocessors of JAX's default device (``Device.core_count``, which JAX's
    own Pallas GPU ops read); None off an NVIDIA GPU or where the device does not say."""
    import jax

    try:
        device = jax.devices()[0]
    except RuntimeError:  # no backend
        return None
    count = getattr(device, "core_count", None) if device.platform == "gpu" else None
    return count if isinstance(count, int) and count > 0 else None


def measured_tables_apply(capability: tuple[int, int] | None) -> bool:
    """Whether ``MEASURED_TABLES[capability]`` is for the current device: a measured table
    exists for it, and the device's SM count is the one it was measured on (or unknown:
    off a GPU, or a device that does not report it)."""
    if capability not in MEASURED_TABLES:
        return False
    want, have = MEASURED_SM_COUNTS.get(capability), device_sm_count()
    return want is None or have is None or have == want


def _as_capability(value) -> tuple[int, int] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        value = value.split(".")
    try:
        major, minor = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"capability must be (major, minor) or 'major.minor'; got {value!r}") from None
    return major, minor


def table_tiling(
    programs: int,
    use_prefill_config: bool,
    *,
    is_fp8: bool = False,
    capability=None,
    table: str | None = None,
) -> Tiling:
    """The (block_n, wanted splits, warps) entry ``select_config`` starts from.

    ``table``: "vllm-0.30" (GB300's table on every device, fp8 or not), "vllm-0.34"
    (vLLM 0.34.0's choice by compute capability and cache dtype) or None: this project's
    measured table for the capability if there is one (``MEASURED_TABLES``) and, for the
    current device, if it has the SM count the table was measured on (``MEASURED_SM_COUNTS``:
    an H20 takes 0.34.0's sm_90 table, tuned on that card), else "vllm-0.34". ``capability``
    defaults to the current device's (given, it names the capability's measured card); off a
    GPU there is none and every table is GB300's, so CPU runs keep 0.30.0's tiling for bf16
    and fp8 alike.
    """
    if table is not None and table not in TABLE_NAMES:
        raise ValueError(f"table must be one of {TABLE_NAMES} or None; got {table!r}")
    cap = device_capability() if capability is None else _as_capability(capability)
    tables = _tables(cap, table, current_device=capability is None)
    tiling = tables[bool(is_fp8)].pick(programs, use_prefill_config)
    # 0.34.0's own fp8 overrides (sm_80), on 0.34.0's choice only.
    if is_fp8 and table != "vllm-0.30" and tables is not MEASURED_TABLES.get(cap) \
            and cap in VLLM_034_FP8_OVERRIDES:
        tiling = tiling._replace(**VLLM_034_FP8_OVERRIDES[cap])
    return tiling


def _tables(cap, table: str | None, *, current_device: bool) -> tuple[TilingTable, TilingTable]:
    """(bf16, fp8) tables for ``table`` on capability ``cap`` (``table_tiling`` says which)."""
    if table == "vllm-0.30":
        return GB300, GB300
    # The current device's measured tables only where it is the card they were measured on.
    if table is None and (measured_tables_apply(cap) if current_device else cap in MEASURED_TABLES):
        return MEASURED_TABLES[cap]
    return VLLM_034_TABLES.get(cap, (GB300, GB300))


def default_table_names() -> dict[str, str]:
    """The names of the tables ``table=None`` picks from on the current device, per cache dtype
    (the benchmark records them: which table ran depends on the card's SM count, too)."""
    bf16, fp8 = _tables(device_capability(), None, current_device=True)
    return {"bf16": bf16.name, "fp8": fp8.name}


def select_config(
    num_rows: int,
    num_kv_heads: int,
    use_prefill_config: bool,
    num_columns: int,
    is_fp8: bool = False,
    capability=None,
    *,
    table: str | None = None,
) -> SparseAttentionConfig:
    """The tiling for a call, keyed on ``num_rows * num_kv_heads`` programs.

    ``num_columns`` is the selection width W (without the trailing count
    column). ``use_prefill_config`` only matters above 2048 programs, where a
    prefill batch gets narrower tiles with one warp in vLLM's tables (all but 0.34.0's sm_120
    bf16 one; the measured H200 tables have no separate prefill entry). ``is_fp8``: the cache
    holds e4m3 values (float8_e4m3fn, or their bytes as uint8). ``capability``
    ((major, minor), default: the current device's) and ``table`` pick the table:
    see ``table_tiling``. ``table="vllm-0.30"`` is exactly vLLM 0.30.0's
    ``_select_config``; ``table="vllm-0.34"`` is 0.34.0's for that capability.
    On the measured tables an implementation may launch a refinement of it:
    ``triton_tiling`` (the smallest batches' last tile) and ``pallas_tiling`` (Pallas's own
    split count at the fp8 entries that name ``pallas_splits``).
    """
    for name, value in (("num_rows", num_rows), ("num_kv_heads", num_kv_heads), ("num_columns", num_columns)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise TypeError(f"select_config: {name} must be an int; got {value!r}")
    if num_rows < 0 or num_kv_heads <= 0 or num_columns <= 0:
        raise ValueError(
            f"select_config needs num_rows >= 0, num_kv_heads > 0, num_columns > 0; got "
            f"num_rows={num_rows}, num_kv_heads={num_kv_heads}, num_columns={num_columns}")
    entry = table_tiling(num_rows * num_kv_heads, use_prefill_config, is_fp8=is_fp8,
                         capability=capability, table=table)
    block_n, splits, warps = entry.block_n, entry.splits, entry.warps
    num_tiles = _cdiv(num_columns, block_n)
    # A split with no tile would only write an empty partial: cap at the tile count.
    return SparseAttentionConfig(block_n, warps, num_tiles, min(splits, num_tiles))


def first_rows(
    num_kv_heads: int, num_columns: int, max_rows: int = MAX_WARMUP_ROWS, *, is_fp8: bool = False,
    capability=None, table: str | None = None,
) -> dict[SparseAttentionConfig, int]:
    """Every config ``select_config`` returns for rows 1..max_rows and both flags, each with
    the smallest row count that picks it (what a warmup compiles)."""
    found: dict[SparseAttentionConfig, int] = {}
    for rows in range(1, max_rows + 1):
        for flag in (False, True):
            found.setdefault(select_config(rows, num_kv_heads, flag, num_columns, is_fp8, capability,
                                           table=table), rows)
    return found


def reachable_configs(
    num_kv_heads: int, num_columns: int, max_rows: int = MAX_WARMUP_ROWS, *, is_fp8: bool = False,
    capability=None, table: str | None = None,
) -> list[SparseAttentionConfig]:
    """Every config ``select_config`` can return for rows 1..max_rows and both flags."""
    return sorted(first_rows(num_kv_heads, num_columns, max_rows, is_fp8=is_fp8, capability=capability,
                             table=table))


# ---------------------------------------------------------------------------------
# Hopper (sm_90) adjustments used by the "triton" implementation (appended; see
# notes/triton.md for the measurements behind them).


def tune_config_for_hopper(
    config: SparseAttentionConfig, num_rows: int, num_kv_heads: int
) -> SparseAttentionConfig:
    """The triton implementation's config on an H100/H200, from a measured table's ``config``.

    Only knobs that keep the originals' rounding are changed: the tiling
    (``block_n``) and the tiles each split walks decide which probabilities
    share a running maximum, and changing them moves results by ~2e-3
    relative (measured), past the 1e-3 agreement bar. Exception: when a
    split count leaves only the last tile doubled up (64 splits of 65 tiles),
    giving that tile its own split changes only the <= 3 tail columns -- still a
    different rounding: 3.4e-4 from vLLM 0.30.0 at TP2 16 rows (H200, session 12), over
    the fidelity bar, so ``triton_tiling`` applies it only on the library's measured table.
    """
    programs = num_rows * num_kv_heads
    splits = config.num_splits
    if config.num_tiles == splits + 1 and programs <= 24:
        splits = config.num_tiles
    return config._replace(num_splits=splits)


def running_on_hopper() -> bool:
    """Whether JAX's default device is a Hopper GPU (compute capability 9.x): the
    device the launch tables below were measured on. Elsewhere the kernels launch
    with the originals' table as is."""
    cap = device_capability()
    return cap is not None and cap[0] == 9


# ---------------------------------------------------------------------------------
# Launch knobs: how each implementation launches a tiling. None of them changes the
# arithmetic (the tiling above does); on the GPU a different warp count or merge block
# can still change how Triton associates a reduction, i.e. last bits. Each
# implementation has its own frozen record; ``sparse_attention(..., launch=...)``
# overrides the fields it sets (None: the default below), the rest keep the default.


@dataclasses.dataclass(frozen=True)
class _Launch:
    """The knobs both Triton-lowered implementations have (None: the default)."""

    num_warps: int | None = None
    num_stages: int | None = None
    prefetch: bool | None = None
    merge_block_d: int | None = None
    merge_warps: int | None = None

    def __post_init__(self):
        kind = type(self).__name__
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            if field.name == "prefetch":
                if not isinstance(value, bool):
                    raise TypeError(f"{kind}.prefetch must be a bool or None; got {value!r}")
            elif field.name == "merge":
                if value not in MERGE_MODES:
                    raise ValueError(f"{kind}.merge must be one of {MERGE_MODES} or None; got {value!r}")
            elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{kind}.{field.name} must be an int >= 1 or None; got {value!r}")
            elif field.name != "num_stages" and value & (value - 1):
                raise ValueError(f"{kind}.{field.name} must be a power of two; got {value}")


# How the Pallas forward merges its splits (PallasLaunch.merge): "separate" = a second
# kernel; "fused" = one launch whose last program to finish a (row, KV head) merges.
MERGE_MODES = ("separate", "fused")


@dataclasses.dataclass(frozen=True)
class PallasLaunch(_Launch):
    """Launch knobs of the Pallas implementation (defaults: ``pallas_launch``).

    ``num_warps``/``num_stages``: the attention kernel's warps and software-pipelining
    depth; ``prefetch``: load the next tile's indices and block-table entries while the
    current tile's K/V gather is in flight (same arithmetic, same order); ``merge_block_d``
    and ``merge_warps``: D columns per program and warps of the split merge.
    ``merge`` (only with several splits): "separate" (default) merges in a second kernel
    with ``merge_warps``; "fused" runs one kernel in which the last split program of each
    (row, KV head) to store its partial (an atomic arrival counter tells it) merges that
    (row, KV head)'s G heads itself, ``merge_block_d`` columns at a time, with the attention
    kernel's warps. Same arithmetic and order as the separate merge (notes/pallas.md,
    "Session 6: single-launch decode"); on the GPU last-bit differences from it (2-29
    elements per case, within the fidelity contract). Measured on an H200 (2026-12-03) at
    the table's decode tilings: 1.19-7.2x the busy time of "separate" (one program's serial
    merge costs more than the second launch), hence not the default.
    """

    merge: str | None = None


@dataclasses.dataclass(frozen=True)
class TritonLaunch(_Launch):
    """Launch knobs of the jax-triton implementation (defaults: ``triton_launch``);
    the fields mean what ``PallasLaunch``'s do."""


def _with_override(default, override):
    """``default`` with every field ``override`` sets (not None) replaced. An override that sets
    the merge's D chunk to another than the default's but not its warps gets
    ``MERGE_WHOLE_D_WARPS``: the default's warps belong to its own chunk (1 warp over D whole
    ran at twice the time of 2 warps, session 30)."""
    if override is None:
        return default
    launch = dataclasses.replace(default, **{f.name: getattr(override, f.name)
                                             for f in dataclasses.fields(override)
                                             if getattr(override, f.name) is not None})
    if override.merge_block_d not in (None, default.merge_block_d) and override.merge_warps is None:
        launch = dataclasses.replace(launch, merge_warps=MERGE_WHOLE_D_WARPS)
    return launch


# Triton's software pipelining of the Pallas tile loop when no measured table sets it:
# 2, as the originals (with 0.30.0's tilings 3 stages were slower on Hopper, docs/spec.md §9;
# the measured H200 table sets 3 where it measured faster).
PALLAS_NUM_STAGES = 2


def measured_entry(problem: "SparseAttentionProblem") -> Tiling | None:
    """The measured table's entry ``problem``'s tiling came from (its stages, implementation
    and Pallas warps as measured); None when the tiling did not come from one."""
    if problem.num_stages is None:
        return None
    return table_tiling(problem.num_rows * problem.num_kv_heads, problem.prefill_tiling,
                        is_fp8=problem.is_fp8, table=problem.table)


def pallas_launch(problem: "SparseAttentionProblem") -> PallasLaunch:
    """The Pallas kernels' launch for ``problem``, with its ``launch=`` override applied.

    The tiling always comes from ``problem.config``; the split kernel's warps:
    * a measured table (``MEASURED_TABLES``) sets warps and stages as it measured them
      (the entry's ``pallas_warps`` where it was measured with jax-triton and Pallas's own
      winner there had other warps);
    * with one of vLLM's tables on a Hopper GPU, the table's warps except that one warp
      becomes two, and 2 stages: at one warp the kernel's [16, 256] fp32 accumulator plus
      the pipelined tile spill ~5x more than the original's (ptxas: 780 vs 160 bytes);
      two warps have no spills (notes/pallas.md);
    * an explicit ``config=`` (and any other device) launches the table's warps with
      ``PALLAS_NUM_STAGES``.
    Prefetch stays off: on the H200 it was within the run-to-run noise of the wall clock at
    decode (session 3, notes/pallas.md; never timed in busy time), and the jax-triton
    kernel's is off everywhere since session 11 (``triton_prefetch``).
    The merge's D chunk and warps: ``merge_layout`` over ``PALLAS_MERGE_LAYOUTS`` on a Hopper
    (where they were timed), ``PALLAS_MERGE_LAYOUTS_UNTIMED`` elsewhere; with ``merge="fused"``
    ``pallas_fused_merge_block_d`` unless the override sets it.
    """
    cfg = problem.config
    warps, stages = cfg.num_warps, PALLAS_NUM_STAGES
    if problem.num_stages is not None:  # a measured table: its warps and stages as measured
        stages = problem.num_stages
        warps = measured_entry(problem).pallas_warps or warps
    elif not problem.config_explicit and running_on_hopper():
        warps = 2 if cfg.num_warps == 1 else cfg.num_warps
    merge_d, merge_warps = merge_layout(
        problem.num_rows * problem.num_query_heads, problem.head_dim, cfg.num_splits,
        PALLAS_MERGE_LAYOUTS if running_on_hopper() else PALLAS_MERGE_LAYOUTS_UNTIMED)
    default = PallasLaunch(
        num_warps=warps, num_stages=stages, prefetch=False,
        merge_block_d=merge_d, merge_warps=merge_warps, merge="separate")
    launch = _with_override(default, problem.launch)
    if launch.merge == "fused" and (problem.launch is None or problem.launch.merge_block_d is None):
        launch = dataclasses.replace(launch, merge_block_d=pallas_fused_merge_block_d(
            cfg.num_splits, problem.head_dim, launch.num_warps))
    return launch


def triton_tiling(problem: "SparseAttentionProblem") -> SparseAttentionConfig:
    """The tiling the jax-triton implementation launches: ``problem.config``, or on a
    Hopper GPU where it came from the library's measured table its ``tune_config_for_hopper``
    version. vLLM's tables and an explicit ``config=`` launch as given: the tweak (the last
    of 65 tiles in a split of its own) moved TP2 16 rows 3.4e-4 from vLLM 0.30.0 at 0.30.0's
    table, over the fidelity bar (H200, session 12, bench/results/nvidia-h200_2026-12-04/session12/)."""
    if problem.config_explicit or not running_on_hopper() or measured_entry(problem) is None:
        return problem.config
    return tune_config_for_hopper(problem.config, problem.num_rows, problem.num_kv_heads)


def pallas_tiling(problem: "SparseAttentionProblem") -> SparseAttentionConfig:
    """The tiling the Pallas implementation launches: ``problem.config``, except where it came
    from the library's measured table and the entry names Pallas's own split count
    (``Tiling.pallas_splits``: bands whose count fills a wave of the one-warp jax-triton kernel,
    where Pallas at its own warps measured faster at the bucket's count; session 35). Capped at
    the tile count, as ``select_config`` caps."""
    entry = None if problem.config_explicit else measured_entry(problem)
    if entry is None or entry.pallas_splits is None:
        return problem.config
    return problem.config._replace(num_splits=min(entry.pallas_splits, problem.config.num_tiles))


def sparse_attention_order(problem: "SparseAttentionProblem", launch_implementation: str | None = None
                           ) -> tuple[str, ...]:
    """The implementations ``sparse_attention(implementation=None)`` tries, in order.

    The default order (``_implementations.DEFAULT_ORDER``: Pallas first on the GPU), except
    where the measured table's entry for this call names an implementation
    (``Tiling.implementation``; today ``H200_FP8``'s "triton" at every entry from 5 programs,
    the prefill flag included): that one comes first.

    Why jax-triton at one warp (notes/pallas.md "Session 8"): there the Pallas fp8 kernel,
    compiled by XLA's bundled Triton, gives each of a tile's 48 async copies its own
    shared-memory address register (XLA's lowering ends each address in an XOR with a
    constant), spills them and reloads each before its copy: 7x 0.34.0's spill traffic, a
    third of all stall samples on copies waiting for the reloads. Triton 3.6, which compiles
    the jax-triton kernels (and vLLM's), folds the addresses into base + immediate. At 5-24
    programs jax-triton runs 0.34.0's own tiling, i.e. 0.34.0's kernel launch (its error is
    0.34.0's). Measured on the H200 against vLLM 0.34.0 (busy time per call, TP1 / TP4, each
    ratio within one process; sessions 8-10):

    ==========================  =====================  =====================
    programs                    Pallas (its winner)    jax-triton (entry)
    ==========================  =====================  =====================
    8, 16, 24                   1.06-1.22x             0.99-1.06x
    64, 128 (session 11)        1.05-1.10x             1.01-1.03x
    256, 1024, 2048             1.22-1.41x             0.97-1.00x
    512                         --                     1.00-1.04x (1.00-1.01x s. 11)
    4096                        1.06-1.11x             0.73-0.85x
    8192                        1.07-1.12x             0.73-0.84x
    4096, prefill flag (TP1)    1.37x                  1.05x
    ==========================  =====================  =====================

    With 0.34.0's table on a Hopper (``table="vllm-0.34"``, or a Hopper with another SM count
    than the measured table's, ``MEASURED_SM_COUNTS``) an fp8 cache also runs jax-triton first,
    at every size: there it is 0.34.0's own launch (H100, session 29: 0.95-1.02x of 0.34.0 at
    1-2048 programs, where Pallas ran up to 1.35x). Elsewhere -- 1-4 programs on the measured
    table, bf16 everywhere, fp8 on 0.30.0's table, or an explicit ``config=`` (not measured this
    way) -- Pallas stays first. A ``launch=`` record's implementation goes first of all (it names the
    implementation it is for). An fp8 cache on a GPU below sm_89 (A100, A10: Triton has no
    e4m3 type there, and both kernels are Triton's) leaves only XLA, so
    ``implementation=None`` still runs; naming a kernel there raises.
    """
    from qsa_jax._implementations import DEFAULT_ORDER, backend

    def first(name, order):
        return (name,) + tuple(n for n in order if n != name)

    order = DEFAULT_ORDER[backend()]
    if problem.is_fp8 and not fp8_kernels_run_here():
        return tuple(n for n in order if n not in TRITON_LOWERED)
    entry = measured_entry(problem)
    if entry is not None and entry.implementation in order:
        order = first(entry.implementation, order)
    elif entry is None and problem.is_fp8 and not problem.config_explicit and running_on_hopper() \
            and problem.table != "vllm-0.30" and "triton" in order:
        # 0.34.0's table on a Hopper (a card the measured table was not measured on, an H20 or
        # H100 PCIe, or table="vllm-0.34"): its fp8 entries at 25-2048 programs are one-warp
        # launches, where the Pallas kernel spills (above). There jax-triton, 0.34.0's own
        # launch, ran 0.95-1.02x of 0.34.0 and Pallas up to 1.35x (H100, session 29 call e,
        # 1-2048 programs; H200, sessions 10-11: 0.99-1.06x at 5-24 programs, 0.99-1.03x at
        # 64-512). Above 2048 programs the decode entry is 2 warps (64-wide, one split):
        # jax-triton ran it at 1.00-1.01x of 0.34.0 (4096-8192 programs, H100, session 27 call
        # g); Pallas there was not timed. 0.30.0's table (GB300's; 0.30.0 has no fp8) is not.
        order = first("triton", order)
    if launch_implementation in order:
        order = first(launch_implementation, order)
    return order


# jax-triton launch constants (notes/triton.md): 1 and 3 stages measured slower than 2 at every
# shape. The merge's layout: ``merge_layout`` over ``TRITON_MERGE_LAYOUTS`` on the measured table;
# elsewhere the originals' (D whole on ``MERGE_WHOLE_D_WARPS`` = 2 warps: 4.0 against 7.1 µs on 4
# warps at 256 programs, 31.5 against 46.1 µs at 2048; H200, fp8, TP1, session 8).
TRITON_NUM_STAGES = 2


def triton_prefetch(block_n: int, num_splits: int, num_warps: int) -> bool:
    """Whether the jax-triton split kernel loads the next tile's tokens and pages while it
    computes this one: never, since session 11. Early on (bf16, H200, an older kernel) it
    measured +8-10% at 32-64 rows with 1 warp and BN 32, so it was on except for BN >= 64
    with several splits. Session 11 (H200, busy time against the originals in one process,
    bench/results/nvidia-h200_2026-12-04/session11/) timed it off against on at the
    originals' tilings: bf16 TP4 at 0.34.0's (32, 4 splits, 1 warp) 1.60 -> 1.00x at 512
    programs and 1.74 -> 1.09x at 2048, at 0.30.0's (32, 8, 1) 1.39 -> 0.95x at 64; TP1 at
    0.30.0's (64, 1, 2) 1.14 -> 1.03x at 1024 programs; fp8 at 0.34.0's tiling 64-512 programs
    1.05-1.09 -> 0.99-1.03x at TP1 (call a); at the fp8 table's one-warp entries (256-4096
    programs) within 0.6% either way. On still won some cells: by up to 7% at one row (TP4 fp8,
    0.30.0's tiling), 3-5% at 128 programs on the library's table, 1-2% at 1024-4096 programs."""
    return False


def triton_tile_induction(num_tiles: int, num_splits: int) -> bool:
    """Whether the jax-triton split kernel's tile loop runs with the tile as its induction
    variable (``for tile in range(split, n_tiles, NUM_SPLITS)``) rather than a trip counter
    with the tile carried (``tile += NUM_SPLITS``): where each split walks at most two tiles.

    Same tiles in the same order either way (same bits). Measured on an H200 (busy time of the
    split kernel, session 13, ``bench/results/nvidia-h200_2026-12-04/session13/`` calls e, f, j):
    at 1-8 rows on 0.30.0's tiling (64 splits of 65 tiles, 4 warps) the induction form took
    7.0 / 19.1 us (TP1) and 7.0 / 9.1 us (TP4) against the counter's 8.4 / 20.9 and 8.0 / 10.3
    (vLLM 0.30.0's kernel: 5.9 / 17.4, 5.4 / 7.7); from 64 rows, where splits walk 9-33 tiles,
    bf16 was within 4% and the fp8 table's one-warp launches slower with it (TP1 64 / 512 /
    2048 rows: 74.8 / 344.6 / 1341 against 65.8 / 315.6 / 1229 us). The compiled loops
    (``tools/sm90_split_kernel_ab.py``): 389 against 842 SASS instructions at one row, vLLM's 383.
    Never with the index prefetch (its loop carries the next tile's indices)."""
    return -(-num_tiles // num_splits) <= 2


def triton_launch(problem: "SparseAttentionProblem") -> TritonLaunch:
    """The jax-triton kernels' launch for ``problem``, with its ``launch=`` override applied.

    Its index prefetch: ``triton_prefetch``.
    """
    cfg = triton_tiling(problem)
    pairs = problem.num_rows * problem.num_query_heads
    # The originals' merge layout (one program per (row, head) over the whole D, 2 warps)
    # wherever the tiling is not the library's measured table's -- vLLM's tables, an explicit
    # config --, so that the launch is theirs. Measured effect alone: small (TP2 16 rows on
    # 0.30.0's table, 64 splits: 3.43e-4 -> 3.42e-4 from vLLM 0.30.0; the split tweak of
    # ``triton_tiling`` was the cause; with both, bit-identical; H200, session 12,
    # bench/results/nvidia-h200_2026-12-04/session12/). Its cost at decode against the 64-wide
    # layouts ``merge_layout`` chose for speed there (32- / 64-wide D chunks on 1 warp to 192
    # (row, head) pairs, D whole above), not timed.
    if measured_entry(problem) is not None:
        merge_d, merge_warps = merge_layout(pairs, problem.head_dim, cfg.num_splits, TRITON_MERGE_LAYOUTS)
    else:
        merge_d, merge_warps = problem.head_dim, MERGE_WHOLE_D_WARPS
    default = TritonLaunch(
        num_warps=cfg.num_warps, num_stages=TRITON_NUM_STAGES,
        prefetch=triton_prefetch(cfg.block_n, cfg.num_splits, cfg.num_warps),
        merge_block_d=merge_d, merge_warps=merge_warps)
    return _with_override(default, problem.launch)


def jax_triton_images_from_triton_ptxas() -> bool:
    """Whether JAX's launches of the jax-triton kernels run the cubin Triton's own ptxas makes
    (``ops/_triton_images.py``), rather than what jaxlib assembles from the same PTX with XLA's
    ptxas. The machine code then equals what the shim's torch route and vLLM's originals run.

    Measured on an H100 (2026-12-06, session 28, one process, the same fresh inputs): CUDA 13.0's
    ptxas (XLA's) schedules the split kernel 2.5-3.9% slower than Triton 3.6's bundled 12.8 at TP1
    fp8 16-64 rows, and level at 8 and 1024 rows and TP4 32. JAX's route ran as slow as the torch
    route put on 13.0. With JAX's assembly sent to 12.8 (a ptxas wrapper, same call), JAX/torch
    went from 1.027-1.045 to 0.998-1.003 at 16-64 rows.
    bench/results/nvidia-h100_2026-12-06/session28/ has the numbers. A function so that tests and
    the benchmark can switch it; read when JAX lowers a jitted function.
    """
    return True


def pallas_fp8_keys_via_f16() -> bool:
    """Whether the Pallas sparse-attention kernel turns an fp8 K tile into bf16 by way
    of fp16 and fp32 (e4m3 -> f16 -> f32 -> bf16) instead of Triton's direct e4m3 -> bf16.

    Bit-identical (every step is exact for e4m3 values). On sm_90 Triton lowers the
    direct conversion to the e4m3x2 -> f16x2 instruction followed by two scalar
    f16 -> bf16 conversions (F2F, the slow conversion pipe) and byte permutes per pair;
    through fp32 the widening is HADD2.F32 (FMA pipe) and the narrowing one packed
    F2FP, as vLLM 0.34.0's kernel compiles. CPU lowering (tools/sm90_ptx_fp8.py): the
    256 F2F.BF16.F16 and 128 PRMT per thread per 64-column tile disappear; registers
    and spills stay as they are (notes/pallas.md, "fp8 loads on sm_90"). Timed on an
    H200 (2026-12-03, TP1, fp8 table tilings; bench/results/nvidia-h200_2026-12-03/session6/):
    device time (jitted chain) -10% at 256 rows, -8% at 1024, -5% at 2048 decode, +4% at
    2048 prefill (one run each), so it is on. A function so that tests and the benchmark can switch it.
    """
    return True


def pallas_fp8_value_pairs() -> bool:
    """Whether the Pallas sparse-attention kernel reads an fp8 V tile as byte pairs: the
    [BN, D] tile is split into its even and odd columns ([BN, D/2] each, adjacent bytes
    of a row, so the split is free in registers), each converted to fp16 and multiplied
    by the probabilities in its own dot into its own [M, D/2] accumulator; the two are
    interleaved back into [M, D] after the tile loop.

    Why: P.V reduces over the tile's rows, but a row's D bytes are what is contiguous, and
    sm_90 has no 8-bit transposing shared-memory load; so Triton (and vLLM 0.34.0's
    kernel) reads the fp8 V operand out of shared memory one byte per element (256
    ``ld.shared.b8`` per thread per bn32 tile at 1 warp, plus the byte packing for the
    e4m3 pair conversion). Split, a pair of adjacent bytes is one 16-bit shared load and
    one pair conversion (128 ``ld.shared.b16``, no packing); its halves are then paired
    by row with a byte permute for the dot. As a side effect Triton also picks 16-byte
    instead of 8-byte async copies for the K gather.
    Every output column is the same dot over the same rows in the same order, so the
    result is bit-identical (CPU interpret test; GPU test in tests/test_fp8.py).
    Effect on the sm_90 lowering and the H200: notes/pallas.md, session 7. Measured there
    (H200, 2026-12-03, bench/results/nvidia-h200_2026-12-03/session7/call_c/): bit-identical,
    but the call 2.0-2.6x slower at the fp8 table's one-warp launches then (TP1/TP4, 256-2048
    programs), though its CPU-lowered loop is shorter; hence off. (The Pallas fp8
    kernel runs only at 1-4 programs on Hopper's measured table since.) A function so that
    tests and the benchmark can switch it.
    """
    return False


def pallas_fp8_keys_f16_dot() -> bool:
    """Whether the Pallas sparse-attention kernel computes q.K^T for an fp8 cache as an
    fp16 dot: K converted e4m3 -> fp16 only (one instruction per pair), and q rescaled
    once per program by a power of two per query row into fp16's range, the scores scaled
    back (``pallas._f16_query`` says why that is exact).

    Why: with a bf16 dot every K element of every tile takes e4m3 -> f16 -> f32 -> bf16
    (``pallas_fp8_keys_via_f16``: 2 HADD2.F32 + 1 F2FP per pair after the e4m3 pair
    conversion), 384 of the ~2,000 instructions of the bn32 / 1-warp tile loop on
    sm_90 (CPU lowering, notes/pallas.md session 7). The products are the same exact
    values, so the output is bit-identical wherever the fp16 and the bf16 dot sum them
    alike: in interpret mode at the CPU test's D 16, not at D 256, where XLA's CPU bf16
    dot sums in another order than its fp16 one (9 of 12,288 outputs one bf16 ulp
    apart, TP1 2 rows). On the GPU the tensor cores decide (tests/test_fp8.py checks it
    on the H200). Measured with ``pallas_fp8_value_pairs`` (H200, session 7, notes/pallas.md):
    bit-identical, and the two together 2.0-2.4x slower than neither; hence off.
    """
    return False


# Query heads per KV head up to which the jax-triton kernel's fp8 q.K^T runs as an fp16 dot at
# any split count (8-row tiles), and up to which it does at one split (16-row tiles, measured at
# G = 12; wider tiles never were): triton_fp8_keys_f16_dot.
TRITON_FP8_F16_DOT_MAX_GROUP = 8
TRITON_FP8_F16_DOT_ONE_SPLIT_MAX_GROUP = 16


def triton_fp8_keys_f16_dot(group_size: int, num_splits: int) -> bool:
    """Whether the jax-triton split kernel computes q.K^T for an fp8 cache as an fp16 dot
    (its QK_FP16): K converted e4m3 -> fp16 only, q rescaled once per program by a power of
    two per query row, the scores scaled back (``triton_kernels._f16_query``). Bit-identical
    to the bf16 dot (H200 and H100, every fp8 launch tried, query heads 2^63 apart); a speed
    choice.

    Why: like vLLM 0.34.0's kernel, the bf16 dot turns every K element of every tile into
    bf16 (e4m3 -> fp16 -> fp32 -> bf16), ~30% of the one-warp tile loop (notes/triton.md,
    sessions 13-14). Busy time of the split kernel with the fp16 dot against without:
    - TP4 (G = 6 query heads per KV head: 8-row MMA tiles, each K conversion serving 6 rows):
      -6 to -11% at 64-4096 rows, through the shim's torch launch and through JAX alike (H200,
      session 17);
    - TP1 (G = 12: 16-row tiles) at 2 or 4 splits: +2.1 to +5.6% through the torch launch,
      -0.7 to -1.9% through JAX (H200, session 17, 2 splits); +2.4% through torch at 0.34.0's
      4-split launch (H100, session 23);
    - TP1 at one split (the table's one-split entries, ``H200_FP8``; 0.34.0's large-batch launch and
      0.30.0's from 513 programs, 64-wide, 2 warps): -0.4 to -1.3% through JAX at the table's
      entry (H100, session 21); through torch (H100, session 23) -0.45 to -1.2% there (within
      the pass-to-pass spread of 0.34.0's own kernel, +-0.5%) and -3.3 to -3.8% at the 64-wide
      launches of both vLLM tables.
    Hence on where ``group_size`` <= ``TRITON_FP8_F16_DOT_MAX_GROUP`` (8-row tiles), and up to
    ``TRITON_FP8_F16_DOT_ONE_SPLIT_MAX_GROUP`` (16-row tiles) where the launch has one split.
    A function so that tests and the benchmark can switch it; it is read into the launch plan,
    so a switch in a running process needs ``triton._launch_plan.cache_clear()``, JAX's caches
    of the traced call (``api._run.clear_cache()``) and, for the shim,
    ``_direct._SIGNATURES.clear()``.
    """
    return group_size <= TRITON_FP8_F16_DOT_MAX_GROUP or (
        group_size <= TRITON_FP8_F16_DOT_ONE_SPLIT_MAX_GROUP and num_splits == 1)


def triton_fp8_values_f16_staged() -> bool:
    """Whether the jax-triton split kernel converts an fp8 V tile to fp16 in the layout it was
    loaded in (its V_F16_STAGED; ``triton_kernels._f16_values_before_the_dot`` says how),
    instead of after reading it out of shared memory in the P.V operand's layout one byte
    per element. The same conversion instruction on the same bytes, but not the same bits at
    32-wide and wider tiles: Triton then lays the fp16 operand out with another k-width (2
    instead of 4 in its TTGIR, a review helper's sm_90 compile), so the tokens of a tile enter
    P.V's k16 MMAs in another grouping and the fp32 sums round differently (H100, 4096
    programs: "bit-identical: False" at the 32-wide table launch, error from exact attention
    2.3411526e-3 against 2.3411566e-3; identical at 16-wide tiles, one MMA per row of tokens).
    So it is outside the fidelity contract there, inside the accuracy contract.

    Why: the byte-wise reads are the largest part of the one-warp fp8 tile loop after the
    conversions (sm_90 lowering, TP1 32-wide tiles, 2 splits, 1 warp: 256 ``LDS.U8`` and
    ~250 packing instructions of 2184). Staged, the loop is 1899 (1560 with the fp16 q.K^T),
    with 16 KB more shared memory per program (24.8 -> 41.0 KB: at most 5 one-warp programs
    per SM instead of 8) and more spills (20 -> 368 B). Measured on an H100 (2026-12-05,
    notes/triton.md "Session 19"; 4096 programs): 1.28-1.40x slower at the table's 32-wide
    tiles (TP1 1601 -> 2242 us, TP4 1527 -> 1958), 18-24% faster at 16-wide tiles but still
    slower than 32-wide without it: occupancy decides. Hence off. A function so that tests and
    the benchmark can switch it (read into the launch plan: see ``triton_fp8_keys_f16_dot`` for
    the caches to clear).
    """
    return False


# The reference maximum's slack under lazy rescaling, in base-2 units (probabilities up to 2^8).
LAZY_RESCALE_LOG2 = 8.0


def triton_fp8_lazy_rescale() -> bool:
    """Whether the jax-triton split kernels (Triton's and the Gluon one) rescale their
    accumulator lazily for an fp8 cache (``triton_kernels._online_softmax_step``'s and
    ``gluon_kernels._lazy_softmax_step``'s LAZY_RESCALE = ``LAZY_RESCALE_LOG2``): the
    running maximum moves only when a tile raises some row's maximum by more than 2^8, so most
    tiles skip the BLOCK_M x D multiplies of the accumulator (128 per thread per tile at one
    warp, D = 256, of a ~1800-instruction sm_90 tile loop). The same result in real
    arithmetic, other fp32 roundings: inside the accuracy contract, not bit-identical.

    Why (issue 13, session 33): on the H200 the one-warp fp8 kernel reached 82-89% of copy
    bandwidth where the H100 reached 90-97%; if the tile loop's issue time is part of what
    binds it there, fewer instructions per tile should show. Measured on an H100 (2026-12-07,
    bench/results/nvidia-h100_2026-12-07/session33/call_a/; the fp8 table's one-split launch,
    2048 / 4096 programs): slower, TP1 +4.8 / +5.7%, TP4 +1.9 / +1.8% (likely the branch and
    40-50 B of spills costing more than the skipped multiplies; not isolated), and with the
    Gluon kernel +6.3 to +8.8%; its distance from exact attention level with the eager
    kernel's (GPU test, 4 launches).
    Hence off; untimed on an H200. A function so that tests
    and the benchmark can switch it (read into the launch plan: see
    ``triton_fp8_keys_f16_dot`` for the caches to clear)."""
    return False


def triton_fp8_register_cap() -> int | None:
    """The most registers per thread the jax-triton split kernel (Triton's language, not the
    Gluon one) may take for an fp8 cache at one warp, or None (0, False): ptxas decides. Both
    launchers honour it: Triton's as its ``maxnreg`` option, JAX's through
    ``_triton_images`` (a ``.maxnreg`` directive in the kernel's PTX).

    Why (issue 13, session 35): at the fp8 table's one-warp launches ptxas gives the kernel
    255 registers, so an SM holds 8 programs (Nsight Compute, H100: the block limit by
    registers 8, by shared memory 9; 7.6 warps per SM achieved; long-scoreboard the top stall),
    and the kernel reads 0.91-0.95x as fast as a kernel that only gathers the same bytes. A cap
    trades spills for programs in flight: sm_90 compiles (``tools/sm90_split_kernel_ab.py``,
    TP1 2048 rows, 32-wide tiles) at 224 registers spill 184 B with 44 spill instructions
    in a 1845-instruction tile loop (1820 uncapped), 9 programs per SM; at 200, 504 B and 97,
    10 programs at TP4 (20.7 KB of shared memory) but still 9 at TP1 (24.8 KB).
    Measured on an H100 (2026-12-07, bench/results/nvidia-h100_2026-12-07/session35/call_a/; the
    library's fp8 launch, ``tools/fp8_kernel_ab.py --knob triton_fp8_register_cap=224``): slower
    everywhere, 224 by 20-26% at 2048 / 4096 programs and 28-34% at 256 (where 8 programs per SM
    already hold the whole grid), 200 by 34-46%; bit-identical. The spills cost far more than
    their count, and the extra programs do not pay it back. Hence None. A function so that
    tests and the benchmark can switch it (read into the launch plan, and so into JAX's traced
    calls and the shim's signatures: see ``triton_fp8_keys_f16_dot`` for the caches to clear)."""
    return None


def triton_fp8_gluon_split() -> bool:
    """Whether an fp8 problem at a one-warp jax-triton launch runs its split kernel in Gluon
    (``gluon_kernels.sparse_attention_split_kernel_fp8_gluon``) instead of Triton's language,
    where that kernel applies (``triton.gluon_split_applies``: one warp, at most 16 query heads
    per KV head, D a power of two in [32, 256], tiles of 16 tokens or more).

    What it changes: V goes from the cache straight into the P.V operand's registers (no shared
    memory, no byte-wise reads) and the next tile's K is in flight while a tile computes; the
    sm_90 tile loop is 1687 instructions against Triton's 2184 at the TP1 2-split launch (1336
    against 1814 with the fp16 q.K^T), same shared memory, no spills. Bit-identical to the
    Triton kernel (H100, 2026-12-05: 6 GPU test launches with edge rows and poison, and the
    A/B's 8 cases; session 21: 6 more and the GPU tests' 11). Not faster on the H100 (split
    kernel alone at the then table's 2-split launch, 1024-8192 programs: TP1 +0.0 to +1.8%, TP4
    +5.1 to +8.2%; notes/triton.md "Session 20" and "Session 21"), where the Triton kernel's fp8
    path already runs at 87-97% of copy bandwidth; untimed on an H200. Hence off. Only on
    Triton 3.6 with jax-triton 0.3.1 (the tested pair; ``_gluon_support.unavailable_reason``):
    with triton >= 3.7 and jax-triton 0.4.1 the knob changes nothing.
    A function so that tests and the benchmark can switch it (read into the launch plan: see
    ``triton_fp8_keys_f16_dot`` for the caches to clear)."""
    return False


def triton_fp8_gluon_values_shared() -> bool:
    """Whether the Gluon fp8 split kernel (``triton_fp8_gluon_split``) takes V through shared
    memory (``cp.async``, one buffer refilled with the next tile's V as soon as this tile has
    read it, 32-bit reads from a tile swizzled for them: no bank conflicts) instead of straight
    into registers, where each tile's P.V waits for V's global latency. Same values, same MMA
    positions; shared memory unchanged (one K and one V buffer instead of two K buffers); sm_90
    loop 1748 against 1687 at the TP1 2-split launch, 44 B of spills. Built after the H100 run
    of session 20, where the register path was no faster than the Triton kernel and V's
    exposed latency was one candidate for why. H100, session 21: bit-identical (4 GPU test
    launches, 22 A/B cases), memcheck 0 errors, 2-6% faster than the register path; against
    the Triton kernel TP1 -0.9 to -1.9% and TP4 +2.0 to +3.5% at 2 splits, -0.5 to +1.6% at
    the table's one-split launch (then from 529 programs). Off."""
    return False


# The split merge's layout by the number of (row, head) pairs it merges: rows of
# (up to this many pairs, D columns per program, warps), the first that fits; above the last
# (or where the chunk does not divide D) one program per pair over D whole on
# ``MERGE_WHOLE_D_WARPS``. Small batches want D in chunks, for more programs than SMs; many
# pairs want D whole, the chunks only adding programs. History (notes/triton.md,
# notes/pallas.md): the jax-triton merge had kept 64-wide chunks everywhere, and D whole cut it
# from 23.3 to 9.6 µs at 256 programs (H200, fp8, TP1, 8 splits, session 8); 2 warps beat 4
# at 48-192 pairs (session 25); D whole on 2 warps beat 64-wide chunks on 2 warps by 0.12-0.28
# µs for jax-triton at 192-240 pairs and lost for Pallas at 96-192 (session 29).
#
# Session 30 (H100, bench/results/nvidia-h100_2026-12-06/session30/call_e/, bench.decode_sweep
# --variants merge: the call's busy time, each layout in one process on the same inputs) timed
# 1 warp for the first time. jax-triton, fp8 and bf16 alike (TP1 1-64 rows, TP4 4-64; the
# default's µs -> the row's layout): 24 pairs 7.99 -> 7.46 (TP1 fp8), 9.09 -> 8.55 (TP1 bf16),
# 8.81 -> 8.44 (TP4 fp8), 10.38 -> 10.02 (TP4 bf16), 32-wide ahead of 64-wide by 0.03-0.17 but for
# TP4 bf16 (0.02 behind); 48-192 pairs 64-wide on 1 warp fastest in all eleven cases, by
# 0.07-0.80 µs (TP1 fp8 8 rows 17.04 -> 16.56, where 0.34.0 ran 16.72-16.82 in calls b and c);
# 384 pairs level (TP1 fp8 28.85 against 28.84) or slower (TP4 fp8 39.56
# against 39.27), and from 768 slower by 0.85-2.3 µs, so D whole there.
# Pallas, bf16 (TP1 1-16 rows, TP4 4 and 8; cut by its timeout before TP4 16): 32-wide on 1 warp
# fastest at 24-96 pairs in all four cases, by 0.11-0.25 µs; at 192 / 384 pairs (TP1 only) 128-wide
# on 1 warp was 0.45 / 0.39 µs ahead of the default, not adopted until timed at TP4 as well.
# 1 warp was never slower than 2 for the Pallas merge at 24-384 pairs (seven cases), so 97-256
# pairs take 64-wide chunks on 1 warp too (TP1 192 pairs: 21.49 against 21.75 µs; TP4 untimed).
# Every layout's output was held to the fidelity contract against the default's (relative error
# about 1e-4 at most, the bar 3e-4). Each program of the merge holds its [next_pow2(splits), D
# chunk] fp32 slab in registers: the 1-warp layouts were timed with at most 128 values per
# thread (65 splits x 32 columns, 33 x 64), so a split count that would need more runs the
# chunk on 2 warps (``MERGE_ONE_WARP_MAX_VALUES``). Off Hopper the Pallas merge keeps the layout
# it had before (``PALLAS_MERGE_LAYOUTS_UNTIMED``); the jax-triton merge takes its layouts on the
# measured table only, which applies on the card it was measured on.
#
# Session 32 (H200, bench/results/nvidia-h200_2026-12-06/session32/call_d/, the same sweep) timed
# the gaps: jax-triton fp8 at 240 / 288 pairs, 64-wide on 1 warp against the then default (D
# whole on 2): TP1 20.78 / 22.34 against 21.16 / 22.86 µs, TP4 32.76 / 34.16 against 32.75 /
# 34.09 (level), so 64-wide on 1 warp to 288 pairs (384 was level or slower in session 30).
# Pallas bf16 at 288-384 pairs, 128-wide on 1 warp against D whole on 2: TP1 16 rows 28.97
# against 29.35, TP4 48 / 64 rows 35.76 / 41.95 against 36.06 / 42.32 (the merge kernel 2.8
# against 3.2 µs at TP1), so a 128-wide row to 384 pairs; at 96-256 pairs the rows above held
# within 0.2 µs of the best but at TP4 16 rows (128-wide 0.4 µs ahead of 32-wide; TP1's 96
# pairs had them level) and were kept.
TRITON_MERGE_LAYOUTS = ((24, 32, 1), (288, 64, 1))
PALLAS_MERGE_LAYOUTS = ((96, 32, 1), (256, 64, 1), (384, 128, 1))
PALLAS_MERGE_LAYOUTS_UNTIMED = ((256, 64, 2),)
MERGE_WHOLE_D_WARPS = 2
MERGE_ONE_WARP_MAX_VALUES = 128
# Chunks wider than this were timed on 1 warp only, at D = 256 with at most 32 splits (session
# 32): where 1 warp does not apply to them -- a slab over the register budget, or the chunk
# being D itself (D = 128; D whole on 1 warp ran at twice the time of 2, session 30) -- the
# merge takes D whole on 2 warps, the layout they replaced, not the same chunk on 2 warps
# (128-wide on 2 warps ran 1.07x D whole at TP1 192 pairs in session 32's call d).
MERGE_WIDE_CHUNK = 64


def merge_layout(pairs: int, head_dim: int, num_splits: int, layouts) -> tuple[int, int]:
    """(D columns per program, warps) of the split merge for ``pairs`` = rows x query heads
    and ``num_splits`` partials per pair, from ``layouts`` (rows of (up to this many pairs,
    D chunk, warps): ``TRITON_MERGE_LAYOUTS``, ``PALLAS_MERGE_LAYOUTS``, ...).

    Every layout computes the same thing, but on the GPU the sum over splits can associate
    differently with another block shape or warp count (last-bit differences before the
    bf16 rounding; none in interpret mode): session 30's sweep held each layout to the
    fidelity contract against the previous default, and GPU parity covers the defaults."""
    for max_pairs, block_d, warps in layouts:
        if pairs <= max_pairs:
            if head_dim % block_d:
                break
            slab = (1 << max(num_splits - 1, 0).bit_length()) * block_d
            if warps == 1 and slab > 32 * MERGE_ONE_WARP_MAX_VALUES:
                if block_d > MERGE_WIDE_CHUNK:
                    break
                warps = MERGE_WHOLE_D_WARPS
            if block_d > MERGE_WIDE_CHUNK and block_d == head_dim:
                break
            return block_d, warps
    return head_dim, MERGE_WHOLE_D_WARPS


# Values per thread of one step of the fused merge's [next_pow2(S), block_d] fp32 slab.
FUSED_MERGE_VALUES_PER_THREAD = 64


def pallas_fused_merge_block_d(num_splits: int, head_dim: int, warps: int) -> int:
    """D columns per step of the fused merge (``PallasLaunch(merge="fused")``).

    There one program merges G heads x D columns alone, in steps of [S_pow2, block_d]
    partials, and each step is a dependent L2 round trip plus a cross-warp sum (a
    barrier); fewer, larger steps shorten that chain. The largest power-of-two chunk of D
    whose slab is at most ``FUSED_MERGE_VALUES_PER_THREAD`` fp32 values per thread (at the
    attention kernel's warps), so that the next step's slab still fits beside it:
    D whole (G steps) at 32/33 splits, 64 columns (4 G steps) at 65 splits with 4 warps.
    Same arithmetic for any block (bit-identical in interpret mode).
    """
    budget = FUSED_MERGE_VALUES_PER_THREAD * 32 * warps
    block = next_pow2(head_dim)
    while block > 1 and (head_dim % block or next_pow2(num_splits) * block > budget):
        block //= 2
    return block
