"""The single-launch decode (``PallasLaunch(merge="fused")``): the last split program of a
(row, KV head) to arrive merges, counted by an atomic counter.

* Interpret mode (CPU): bit-identical to the separate merge kernel (same helpers, same
  order) over tilings, row counts, every degenerate row kind and NaN-poisoned unreferenced
  cache rows; also the backward's residuals.
* The sm_90 lowering (CPU, tools/sm90_forward_ir.py): one Triton kernel, the counters
  aliased in place, a CTA barrier before an acq_rel GPU-scope atomic add whose old value
  decides who merges; default launches unchanged.
* On a GPU: bit-identity / fidelity against the separate merge at the real shapes.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

import qsa_jax
from qsa_jax.config import SparseAttentionConfig
from qsa_testing import cases as C
from qsa_testing.agreement import assert_fidelity

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
from test_pallas import _oracle, _run_sparse, _small_case  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")

FUSED = qsa_jax.PallasLaunch(merge="fused")


def _bits(x):
    return np.asarray(x).view(np.uint16)


# (rows, query heads, KV heads, D, selection width, (block_n, warps, tiles, splits), merge block_d)
@pytest.mark.parametrize("rows,heads,kv_heads,d,width,cfg,block_d", [
    (1, 6, 2, 32, 131, (16, 4, 9, 9), 32),     # one row, one tile per split
    (3, 6, 2, 32, 131, (16, 4, 9, 3), 8),      # a few rows, D in 4 chunks
    (12, 12, 1, 16, 131, (16, 4, 9, 4), 16),   # TP1-like G = 12, every degenerate row kind
    (7, 8, 4, 16, 67, (32, 2, 3, 2), None),    # G = 2, the default block_d, a partial last tile
])
def test_fused_merge_is_bit_identical_to_the_merge_kernel(rows, heads, kv_heads, d, width, cfg, block_d):
    case = _small_case(rows * 10 + heads, rows=rows, heads=heads, kv_heads=kv_heads, d=d, blocks=16,
                       width=width, edge=rows > 1)
    C.poison_unreferenced(case, SparseAttentionConfig(*cfg))
    separate = _run_sparse(case, case.kv_cache, config=cfg, launch=qsa_jax.PallasLaunch(merge_block_d=block_d))
    fused = _run_sparse(case, case.kv_cache, config=cfg,
                        launch=qsa_jax.PallasLaunch(merge="fused", merge_block_d=block_d))
    np.testing.assert_array_equal(_bits(fused), _bits(separate))
    assert not np.isnan(fused.astype(np.float32)).any()
    expected = _oracle(case, SparseAttentionConfig(*cfg))
    assert_fidelity(fused, expected, what=f"fused merge {cfg}")
    if rows > 1:  # degenerate rows (empty, all -1, request out of range) give the originals' exact zeros
        zero_rows = (expected == 0).all(axis=(1, 2))
        assert zero_rows.any() and (fused[zero_rows] == 0).all()


def test_all_rows_empty_and_out_of_range_requests():
    """Nothing valid anywhere: every partial is empty, the merge writes exact zeros (no NaN
    from 0/0), whoever arrives last."""
    case = _small_case(77, rows=4, heads=6, kv_heads=2, d=16, blocks=8, width=64, edge=False)
    cfg = (16, 4, 4, 4)
    w = case.selection_width
    case.logical_indices[0, :w] = -1
    case.token_to_req[1] = -1
    case.token_to_req[2] = case.block_table.shape[0]
    case.logical_indices[3, w] = 0
    C.poison_unreferenced(case, SparseAttentionConfig(*cfg))
    fused = _run_sparse(case, case.kv_cache, config=cfg, launch=FUSED)
    np.testing.assert_array_equal(_bits(fused), np.zeros_like(_bits(fused)))


def test_fused_merge_residuals_match_the_merge_kernel():
    """The backward's residuals (ungated attention, merged LSE) from the fused merge are the
    separate merge's, bit for bit."""
    import dataclasses

    from qsa_jax.ops.sparse_attention import base, pallas

    case = _small_case(5, rows=5, heads=6, kv_heads=2, d=16, blocks=16, width=131)
    cfg = (16, 4, 9, 5)
    C.poison_unreferenced(case, SparseAttentionConfig(*cfg))
    args = (case.q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req,
            case.output_gate)
    problem = base.check_sparse_attention_args(*args, use_prefill_config=False, config=cfg)
    kv = (np.asarray(case.kv_cache),)
    outs = [pallas.run(dataclasses.replace(problem, launch=launch), case.q, kv, *args[2:], residuals=True)
            for launch in (None, FUSED)]
    for want, got in zip(*outs):
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8))


def test_merge_mode_is_checked_and_defaults_to_separate():
    from qsa_jax.config import pallas_launch
    from qsa_jax.ops.sparse_attention import base

    with pytest.raises(ValueError, match=r"PallasLaunch.merge must be one of \('separate', 'fused'\)"):
        qsa_jax.PallasLaunch(merge="last")
    case = _small_case(3, rows=2, edge=False)
    problem = base.check_sparse_attention_args(
        case.q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        use_prefill_config=False, config=None)
    assert pallas_launch(problem).merge == "separate"


def test_fused_merge_steps_follow_the_register_budget():
    """The fused merge takes D whole where a [S_pow2, D] slab fits 64 fp32 values per thread
    (G steps instead of 4 G), 64 columns at 65 splits on 4 warps; ``merge_block_d`` given
    in ``launch=`` wins."""
    from qsa_jax.config import pallas_fused_merge_block_d, pallas_launch
    from qsa_jax.ops.sparse_attention import base

    assert pallas_fused_merge_block_d(65, 256, 4) == 64  # TP1/TP4 1 row on the H200 table
    assert pallas_fused_merge_block_d(33, 256, 8) == 256  # 4 programs
    assert pallas_fused_merge_block_d(32, 256, 4) == 256  # 8-16 programs
    assert pallas_fused_merge_block_d(64, 48, 1) == 16  # a power of two that divides D
    case = _small_case(3, rows=2, edge=False)
    args = (case.q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req, case.output_gate)
    problem = lambda launch: base.check_sparse_attention_args(  # noqa: E731
        *args, use_prefill_config=False, config=(16, 4, 9, 9), launch=launch)
    assert pallas_launch(problem(FUSED)).merge_block_d == 16  # D = 16 whole
    assert pallas_launch(problem(qsa_jax.PallasLaunch(merge="fused", merge_block_d=8))).merge_block_d == 8
    assert pallas_launch(problem(None)).merge_block_d == 16


def test_one_split_ignores_the_fused_merge():
    case = _small_case(9, rows=3, edge=False)
    cfg = (64, 2, 3, 1)
    C.poison_unreferenced(case, SparseAttentionConfig(*cfg))
    np.testing.assert_array_equal(_bits(_run_sparse(case, case.kv_cache, config=cfg, launch=FUSED)),
                                  _bits(_run_sparse(case, case.kv_cache, config=cfg)))


# ---------------------------------------------------------------------------------
# The sm_90 lowering, on CPU

pytest.importorskip("jax._src.pallas.triton.pallas_call_registration")


@pytest.fixture
def sm90(monkeypatch):
    import sm90_forward_ir as IR

    IR.patch_for_sm90("h200", monkeypatch.setattr)
    return IR.lower_case


def test_sm90_lowering_has_one_kernel_and_an_ordered_arrival(sm90):
    # TP1, 1 row: the H200 table's 65 splits (block_n 32, 4 warps).
    text = sm90("fused_tp1_r1", 1, 24, 2, "fused", "bf16", None, FUSED)
    attrs, *kernels = text.split("\n\n")
    assert attrs.splitlines() == ["qsa_sparse_attention: num_stages=2 num_warps=4"]
    ttir = kernels[0]
    atomics = re.findall(r"tt\.atomic_rmw (\w+), (\w+), (\w+), .*", ttir)
    assert atomics == [("add", "acq_rel", "gpu")], atomics
    lines = ttir.splitlines()
    at = next(i for i, line in enumerate(lines) if "tt.atomic_rmw" in line)
    barrier = [i for i, line in enumerate(lines) if "gpu.barrier" in line]
    partial_stores = [i for i, line in enumerate(lines) if "tt.store" in line and "ptr<f32>" in line]
    output_stores = [i for i, line in enumerate(lines) if "tt.store" in line and "ptr<bf16>" in line]
    # Partial + LSE stores, then the barrier, then the arrival; the merged output's
    # stores (G = 12 heads x 4 chunks of 64, unrolled) only after it, inside the
    # branch that the atomic's old value == 64 (65 splits - 1) selects.
    assert partial_stores and barrier and min(barrier) > max(partial_stores), (partial_stores, barrier)
    assert min(i for i in barrier if i > max(partial_stores)) < at
    assert len(output_stores) == 12 * 4 and min(output_stores) > at, output_stores
    old = re.search(r"(%\w+) = tt\.atomic_rmw", lines[at]).group(1)
    last = re.search(rf"(%\w+) = arith\.cmpi eq, {old}, (%\w+)", ttir)
    assert last, "the atomic's old value must decide who merges"
    assert re.search(rf"{re.escape(last.group(2))} = arith\.constant 64 : i32", ttir)
    branch = "\n".join(lines[at:min(output_stores)])
    assert "scf.if" in branch, branch[:2000]


def test_sm90_default_launch_keeps_two_kernels(sm90):
    attrs = sm90("default_tp1_r1", 1, 24, 2, "fused", "bf16", None).split("\n\n")[0].splitlines()
    # 24 (row, head) pairs: the separate merge on 1 warp (config.PALLAS_MERGE_LAYOUTS, session 30).
    assert attrs == ["qsa_sparse_attention: num_stages=2 num_warps=4", "qsa_merge_splits: num_stages=1 num_warps=1"]


# ---------------------------------------------------------------------------------
# On a GPU


@pytest.mark.gpu
@pytest.mark.parametrize("tp,rows", [("TP1", 1), ("TP1", 8), ("TP4", 1), ("TP4", 16)])
def test_gpu_fused_merge_matches_the_merge_kernel(tp, rows):
    """Real Triton: the fused merge against the separate one at the real shapes and table
    tiling, repeated (a race between the arrival and the partials would show as a
    changing or wrong result). Bits may differ in the last place on the GPU (the merge
    runs at the attention kernel's warps); fidelity must hold."""
    heads, kv_heads = (24, 2) if tp == "TP1" else (6, 1)
    case = C.gpu_kernel_case(rows, num_query_heads=heads, num_kv_heads=kv_heads)
    args = (case.q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req, case.output_gate)
    want = np.asarray(qsa_jax.sparse_attention(*args, implementation="pallas"))
    first = None
    for _ in range(20):
        got = np.asarray(qsa_jax.sparse_attention(*args, implementation="pallas", launch=FUSED))
        first = got if first is None else first
        np.testing.assert_array_equal(_bits(got), _bits(first))
    assert not np.isnan(first.astype(np.float32)).any()
    assert_fidelity(first, want, what=f"gpu fused merge {tp} rows={rows}")
