"""Every implementation that runs here against the originals' recorded outputs.

The golden files (tests/golden, recorded on a GPU by tools/record_goldens.py;
manifest.json names the card and date) cover every split count the config
table produces, TP1/TP2/TP4 head geometries, every degenerate row kind and
poison in every unreferenced cache row (NaN in K and V in the files recorded
on 2026-12-02; large K and NaN V, which shows a stray read, from the next
recording on: ``cases.poison_unreferenced``). Contracts: docs/spec.md §6 --
fidelity for the originals' tiling, accuracy against exact attention for
other tilings.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import qsa_jax
from qsa_jax.config import SparseAttentionConfig
from qsa_jax.ops.sparse_attention import base as sbase
from qsa_jax.ops.sparse_attention import xla as sxla
from qsa_testing import cases as C
from qsa_testing import golden, oracle
from qsa_testing.agreement import assert_accuracy, assert_fidelity, fidelity
from qsa_testing.exact import exact_attention

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
    # The goldens hold NaN (V, and K in older files) in every cache row the kernel must not read.
    assert np.isnan(case.kv_cache.astype(np.float32)).any() or case.q.shape[0] == 0
    kv = case.kv_cache if layout == "fused" else case.split_caches()
    got = qsa_jax.sparse_attention(
        case.q, kv, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        use_prefill_config=case.use_prefill_config, implementation=impl)
    assert_fidelity(np.asarray(got), expected, what=f"{impl}/{case.name}")


@pytest.mark.parametrize("case,expected", SPARSE, ids=[c.name for c, _ in SPARSE])
def test_oracle_matches_sparse_golden(case, expected):
    """The float64 oracle (written from the brief) agrees with the originals too."""
    cfg = case.config()
    k, v = case.split_caches()
    ref = oracle.sparse_attention_oracle(
        case.q, k, v, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        block_n=cfg.block_n, num_tiles=cfg.num_tiles, num_splits=cfg.num_splits)
    assert_fidelity(ref, expected, what=f"oracle/{case.name}")


SPARSE_034 = golden.sparse_attention_v034_cases()


def test_v034_goldens_cover_every_cache_kind():
    assert SPARSE_034, "tests/golden has no vLLM 0.34.0 goldens (tools/record_goldens.py on a GPU records them)"
    kinds = {meta["kv"] for *_, meta in SPARSE_034}
    assert kinds == {"e4m3", "bytes", "bf16"}
    assert all(meta["k_scale"] != 1 and meta["v_scale"] != 1 for *_, meta in SPARSE_034)
    assert {meta["config"][3] for *_, meta in SPARSE_034 if meta["shape"][0]} >= {1, 8}


@pytest.mark.parametrize("impl", _impls("sparse_attention"))
@pytest.mark.parametrize("case,expected,meta", SPARSE_034, ids=[m["name"] for *_, m in SPARSE_034])
def test_sparse_attention_golden_v034(case, expected, meta, impl):
    """vLLM 0.34.0's outputs -- e4m3 caches, their uint8 bytes, bf16 with scales -- under the
    fidelity contract, each implementation run with the tiling 0.34.0 chose on the recording
    card (its table depends on the GPU) and the recorded scales."""
    got = qsa_jax.sparse_attention(
        case.q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req,
        case.output_gate, use_prefill_config=case.use_prefill_config, config=tuple(meta["config"]),
        implementation=impl, k_scale=meta["k_scale"], v_scale=meta["v_scale"])
    assert_fidelity(np.asarray(got), expected, what=f"{impl}/{meta['name']}")


@pytest.mark.parametrize("case,expected,meta", SPARSE_034, ids=[m["name"] for *_, m in SPARSE_034])
def test_oracle_matches_v034_golden(case, expected, meta):
    """The float64 oracle's 0.34.0 semantics (fp8 dequantisation, fp16 probabilities, scales)
    agree with 0.34.0's own outputs."""
    block_n, _, tiles, splits = meta["config"]
    k, v = case.split_caches()
    ref = oracle.sparse_attention_oracle(
        case.q, k, v, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        block_n=block_n, num_tiles=tiles, num_splits=splits, k_scale=meta["k_scale"],
        v_scale=meta["v_scale"])
    assert_fidelity(ref, expected, what=f"oracle/{meta['name']}")


# ---------------------------------------------------------------------------------
# Accuracy against exact attention, and checks of the checks


def _xla(case, config=None, *, fresh=False):
    """The XLA reference; ``fresh``: traced anew, so that monkeypatched pieces take effect."""
    args = (case.q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req,
            case.output_gate)
    if not fresh:
        return np.asarray(qsa_jax.sparse_attention(
            *args, use_prefill_config=case.use_prefill_config, config=config, implementation="xla"))
    problem = sbase.check_sparse_attention_args(
        *args, use_prefill_config=case.use_prefill_config, config=config)
    return np.asarray(jax.jit(functools.partial(sxla.run, problem))(case.q, (case.kv_cache,), *args[2:]))


def _exact(case):
    return exact_attention(case.q, case.kv_cache, case.logical_indices, case.block_table,
                           case.token_to_req, case.output_gate)


# Cases small enough for a few extra XLA compiles each; TP1/TP2/TP4, splits 64/8/3/2, edges.
ACCURACY_CASES = [(c, e) for c, e in SPARSE if c.name in (
    "tp1_r3_s64_full", "tp2_r12_s64", "tp4_r20_w63_d256_s2", "edge_tp1_r30_w2051")]


@pytest.mark.parametrize("tiling", [(64, 1), (16, 8)])
@pytest.mark.parametrize("case,expected", ACCURACY_CASES, ids=[c.name for c, _ in ACCURACY_CASES])
def test_other_tilings_are_as_accurate_as_the_originals(case, expected, tiling):
    """A different tiling moves results by about their own error, so it fails fidelity with
    the originals but meets accuracy: as close to exact attention as the originals (x1.10)."""
    block_n, splits = tiling
    tiles = -(-case.selection_width // block_n)
    cfg = SparseAttentionConfig(block_n, 1, tiles, min(splits, tiles))
    got = _xla(case, tuple(cfg))
    exact = _exact(case)
    res = assert_accuracy(got, expected, exact, what=f"xla {tuple(cfg)}/{case.name}")
    assert 2e-3 < res["err_originals"] < 3e-3  # the originals' own distance from exact


def _fp16_sigmoid_gate(attention_fp32, output_gate):
    """A one-ulp-class bug: the gate's sigmoid evaluated in fp16 (the rest as specified)."""
    rounded = attention_fp32.astype(jnp.bfloat16).astype(jnp.float32)
    gate = jax.nn.sigmoid(output_gate.astype(jnp.float16)).astype(jnp.float32)
    return (rounded * gate).astype(jnp.bfloat16)


def test_fidelity_catches_an_fp16_sigmoid(monkeypatch):
    """Deliberate break: an fp16 sigmoid in the gate epilogue fails fidelity on the goldens
    (rel. error 1.1-1.3e-3 on all 17 on CPU, measured once, against the faithful XLA's
    <= 2.2e-4; four of them here to keep CI short)."""
    monkeypatch.setattr(sxla, "gate_epilogue", _fp16_sigmoid_gate)
    for case, expected in ACCURACY_CASES:  # (the XLA epilogue is one code path for all)
        res = fidelity(_xla(case, fresh=True), expected)
        assert not res["ok"] and res["rel_err"] > 3e-4, (case.name, res)


# Rows that own their request alone (every other row of the case reads other requests), so
# the cache rows of their selections are read by no one else.
def _lonely_case(seed):
    rng = np.random.default_rng(seed)
    return C.sparse_attention_case(rng, rows=4, num_query_heads=8, num_kv_heads=2, head_dim=32,
                                   page_size=16, selection_blocks=24, context_tokens=200,
                                   num_requests=4, spare_pages=2)


def _old_poison(case, config=None):
    """The poison of the files recorded on 2026-12-02: NaN in K and V of unreferenced rows."""
    bits = case.kv_cache.view(np.uint16).copy()
    unref = ~C.referenced_rows(case, config)
    bits[np.broadcast_to(unref[:, None, :, None], bits.shape)] = C.BF16_NAN_BITS
    case.kv_cache = bits.view(C.BF16)
    return case


def _ignores_count(case, config=None):
    """Stray-read bug: the count column is ignored (every column is read)."""
    patched = C.SparseAttentionCase(**{**case.arrays(), "name": case.name,
                                       "use_prefill_config": case.use_prefill_config})
    patched.logical_indices = case.logical_indices.copy()
    patched.logical_indices[:, -1] = case.selection_width
    return _xla(patched, config)


def _wrong_request_rows(problem, tokens, block_table, token_to_req):
    """Stray-read bug: an invalid request is read as its clamped neighbour (0 or NR-1)."""
    return sbase.entry_rows(problem, tokens, block_table,
                            jnp.clip(token_to_req, 0, problem.num_requests - 1))


def _count_zero(case):
    case.logical_indices[1, -1] = 0  # row 1 keeps valid tokens in its columns


def _request_invalid(case):
    case.token_to_req[1] = -1


@pytest.mark.parametrize("poison", ["old", "new"])
@pytest.mark.parametrize("bug", ["count_ignored", "request_clamped"])
def test_a_stray_read_shows_with_the_new_poison(bug, poison, monkeypatch):
    """Row 1 owns its request alone and should read nothing (count 0 / invalid request), so
    the cache rows it names are unreferenced and poisoned. A buggy XLA reference reads them
    (ignoring the count / clamping the request to a valid one). With NaN in K (the poison of
    the 2026-12-02 files) every split that meets one is dropped as empty and the row reads 0
    -- what it should be -- so the bug passes; with large K and NaN V the output is NaN."""
    case = _lonely_case(1)
    (_count_zero if bug == "count_ignored" else _request_invalid)(case)
    (C.poison_unreferenced if poison == "new" else _old_poison)(case)
    cfg = case.config()
    k, v = case.split_caches()
    ref = oracle.sparse_attention_oracle(
        case.q, k, v, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        block_n=cfg.block_n, num_tiles=cfg.num_tiles, num_splits=cfg.num_splits)
    assert (ref[1] == 0).all()
    assert_fidelity(_xla(case), ref)  # the correct implementation: no NaN on either poison
    if bug == "count_ignored":
        got = _ignores_count(case)
    else:
        monkeypatch.setattr(sxla, "entry_rows", _wrong_request_rows)
        got = _xla(case, fresh=True)
    bad = fidelity(got, ref, what=bug)
    if poison == "old":
        assert bad["ok"], bad["why"]  # silently passes: the blind spot of NaN-K poison
    else:
        assert not bad["ok"] and bad["nan"] > 0, bad


@pytest.mark.parametrize("impl", _impls("sparse_attention"))
def test_correct_implementations_never_see_the_poison(impl):
    """Invalid entries address cache row 0 and are zeroed by a select or masked load: with
    row 0 unreferenced (large K, NaN V) and rows of every degenerate kind, still no NaN."""
    rng = np.random.default_rng(4)
    case = C.sparse_attention_case(rng, rows=10, num_query_heads=4, num_kv_heads=2, head_dim=16,
                                   page_size=8, selection_blocks=8, context_tokens=60,
                                   num_requests=3, spare_pages=2)
    C.add_edge_rows(rng, case)
    nb = case.kv_cache.shape[0]
    case.block_table[case.block_table == 0] = nb - 1  # page 0 now belongs to no request
    C.poison_unreferenced(case)
    assert not C.referenced_rows(case)[0].any()
    cfg = case.config()
    k, v = case.split_caches()
    ref = oracle.sparse_attention_oracle(
        case.q, k, v, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        block_n=cfg.block_n, num_tiles=cfg.num_tiles, num_splits=cfg.num_splits)
    for kv in (case.kv_cache, (k, v)):
        got = qsa_jax.sparse_attention(case.q, kv, case.logical_indices, case.block_table,
                                       case.token_to_req, case.output_gate, implementation=impl)
        assert_fidelity(np.asarray(got), ref, what=impl)


def test_recording_script_reproduces_the_golden_inputs():
    """tools/record_goldens.py builds the stored inputs again: q, the metadata and the gate
    equal the files' bytes, and the cache pages (not stored: rebuilt from the recording's
    seeds) have the SHA-256 the recording wrote into the manifest, with NaN V in every
    unreferenced row and a finite K everywhere (the poison of docs/spec.md §6.5)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "tools" / "record_goldens.py"
    spec = importlib.util.spec_from_file_location("record_goldens", path)
    record = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record)
    from qsa_testing.golden import manifest
    from qsa_testing.golden_cases import sha256

    stored = {c.name: c for c, _ in SPARSE}
    recorded = {m["name"]: m["kv_sha256"] for m in manifest()["sparse_attention"]}
    built = record.sparse_golden_cases()
    assert sorted(c.name for c in built) == sorted(stored)
    for case in built:
        old = stored[case.name]
        for field in ("q", "logical_indices", "block_table", "token_to_req", "output_gate"):
            a, b = getattr(case, field), getattr(old, field)
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=field)
        assert sha256(case.kv_cache) == recorded[case.name], case.name
        used = np.broadcast_to(C.referenced_rows(case)[:, None, :, None], case.kv_cache.shape)
        d = case.head_dim
        assert np.isnan(case.kv_cache[..., d:].astype(np.float32)[~used[..., d:]]).all(), case.name
        assert np.isfinite(case.kv_cache[..., :d].astype(np.float32)).all(), case.name


@pytest.mark.parametrize("case,expected", [(c, e) for c, e in SPARSE if "edge" in c.name
                                           and c.q.shape[0] < 100], ids=lambda x: getattr(x, "name", ""))
def test_new_poison_on_a_golden_keeps_its_output(case, expected):
    """Re-recording with the new poison changes only unreferenced rows: the output is
    bit-identical (what a re-record relies on) and within fidelity of the recorded one. (That
    the two planted stray-read bugs show with it: ``test_a_stray_read_shows_with_the_new_poison``.)"""
    old = _xla(case)
    repoisoned = C.SparseAttentionCase(**{**case.arrays(), "name": case.name,
                                          "use_prefill_config": case.use_prefill_config})
    unref = ~C.referenced_rows(case)
    kv = repoisoned.kv_cache.astype(np.float32)
    fresh = np.random.default_rng(0).standard_normal(kv.shape).astype(np.float32)
    kv[np.isnan(kv)] = fresh[np.isnan(kv)]  # the old files' NaN K/V: finite again
    repoisoned.kv_cache = kv.astype(C.BF16)
    C.poison_unreferenced(repoisoned)
    assert np.isfinite(repoisoned.kv_cache[..., :case.head_dim].astype(np.float32)).all()
    assert unref.any()
    new = _xla(repoisoned)
    np.testing.assert_array_equal(new.view(np.uint16), old.view(np.uint16))
    assert_fidelity(new, expected)


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
