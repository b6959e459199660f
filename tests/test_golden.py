"""Every implementation that runs here against the originals' recorded outputs.

The golden files (tests/golden, recorded on a GPU by tools/record_goldens.py;
manifest.json names the card and date) cover every split count the config
table produces, TP1/TP2/TP4 head geometries, every degenerate row kind and
NaN in every unreferenced cache row. Bar: docs/spec.md §6.
"""

from __future__ import annotations

import chex
import numpy as np
import pytest

import qsa_jax
from qsa_testing import golden, oracle
from qsa_testing.agreement import assert_agrees

if not golden.available():
    pytest.fail("tests/golden is missing: run tools/record_goldens.py on a GPU", pytrace=False)

SPARSE = golden.sparse_attention_cases()
COMPRESS = golden.compress_cases()
STORE = golden.store_cases()


def _impls(op):
    # On CPU "pallas" runs in interpret mode; "triton" needs a GPU.
    return [i for i in qsa_jax.available_implementations(op)]


def test_goldens_cover_every_split_count():
    splits = {case.config().num_splits for case, _ in SPARSE if case.q.shape[0]}
    assert {64, 16, 8, 4, 1} <= splits and {2, 3} & splits
    assert any(case.use_prefill_config and case.q.shape[0] * case.num_kv_heads > 2048 for case, _ in SPARSE)
    assert any(case.q.shape[0] == 0 for case, _ in SPARSE)


@pytest.mark.parametrize("layout", ["fused", "split"])
@pytest.mark.parametrize("impl", _impls("sparse_attention"))
@pytest.mark.parametrize("case,expected", SPARSE, ids=[c.name for c, _ in SPARSE])
def test_sparse_attention_golden(case, expected, impl, layout):
    if impl == "pallas" and case.q.shape[0] > 256 and "edge" not in case.name:
        pytest.skip("interpret mode is slow; large non-edge cases run on the GPU")
    # The goldens hold NaN in every cache row the kernel must not read.
    assert np.isnan(case.kv_cache.astype(np.float32)).any() or case.q.shape[0] == 0
    kv = case.kv_cache if layout == "fused" else case.split_caches()
    got = qsa_jax.sparse_attention(
        case.q, kv, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        use_prefill_config=case.use_prefill_config, implementation=impl)
    assert_agrees(np.asarray(got), expected, what=f"{impl}/{case.name}")


@pytest.mark.parametrize("case,expected", SPARSE, ids=[c.name for c, _ in SPARSE])
def test_oracle_matches_sparse_golden(case, expected):
    """The float64 oracle (written from the brief) agrees with the originals too."""
    cfg = case.config()
    k, v = case.split_caches()
    ref = oracle.sparse_attention_oracle(
        case.q, k, v, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        block_n=cfg.block_n, num_tiles=cfg.num_tiles, num_splits=cfg.num_splits)
    assert_agrees(ref, expected, what=f"oracle/{case.name}")


def _compress_args(case, int32_positions=True):
    a = {k: getattr(case, k) for k in (
        "raw_keys", "raw_positions", "compressor_state_cache", "compressor_state_block_table",
        "token_to_req", "query_start_loc", "logical_positions", "compressed_slots")}
    rope = case.rope_cache
    if int32_positions:  # JAX without x64: positions travel as int32
        a["raw_positions"] = a["raw_positions"].astype(np.int32)
        rope = None if rope is None else rope.astype(np.int32)
    return a, rope


@pytest.mark.parametrize("impl", _impls("compress_groups_with_ratio"))
@pytest.mark.parametrize("case,pooled,first", COMPRESS, ids=[c.name for c, _, _ in COMPRESS])
def test_compress_golden(case, pooled, first, impl):
    a, rope = _compress_args(case)
    got_pooled, got_first = qsa_jax.compress_groups_with_ratio(
        *a.values(), case.compress_ratio, rope, implementation=impl)
    # Pooling is exact: one fp32 sum of C bf16 values, one division, one rounding.
    chex.assert_trees_all_equal((np.asarray(got_pooled).view(np.uint16), np.asarray(got_first).astype(np.int64)),
                                (pooled.view(np.uint16), first))


@pytest.mark.parametrize("case,pooled,first", COMPRESS, ids=[c.name for c, _, _ in COMPRESS])
def test_oracle_matches_compress_golden(case, pooled, first):
    a, _ = _compress_args(case, int32_positions=False)
    ref_pooled, ref_first = oracle.compress_groups_oracle(*a.values(), case.compress_ratio, case.rope_cache)
    np.testing.assert_array_equal(ref_pooled, pooled.astype(np.float64))
    np.testing.assert_array_equal(ref_first, first)


@pytest.mark.parametrize("impl", _impls("store_cache_rows"))
@pytest.mark.parametrize("case,expected", STORE, ids=[c.name for c, _ in STORE])
def test_store_golden(case, expected, impl):
    got = qsa_jax.store_cache_rows(case.cache, case.slot_mapping, case.rows, implementation=impl)
    # Bit-identical everywhere: written slots and untouched ones.
    chex.assert_trees_all_equal(np.asarray(got).view(np.uint16), expected.view(np.uint16))
