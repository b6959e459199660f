"""sparse_attention (XLA reference) against the float64 oracle, plus argument checking."""

from __future__ import annotations

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import qsa_jax
from qsa_jax.config import SparseAttentionConfig
from qsa_testing import cases as C
from qsa_testing import oracle
from qsa_testing.agreement import assert_fidelity


def _oracle(case, cfg):
    k, v = case.split_caches()
    return oracle.sparse_attention_oracle(
        case.q, k, v, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        block_n=cfg.block_n, num_tiles=cfg.num_tiles, num_splits=cfg.num_splits)


def _run(case, cfg=None, impl="xla", layout="fused"):
    kv = case.kv_cache if layout == "fused" else case.split_caches()
    return np.asarray(qsa_jax.sparse_attention(
        case.q, kv, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        use_prefill_config=case.use_prefill_config, config=cfg, implementation=impl))


@st.composite
def metadata_cases(draw):
    """Random geometry and adversarial metadata, NaN in every unreferenced cache row."""
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    hk = draw(st.sampled_from([1, 2]))
    g = draw(st.sampled_from([1, 3, 4]))
    d = 16
    p = draw(st.sampled_from([4, 8]))
    nb = draw(st.integers(1, 6))
    nr = draw(st.integers(1, 3))
    btw = draw(st.integers(1, 4))
    rows = draw(st.integers(0, 6))
    w = draw(st.integers(1, 70))
    bn = draw(st.sampled_from([16, 32]))
    tiles = -(-w // bn)
    splits = draw(st.integers(1, tiles))
    # Tokens: mostly valid, some -1, some past the block table.
    tokens = rng.integers(-1, btw * p + 2 * p, (rows, w)).astype(np.int32)
    counts = rng.integers(-3, w + 10, rows).astype(np.int32)
    indices = np.concatenate([tokens, counts[:, None]], axis=1) if rows else np.zeros((0, w + 1), np.int32)
    case = C.SparseAttentionCase(
        name=f"hyp{seed}",
        q=C.bf16_random(rng, (rows, hk * g, d)),
        kv_cache=C.bf16_random(rng, (nb, hk, p, 2 * d)),
        logical_indices=indices,
        block_table=rng.integers(-2, nb + 2, (nr, btw)).astype(np.int32),
        token_to_req=rng.integers(-1, nr + 1, rows).astype(np.int32),
        output_gate=C.bf16_random(rng, (rows, hk * g, d), 2.0),
    )
    cfg = SparseAttentionConfig(bn, 1, tiles, splits)
    C.poison_unreferenced(case, cfg)
    return case, cfg


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(metadata_cases(), st.sampled_from(["fused", "split"]))
def test_xla_matches_oracle_on_random_metadata(case_cfg, layout):
    case, cfg = case_cfg
    got = _run(case, cfg, layout=layout)
    assert_fidelity(got, _oracle(case, cfg), what=case.name)


@pytest.mark.parametrize("splits", [1, 2, 3, 5, 8, 16, 33, 64, 65])
def test_every_split_count_matches_oracle(splits):
    rng = np.random.default_rng(splits)
    case = C.sparse_attention_case(rng, rows=3, num_query_heads=8, num_kv_heads=2, head_dim=32,
                                   page_size=16, selection_blocks=512, context_tokens=2200,
                                   num_requests=2)
    C.poison_unreferenced(case)
    cfg = SparseAttentionConfig(32, 4, 65, splits)
    assert_fidelity(_run(case, cfg), _oracle(case, cfg), what=f"splits={splits}")


def test_edge_rows_are_zero_and_finite():
    rng = np.random.default_rng(3)
    case = C.sparse_attention_case(rng, rows=20, num_query_heads=4, num_kv_heads=2, head_dim=16,
                                   page_size=8, selection_blocks=8, context_tokens=60, num_requests=3)
    C.add_edge_rows(rng, case)
    C.poison_unreferenced(case)
    got = _run(case)
    ref = _oracle(case, case.config())
    assert_fidelity(got, ref)
    # Rows with no valid entry (count <= 0, all -1, invalid request) are exactly zero.
    empty = np.all(ref.reshape(20, -1) == 0, axis=1)
    assert empty.sum() >= 6
    assert np.all(got.reshape(20, -1)[empty] == 0)


def test_works_under_user_jit_and_vmap_free_shapes():
    rng = np.random.default_rng(5)
    case = C.sparse_attention_case(rng, rows=4, num_query_heads=4, num_kv_heads=2, head_dim=16,
                                   page_size=8, selection_blocks=8, context_tokens=60)
    f = jax.jit(lambda *a: qsa_jax.sparse_attention(*a, implementation="xla"))
    got = f(case.q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req, case.output_gate)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), _run(case).view(np.uint16))


@pytest.mark.skipif(qsa_jax._implementations.backend() == "gpu", reason="CPU behaviour (a GPU's default is pallas)")
def test_default_implementation_on_cpu_is_xla():
    assert qsa_jax._implementations.REGISTRIES["sparse_attention"].choose(None) == "xla"


# --- argument checking: every problem is named before anything runs -----------------

def _good():
    rng = np.random.default_rng(0)
    case = C.sparse_attention_case(rng, rows=2, num_query_heads=4, num_kv_heads=2, head_dim=16,
                                   page_size=8, selection_blocks=4, context_tokens=40)
    return dict(q=case.q, kv=case.kv_cache, logical_indices=case.logical_indices,
                block_table=case.block_table, token_to_req=case.token_to_req,
                output_gate=case.output_gate)


BAD = [
    ("q", lambda a: a["q"][0], ValueError, "q must be"),
    ("kv", lambda a: a["kv"][0], ValueError, "kv_cache must be"),
    ("kv", lambda a: (a["kv"], a["kv"], a["kv"]), ValueError, "pair"),
    ("kv", lambda a: a["kv"].astype(np.float32), TypeError, "bfloat16"),
    ("kv", lambda a: a["kv"][:0], ValueError, "nonempty"),
    ("q", lambda a: a["q"][:, :3], ValueError, "multiple"),
    ("q", lambda a: a["q"].astype(np.float32), TypeError, "q must be bfloat16"),
    ("logical_indices", lambda a: a["logical_indices"][:1], ValueError, "logical_indices"),
    ("logical_indices", lambda a: a["logical_indices"][:, :1], ValueError, "count column"),
    ("logical_indices", lambda a: a["logical_indices"].astype(np.int64), TypeError, "logical_indices must be int32"),
    ("block_table", lambda a: a["block_table"][0], ValueError, "block_table"),
    ("block_table", lambda a: a["block_table"][:, :0], ValueError, "block_table"),
    ("token_to_req", lambda a: a["token_to_req"][:1], ValueError, "token_to_req"),
    ("output_gate", lambda a: a["output_gate"][:, :2], ValueError, "output_gate"),
    ("output_gate", lambda a: a["output_gate"].astype(np.float64), TypeError, "output_gate must be bfloat16, "),
    ("output_gate", lambda a: a["output_gate"].astype(np.int32), TypeError, "output_gate"),
    ("output_gate", lambda a: a["output_gate"][:, :, :8], ValueError, "output_gate must have q's shape"),
    # not arrays: named before any shape check (a list once recursed in the memo's key)
    ("token_to_req", lambda a: a["token_to_req"].tolist(), TypeError, "token_to_req must be an array"),
    ("kv", lambda a: (a["kv"], None), TypeError, "v_cache must be an array"),
    ("q", lambda a: 1.0, TypeError, "q must be an array"),
]


@pytest.mark.parametrize("arg,mutate,exc,msg", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_arguments_raise_named_errors(arg, mutate, exc, msg):
    args = _good()
    args[arg] = mutate(args)
    with pytest.raises(exc, match=msg):
        qsa_jax.sparse_attention(**args)


def test_head_dim_must_be_power_of_two():
    rng = np.random.default_rng(0)
    q = C.bf16_random(rng, (1, 2, 24))
    kv = C.bf16_random(rng, (2, 1, 4, 48))
    with pytest.raises(ValueError, match="power of two"):
        qsa_jax.sparse_attention(q, kv, np.zeros((1, 3), np.int32), np.zeros((1, 1), np.int32),
                                 np.zeros(1, np.int32), q)


@pytest.mark.parametrize("cfg,msg", [((24, 1, 2, 1), "block_n"), ((32, 1, 2, 3), "num_splits"),
                                     ((32, 1, 0, 1), "num_tiles"), ((32, 3, 2, 1), "num_warps"),
                                     ((32, 0, 2, 1), "num_warps"), ((32, 4), "four ints"),
                                     ("vllm-0.31", "config must be a tiling")])
def test_bad_explicit_config(cfg, msg):
    with pytest.raises(ValueError, match=msg):
        qsa_jax.sparse_attention(**_good(), config=cfg)


@pytest.mark.parametrize("implementation", ["xla", "pallas"])
def test_explicit_config_must_cover_the_selection(implementation):
    """num_tiles >= ceil(W / block_n): one tile fewer used to drop the last columns' tokens
    without a word (a review found outputs 0.56 apart); more only add empty tiles."""
    args = _good()
    width = args["logical_indices"].shape[1] - 1
    tiles = -(-width // 16)
    assert tiles >= 2, "the case must need more than one tile"
    want = qsa_jax.sparse_attention(**args, implementation="xla")
    for more in (0, 1):
        got = qsa_jax.sparse_attention(**args, config=(16, 1, tiles + more, 1), implementation=implementation)
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    with pytest.raises(ValueError, match=rf"num_tiles must be >= ceil\(W / block_n\) .* = {tiles}, .*; got "
                                         rf"{tiles - 1}"):
        qsa_jax.sparse_attention(**args, config=(16, 1, tiles - 1, 1), implementation=implementation)


def test_available_implementations_names_the_operators():
    with pytest.raises(ValueError, match="op must be one of"):
        qsa_jax.available_implementations("sparse")


def test_unknown_or_unavailable_implementation():
    with pytest.raises(ValueError, match="implementation must be one of"):
        qsa_jax.sparse_attention(**_good(), implementation="cuda")
    if "triton" not in qsa_jax.available_implementations("sparse_attention"):
        with pytest.raises(NotImplementedError, match="triton"):
            qsa_jax.sparse_attention(**_good(), implementation="triton")


def test_empty_batch_returns_empty():
    args = _good()
    args["q"], args["output_gate"] = args["q"][:0], args["output_gate"][:0]
    args["logical_indices"], args["token_to_req"] = args["logical_indices"][:0], args["token_to_req"][:0]
    out = qsa_jax.sparse_attention(**args)
    assert out.shape == (0, 4, 16) and out.dtype == jnp.bfloat16


@pytest.mark.parametrize("shape", ["R,1,HD", "R,D,H", "R,H,D,1"])
def test_gate_views_read_as_vllms_view_as(shape):
    """vLLM reads output_gate with view_as(q): any [R, ...] shape of R·H·D elements, row-major
    (a review found a stricter check refused what the originals accept)."""
    args = _good()
    r, h, d = args["q"].shape
    flat = args["output_gate"].reshape(r, h * d)
    view = flat.reshape({"R,1,HD": (r, 1, h * d), "R,D,H": (r, d, h), "R,H,D,1": (r, h, d, 1)}[shape])
    want = qsa_jax.sparse_attention(**args, implementation="xla")
    got = qsa_jax.sparse_attention(**{**args, "output_gate": view}, implementation="xla")
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
