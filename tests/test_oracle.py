"""Hand-made checks of the float64 NumPy oracle (qsa_testing.oracle).

Expected values come from small closed-form formulas written here (means of values, softmax
weights that are exact powers of two, ...), never from a second call of the oracle, except
for invariance properties (NaN in unreferenced pages, split counts) where the property
itself is the comparison.
"""

import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from qsa_testing import oracle  # noqa: E402
from qsa_testing.oracle import (  # noqa: E402
    compress_groups_oracle,
    sparse_attention_oracle,
    store_cache_rows_oracle,
)

BF16 = ml_dtypes.bfloat16


def bf16(x):
    return np.asarray(x, np.float64).astype(BF16).astype(np.float64)


def sig(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def gated(out, gate):
    """The epilogue written out by hand: bf16(bf16(out) * sigmoid(gate))."""
    return bf16(bf16(out) * sig(gate))


# --------------------------------------------------------------------------------------
# sparse_attention
# --------------------------------------------------------------------------------------

class Case:
    """A small paged-attention problem with bf16 values; tests edit fields before running.

    Default: NB=4 pages of P=4 tokens, Hk=1 KV head, H=2 query heads, D=16, one request
    whose block table maps logical page i -> physical page PAGE_OF[i].
    """

    PAGE_OF = [2, 0, 3, 1]

    def __init__(self, R=1, H=2, Hk=1, D=16, W=6, NB=4, P=4, seed=0, q_zero=True):
        rng = np.random.default_rng(seed)
        self.P = P
        self.q = np.zeros((R, H, D)) if q_zero else bf16(rng.standard_normal((R, H, D)))
        self.k = bf16(rng.standard_normal((NB, P, Hk, D)))
        self.v = bf16(rng.standard_normal((NB, P, Hk, D)))
        self.gate = bf16(rng.standard_normal((R, H, D)))
        self.idx = np.full((R, W + 1), -1, np.int32)
        self.idx[:, W] = 0
        self.bt = np.array([self.PAGE_OF], np.int32)
        self.t2r = np.zeros(R, np.int32)

    def set_row(self, r, tokens, count=None):
        W = self.idx.shape[1] - 1
        self.idx[r, :W] = -1
        self.idx[r, : len(tokens)] = tokens
        self.idx[r, W] = len(tokens) if count is None else count

    def kv(self, t, h=0):
        """K and V of logical token t of request 0 (through the block table)."""
        pg, s = self.PAGE_OF[t // self.P], t % self.P
        return self.k[pg, s, h], self.v[pg, s, h]

    def run(self, block_n=4, num_tiles=64, num_splits=1):
        return sparse_attention_oracle(
            self.q, self.k, self.v, self.idx, self.bt, self.t2r, self.gate,
            block_n=block_n, num_tiles=num_tiles, num_splits=num_splits)


def expect_mean(case, r, tokens, weights=None):
    """Gated output of row r when every head attends to `tokens` with equal scores."""
    w = np.ones(len(tokens)) if weights is None else np.asarray(weights, float)
    vs = np.stack([case.kv(t)[1] for t in tokens])
    mean = (w[:, None] * vs).sum(0) / w.sum()
    return gated(np.broadcast_to(mean, case.q.shape[1:]), case.gate[r])


def test_single_key_gives_gated_value():
    c = Case(q_zero=False)
    c.set_row(0, [5])
    out = c.run()
    v = c.kv(5)[1]
    np.testing.assert_array_equal(out[0], bf16(bf16(v)[None, :] * sig(c.gate[0])))
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, bf16(out))  # bf16-representable


def test_accepts_bf16_arrays_same_result():
    c = Case(q_zero=False)
    c.set_row(0, [1, 6, 9])
    ref = c.run()
    c.q, c.k, c.v, c.gate = (a.astype(BF16) for a in (c.q, c.k, c.v, c.gate))
    np.testing.assert_array_equal(c.run(), ref)


def test_gqa_head_mapping():
    c = Case(H=4, Hk=2, q_zero=False)
    c.set_row(0, [3])
    out = c.run()
    for j in range(4):  # query heads 0,1 -> KV head 0; 2,3 -> KV head 1
        v = c.kv(3, h=j // 2)[1]
        np.testing.assert_array_equal(out[0, j], gated(v, c.gate[0, j]))


def test_equal_scores_average_values():
    c = Case()  # q = 0: every score is 0
    c.set_row(0, [0, 13])
    np.testing.assert_array_equal(c.run()[0], expect_mean(c, 0, [0, 13]))


def test_gate_zero_halves_exactly():
    c = Case()
    c.gate[:] = 0.0
    c.set_row(0, [2, 7])
    mean = (c.kv(2)[1] + c.kv(7)[1]) / 2
    np.testing.assert_array_equal(c.run()[0, 0], bf16(mean) * 0.5)


def test_duplicate_index_counts_twice():
    c = Case()
    c.set_row(0, [4, 4, 11])
    np.testing.assert_array_equal(c.run()[0], expect_mean(c, 0, [4, 11], weights=[2, 1]))


@pytest.mark.parametrize("count", [0, -1, -100])
def test_empty_row_is_exact_zero(count):
    c = Case(R=2, q_zero=False)
    c.set_row(0, [1, 2], count=count)
    c.set_row(1, [1, 2])
    c.gate[0] = np.nan  # even a NaN gate must not leak into an empty row
    out = c.run()
    assert np.all(out[0] == 0.0)
    assert np.all(out[1] != 0.0)


@pytest.mark.parametrize("count", [7, 1000])
def test_count_above_width_is_clamped(count):
    # count = 7 is also a valid token: the count column must never be read as an index
    # (block_n = 4 makes the tile cover column W = 3, the count column itself).
    c = Case(W=3)
    c.set_row(0, [1, 5, 9], count=count)
    np.testing.assert_array_equal(c.run(block_n=4)[0], expect_mean(c, 0, [1, 5, 9]))


def test_minus_one_inside_count_is_ignored():
    c = Case()
    c.set_row(0, [3, -1, 8, -1])
    np.testing.assert_array_equal(c.run()[0], expect_mean(c, 0, [3, 8]))


def test_column_after_count_inside_consumed_tile_is_used():
    # The spec consumes whole tiles and keeps any index >= 0: count = 1 with block_n = 4
    # consumes columns 0..3, so the 5 in column 1 is used (callers pad with -1 to avoid it).
    c = Case()
    c.set_row(0, [2, 5], count=1)
    np.testing.assert_array_equal(c.run(block_n=4)[0], expect_mean(c, 0, [2, 5]))
    # With block_n = 1 only one tile is consumed and column 1 is not reached.
    np.testing.assert_array_equal(c.run(block_n=1)[0], expect_mean(c, 0, [2]))


def test_columns_beyond_tile_cap_are_ignored():
    c = Case()
    c.set_row(0, [0, 5, 10, 15])
    np.testing.assert_array_equal(c.run(block_n=2, num_tiles=1)[0], expect_mean(c, 0, [0, 5]))
    np.testing.assert_array_equal(c.run(block_n=2, num_tiles=2)[0],
                                  expect_mean(c, 0, [0, 5, 10, 15]))


def test_token_past_block_table_width_is_ignored():
    c = Case()
    c.bt = c.bt[:, :2]  # BTW = 2: tokens >= 8 have no block-table entry
    c.set_row(0, [6, 8, 15])
    np.testing.assert_array_equal(c.run()[0], expect_mean(c, 0, [6]))


@pytest.mark.parametrize("bad_page", [-1, 4, 1 << 30])
def test_physical_page_out_of_range_is_ignored(bad_page):
    c = Case()
    c.bt[0, 1] = bad_page  # logical page 1 = tokens 4..7
    c.set_row(0, [1, 5, 6, 9])
    np.testing.assert_array_equal(c.run()[0], expect_mean(c, 0, [1, 9]))


@pytest.mark.parametrize("req", [-1, 1, 7])
def test_invalid_request_gives_zeros(req):
    c = Case(R=2, q_zero=False)
    c.set_row(0, [1, 2, 3])
    c.set_row(1, [1, 2, 3])
    c.t2r[0] = req  # block table has a single row (NR = 1)
    out = c.run()
    assert np.all(out[0] == 0.0)
    assert np.all(out[1] != 0.0)


def test_all_entries_invalid_gives_zeros():
    c = Case(q_zero=False)
    c.set_row(0, [-1, 99, -7], count=3)
    assert np.all(c.run() == 0.0)


def test_unequal_scores_exact_powers_of_two_across_tiles():
    # q[0] = sqrt(D)/log2(e) and K[..., 0] = integer n makes the base-2 score exactly n.
    # Tile 1 holds a score-0 key, tile 2 a score-3 key: alpha = 1/8 rescales tile 1,
    # giving weights 1 : 8.
    c = Case(D=16)
    c.q[:] = 0.0
    c.q[0, :, 0] = math.sqrt(16) / math.log2(math.e)
    for t, n in ((1, 0.0), (6, 3.0)):
        pg, s = c.PAGE_OF[t // 4], t % 4
        c.k[pg, s, 0, :] = 0.0
        c.k[pg, s, 0, 0] = n
    c.set_row(0, [1, 6])
    expected = expect_mean(c, 0, [1, 6], weights=[1, 8])
    np.testing.assert_allclose(c.run(block_n=1)[0], expected, rtol=0, atol=0)
    np.testing.assert_allclose(c.run(block_n=2)[0], expected, rtol=0, atol=0)


def test_very_negative_score_still_normalises():
    # A lone key with base-2 score -1100: its p is 2**0 = 1 because the running max starts
    # at -1e20 and moves to the score (a max started at 0 would underflow p to 0).
    D = 16
    c = Case(D=D)
    c.q[:] = 0.0
    c.q[0, :, 0] = math.sqrt(D) / math.log2(math.e)
    pg, s = c.PAGE_OF[0], 2
    c.k[pg, s, 0, :] = 0.0
    c.k[pg, s, 0, 0] = -1100.0
    c.set_row(0, [2])
    np.testing.assert_array_equal(c.run()[0], expect_mean(c, 0, [2]))


def test_probabilities_rounded_but_normaliser_not():
    # Two keys with base-2 scores 0 and -x where 2**-x is not a bf16 value: the P.V product
    # uses bf16(2**-x) while the denominator uses 2**-x itself.
    D = 16
    c = Case(D=D)
    x = 0.3
    c.q[:] = 0.0
    c.q[0, :, 0] = math.sqrt(D) / math.log2(math.e)
    for t, n in ((2, 0.0), (3, -x)):
        pg, s = c.PAGE_OF[t // 4], t % 4
        c.k[pg, s, 0, :] = 0.0
        c.k[pg, s, 0, 0] = n  # K is a float64 array here: the oracle accepts any float
    c.set_row(0, [2, 3])
    p = 2.0 ** -x
    assert bf16(p) != p
    v2, v3 = c.kv(2)[1], c.kv(3)[1]
    attn = (1.0 * v2 + bf16(p) * v3) / (1.0 + p)
    # Before the gate the difference is ~2**-9 relative, which the bf16 store can hide, so
    # check the unrounded attention output as well as the final one.
    core = oracle._attention_core(c.q, c.k, c.v, c.idx, c.bt, c.t2r, block_n=4, num_tiles=4,
                                  num_splits=1)
    np.testing.assert_allclose(core[0], np.broadcast_to(attn, (2, D)), rtol=1e-13, atol=0)
    unrounded = (1.0 * v2 + p * v3) / (1.0 + p)
    assert np.abs(core[0, 0] - unrounded).max() > 1e-4
    np.testing.assert_allclose(c.run()[0], gated(np.broadcast_to(attn, (2, D)), c.gate[0]),
                               rtol=0, atol=0)


def _random_problem(seed, R=8, H=4, Hk=2, D=32, W=40, NB=12, P=4, BTW=6, NR=3):
    rng = np.random.default_rng(seed)
    q = bf16(rng.standard_normal((R, H, D)) * 2)
    k = bf16(rng.standard_normal((NB, P, Hk, D)))
    v = bf16(rng.standard_normal((NB, P, Hk, D)))
    gate = bf16(rng.standard_normal((R, H, D)))
    bt = rng.integers(-1, NB + 1, size=(NR, BTW)).astype(np.int32)  # some invalid pages
    idx = rng.integers(-1, P * BTW + 2, size=(R, W + 1)).astype(np.int32)
    idx[:, W] = rng.integers(-2, W + 5, size=R)
    idx[0, W] = W
    t2r = rng.integers(-1, NR + 1, size=R).astype(np.int32)
    t2r[0] = 0
    return q, k, v, idx, bt, t2r, gate


def _valid_cells(idx, bt, t2r, NB, P):
    """(page, slot) pairs any row validly references (computed here, not by the oracle)."""
    cells = set()
    W = idx.shape[1] - 1
    for r in range(idx.shape[0]):
        req = t2r[r]
        if not (0 <= req < bt.shape[0]):
            continue
        for t in idx[r, :W]:
            if t >= 0 and t // P < bt.shape[1] and 0 <= bt[req, t // P] < NB:
                cells.add((int(bt[req, t // P]), int(t % P)))
    return cells


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_nan_in_unreferenced_cache_cells_does_not_leak(seed):
    q, k, v, idx, bt, t2r, gate = _random_problem(seed)
    cfg = dict(block_n=8, num_tiles=5, num_splits=2)
    ref = sparse_attention_oracle(q, k, v, idx, bt, t2r, gate, **cfg)
    assert np.all(np.isfinite(ref))
    NB, P = k.shape[:2]
    keep = _valid_cells(idx, bt, t2r, NB, P)
    assert 0 < len(keep) < NB * P
    k2, v2 = k.copy(), v.copy()
    for pg in range(NB):
        for s in range(P):
            if (pg, s) not in keep:
                k2[pg, s] = np.nan
                v2[pg, s] = np.nan
    out = sparse_attention_oracle(q, k2, v2, idx, bt, t2r, gate, **cfg)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("seed", [4, 5])
def test_split_counts_agree_to_bf16_level_on_random_inputs(seed):
    q, k, v, idx, bt, t2r, gate = _random_problem(seed)
    outs = [sparse_attention_oracle(q, k, v, idx, bt, t2r, gate,
                                    block_n=4, num_tiles=10, num_splits=s)
            for s in (1, 2, 3, 8)]
    for o in outs[1:]:
        # Only bf16(p) differs (different running maxima), so about one bf16 ulp.
        rel = np.linalg.norm(o - outs[0]) / np.linalg.norm(outs[0])
        assert rel < 4e-3
        np.testing.assert_array_equal(o == 0.0, outs[0] == 0.0)


def test_split_counts_agree_when_probabilities_are_exact():
    # Integer base-2 scores make every p a power of two (exact in bf16) whatever the running
    # max, so the split count changes nothing but float64 summation order.
    rng = np.random.default_rng(7)
    R, H, Hk, D, W, NB, P = 6, 4, 2, 16, 30, 8, 4
    q = np.zeros((R, H, D))
    q[:, :, 0] = math.sqrt(D) / math.log2(math.e)
    k = bf16(rng.standard_normal((NB, P, Hk, D)))
    k[..., 0] = rng.integers(-6, 7, size=(NB, P, Hk))
    v = bf16(rng.standard_normal((NB, P, Hk, D)))
    gate = bf16(rng.standard_normal((R, H, D)))
    bt = rng.permutation(NB).reshape(1, NB).astype(np.int32)
    idx = rng.integers(-1, NB * P, size=(R, W + 1)).astype(np.int32)
    idx[:, W] = rng.integers(1, W + 1, size=R)
    t2r = np.zeros(R, np.int32)
    # The q/k channels other than 0 must not perturb the score: zero q there (done above).
    cores = [oracle._attention_core(q, k, v, idx, bt, t2r, block_n=4, num_tiles=8,
                                    num_splits=s) for s in (1, 2, 3, 8)]
    for c in cores[1:]:
        np.testing.assert_allclose(c, cores[0], rtol=1e-12, atol=1e-14)
    outs = [sparse_attention_oracle(q, k, v, idx, bt, t2r, gate, block_n=4, num_tiles=8,
                                    num_splits=s) for s in (1, 2, 3, 8)]
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=1e-6, atol=0)


def test_split_with_no_tiles_is_ignored_by_merge():
    c = Case()
    c.set_row(0, [3, 9])  # one tile with block_n = 4: splits 1..7 are empty
    np.testing.assert_array_equal(c.run(num_splits=8)[0], expect_mean(c, 0, [3, 9]))


def test_rejects_bad_shapes():
    c = Case()
    with pytest.raises(ValueError, match="output_gate"):
        sparse_attention_oracle(c.q, c.k, c.v, c.idx, c.bt, c.t2r, c.gate[:, :1],
                                block_n=4, num_tiles=4, num_splits=1)
    with pytest.raises(ValueError, match="H=3"):
        sparse_attention_oracle(np.zeros((1, 3, 16)), np.zeros((4, 4, 2, 16)),
                                np.zeros((4, 4, 2, 16)), c.idx, c.bt, c.t2r,
                                np.zeros((1, 3, 16)), block_n=4, num_tiles=4, num_splits=1)


def test_mid_size_case_runs_and_is_finite():
    # A wall-clock bound here would be a timed test (flaky on a loaded 2-core CI
    # machine); what must hold is that a mid-size call completes with finite output.
    rng = np.random.default_rng(0)
    R, H, Hk, D, W, NB, P = 64, 8, 2, 64, 300, 80, 16
    q = bf16(rng.standard_normal((R, H, D)))
    k = bf16(rng.standard_normal((NB, P, Hk, D)))
    v = bf16(rng.standard_normal((NB, P, Hk, D)))
    bt = rng.permutation(NB).reshape(1, NB)
    idx = rng.integers(0, NB * P, size=(R, W + 1))
    idx[:, W] = W
    out = sparse_attention_oracle(q, k, v, idx, bt, np.zeros(R, int), q, block_n=16,
                                  num_tiles=19, num_splits=4)
    assert out.shape == (R, H, D) and np.isfinite(out).all() and np.abs(out).sum() > 0


# --------------------------------------------------------------------------------------
# compress_groups_with_ratio
# --------------------------------------------------------------------------------------

class Comp:
    """One or more requests of raw rows plus a ring. C = 4 by default, ring size S.

    Ring block `ring_block[req]` holds, at slot pos % S, the key value `ring_val(pos)` and
    rope positions (pos + 1000, pos + 2000, pos + 3000); raw row positions are
    (pos + 10, pos + 20, pos + 30) so the two sources can be told apart.
    """

    def __init__(self, starts, lengths, C=4, S=8, Dk=8, Bs=4, seed=0):
        rng = np.random.default_rng(seed)
        self.C, self.S, self.Dk = C, S, Dk
        R = sum(lengths)
        self.qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        self.t2r = np.repeat(np.arange(len(lengths)), lengths).astype(np.int32)
        self.pos = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)]
                                  ).astype(np.int64)
        self.raw = bf16(rng.standard_normal((R, 1, Dk)))
        self.raw_pos = np.stack([self.pos + 10, self.pos + 20, self.pos + 30], -1)[:, None, :]
        self.ring = bf16(rng.standard_normal((Bs, S, 1, Dk)))
        self.rope = np.stack([np.arange(Bs * S).reshape(Bs, S) + o for o in (1000, 2000, 3000)],
                             -1)[:, :, None, :].astype(np.int64)
        self.ring_bt = (np.arange(len(lengths))[:, None] + 1).astype(np.int32) % Bs
        self.slots = np.arange(R, dtype=np.int64) + 100

    def member(self, r, p):
        """Value of position p for row r's request, picked by hand."""
        req = self.t2r[r]
        qs = self.qsl[req]
        cs = self.pos[r] - (r - qs)
        if p >= cs:
            return self.raw[qs + p - cs, 0]
        return self.ring[self.ring_bt[req, 0], p % self.S, 0]

    def run(self, rope=True):
        return compress_groups_oracle(
            self.raw, self.raw_pos, self.ring, self.ring_bt, self.t2r, self.qsl, self.pos,
            self.slots, self.C, rope_cache=self.rope if rope else None)


def test_compress_group_fully_in_raw_rows():
    c = Comp(starts=[10], lengths=[6])
    pooled, first = c.run()
    r = 4  # e = 14, chunk start 10: members 11..14 are raw rows 1..4
    np.testing.assert_array_equal(pooled[r, 0], bf16(c.raw[1:5, 0].sum(0) / 4))
    np.testing.assert_array_equal(first[r], [11 + 10, 11 + 20, 11 + 30])  # raw_positions
    _, first_norope = c.run(rope=False)
    np.testing.assert_array_equal(first_norope[r], [11, 11, 11])


def test_compress_group_mostly_in_ring():
    # The newest member (position e) is always this row's own raw row, so a chunk's first
    # row has C-1 ring members and one raw member.
    c = Comp(starts=[10], lengths=[3])
    pooled, first = c.run()
    b = c.ring_bt[0, 0]
    expected = (c.ring[b, 7 % 8, 0] + c.ring[b, 8 % 8, 0] + c.ring[b, 9 % 8, 0] + c.raw[0, 0]) / 4
    np.testing.assert_array_equal(pooled[0, 0], bf16(expected))
    np.testing.assert_array_equal(first[0], c.rope[b, 7, 0])  # rope from the ring


def test_compress_group_spanning_ring_and_raw_with_wraparound():
    c = Comp(starts=[14], lengths=[4], S=4)  # ring size 4: slots wrap quickly
    pooled, first = c.run()
    b = c.ring_bt[0, 0]
    r = 1  # e = 15, chunk start 14: members 12, 13 from ring slots 0, 1; 14, 15 raw rows 0, 1
    expected = (c.ring[b, 0, 0] + c.ring[b, 1, 0] + c.raw[0, 0] + c.raw[1, 0]) / 4
    np.testing.assert_array_equal(pooled[r, 0], bf16(expected))
    np.testing.assert_array_equal(first[r], c.rope[b, 0, 0])
    r = 3  # e = 17: members 14..17 all raw
    np.testing.assert_array_equal(first[r], [24, 34, 44])


def test_compress_sum_then_round_to_nearest_even():
    c = Comp(starts=[20], lengths=[4], Dk=2)
    u = 2.0 ** -7  # one bf16 ulp at 1.0
    c.raw[:, 0, 0] = [1.0, 1.0, 1.0 + u, 1.0 + u]  # mean 1 + u/2: a tie -> even (1.0)
    c.raw[:, 0, 1] = [1.0 + u, 1.0 + u, 1.0 + u, 1.0 + 2 * u]  # mean 1 + 1.25u -> 1 + u
    pooled, _ = c.run()
    np.testing.assert_array_equal(pooled[3, 0], [1.0, 1.0 + u])


def test_compress_e_below_ratio_is_invalid():
    c = Comp(starts=[0], lengths=[5])
    pooled, first = c.run()
    assert np.all(pooled[:3] == 0) and np.all(first[:3] == 0)  # e = 0, 1, 2 < C-1
    np.testing.assert_array_equal(pooled[3, 0], bf16(c.raw[0:4, 0].sum(0) / 4))  # e = 3
    np.testing.assert_array_equal(first[3], [10, 20, 30])


def test_compress_negative_slot_is_invalid():
    c = Comp(starts=[10], lengths=[4])
    c.slots[2] = -1
    pooled, first = c.run()
    assert np.all(pooled[2] == 0) and np.all(first[2] == 0)
    assert np.all(pooled[3] != 0)


def test_compress_row_outside_its_request_range_is_invalid():
    c = Comp(starts=[10, 30], lengths=[3, 3])
    c.t2r[4] = 0  # row 4 claims request 0, whose rows are [0, 3)
    pooled, first = c.run()
    assert np.all(pooled[4] == 0) and np.all(first[4] == 0)
    # request 1's other rows are unaffected and read ring block ring_bt[1, 0]
    r, b = 5, c.ring_bt[1, 0]  # e = 32, chunk start 30: members 29 (ring), 30..32 raw
    expected = (c.ring[b, 29 % 8, 0] + c.raw[3, 0] + c.raw[4, 0] + c.raw[5, 0]) / 4
    np.testing.assert_array_equal(pooled[r, 0], bf16(expected))


@pytest.mark.parametrize("req", [-1, 2, 9])
def test_compress_invalid_request_is_invalid(req):
    c = Comp(starts=[10, 30], lengths=[3, 3])
    c.t2r[1] = req
    pooled, first = c.run()
    assert np.all(pooled[1] == 0) and np.all(first[1] == 0)


@pytest.mark.parametrize("bad_block", [-1, 4, 1 << 20])
def test_compress_invalid_ring_block_contributes_zero(bad_block):
    c = Comp(starts=[10], lengths=[3])
    c.ring_bt[0, 0] = bad_block
    pooled, first = c.run()
    # row 1: e = 11, members 8, 9 (ring, now 0) + raw rows 0, 1; the row stays valid
    np.testing.assert_array_equal(pooled[1, 0], bf16((c.raw[0, 0] + c.raw[1, 0]) / 4))
    np.testing.assert_array_equal(first[1], [0, 0, 0])  # first member in the missing ring
    _, first_norope = c.run(rope=False)
    np.testing.assert_array_equal(first_norope[1], [8, 8, 8])


def test_compress_positions_near_2_pow_31_stay_exact():
    base = 2 ** 31 - 2
    c = Comp(starts=[base], lengths=[4], S=8)
    big = np.int64(2 ** 40 + 3)
    c.rope = c.rope + big
    pooled, first = c.run()
    b = c.ring_bt[0, 0]
    r = 2  # e = 2**31: members 2**31-3 (ring) and 2**31-2 .. 2**31 (raw)
    f = base + 2 - 3
    assert f == 2 ** 31 - 3
    np.testing.assert_array_equal(first[r], c.rope[b, f % 8, 0])
    assert first.dtype == np.int64
    expected = (c.ring[b, f % 8, 0] + c.raw[0, 0] + c.raw[1, 0] + c.raw[2, 0]) / 4
    np.testing.assert_array_equal(pooled[r, 0], bf16(expected))
    _, first_norope = c.run(rope=False)
    np.testing.assert_array_equal(first_norope[3], [2 ** 31 - 2] * 3)  # e = 2**31 + 1
    np.testing.assert_array_equal(first[3], [2 ** 31 - 2 + 10, 2 ** 31 - 2 + 20,
                                             2 ** 31 - 2 + 30])


def test_compress_member_helper_agrees_on_every_row():
    # Cross-check all rows of a two-request batch against the hand-written member rule.
    c = Comp(starts=[5, 40], lengths=[5, 7], C=4, S=8, seed=3)
    pooled, _ = c.run()
    for r in range(len(c.pos)):
        e = int(c.pos[r])
        if e < 3:
            assert np.all(pooled[r] == 0)
            continue
        expected = sum(c.member(r, p) for p in range(e - 3, e + 1)) / 4
        np.testing.assert_array_equal(pooled[r, 0], bf16(expected))


# --------------------------------------------------------------------------------------
# store_cache_rows
# --------------------------------------------------------------------------------------

def test_store_skips_out_of_range_and_keeps_other_bits():
    rng = np.random.default_rng(0)
    pages, P, width = 3, 4, 6
    cache = rng.standard_normal((pages, P, 1, width)).astype(BF16)
    cache[2, 3, 0, 0] = np.nan  # untouched NaN must survive bit-for-bit
    before = cache.copy()
    rows = rng.standard_normal((5, width)).astype(BF16)
    slots = np.array([-1, 0, pages * P, 5, pages * P - 1 - 4])
    out = store_cache_rows_oracle(cache, slots, rows)
    assert out.dtype == cache.dtype and out.shape == cache.shape
    expected = before.view(np.uint16).copy()
    expected[0, 0, 0] = rows[1].view(np.uint16)
    expected[1, 1, 0] = rows[3].view(np.uint16)
    expected[1, 3, 0] = rows[4].view(np.uint16)  # slot 7
    np.testing.assert_array_equal(out.view(np.uint16), expected)
    np.testing.assert_array_equal(cache.view(np.uint16), before.view(np.uint16))  # input kept


def test_store_converts_float32_to_bf16_round_to_nearest_even():
    # A random cache, so that an untouched slot keeps bits a stray write of zeros would change.
    cache = np.random.default_rng(4).standard_normal((1, 2, 1, 3)).astype(BF16)
    u = 2.0 ** -7
    rows = np.array([[1.0 + u / 2, 1.0 + 0.75 * u, -2.0]], np.float32)
    out = store_cache_rows_oracle(cache, [1], rows)
    # bf16 bits: 1.0 = 0x3F80, 1 + 2**-7 = 0x3F81, -2.0 = 0xC000
    np.testing.assert_array_equal(out[0, 1, 0].view(np.uint16), [0x3F80, 0x3F81, 0xC000])
    np.testing.assert_array_equal(out[0, 0].view(np.uint16), cache[0, 0].view(np.uint16))


def test_store_accepts_rows_with_head_axis_and_last_duplicate_wins():
    cache = np.random.default_rng(5).standard_normal((2, 2, 1, 2)).astype(np.float32)
    rows = np.array([[[1, 2]], [[3, 4]], [[5, 6]]], np.float32)
    out = store_cache_rows_oracle(cache, np.array([3, 1, 3]), rows)
    np.testing.assert_array_equal(out[1, 1, 0], [5, 6])  # oracle's choice; GPU order undefined
    np.testing.assert_array_equal(out[0, 1, 0], [3, 4])
    np.testing.assert_array_equal(out[:, 0].view(np.uint32), cache[:, 0].view(np.uint32))
