"""The Pallas implementations: interpret mode on CPU, Triton lowering checked without a GPU.

* Interpret-mode runs against the float64 oracle on small realistic cases:
  every split count 1..64 (explicit ``config=``), every degenerate row kind,
  NaN in every unreferenced cache row, fused and split cache layouts.
* The Triton lowering (what runs on the GPU) is produced on CPU by lowering
  for the "cuda" platform with a stand-in sm_90 device description: this
  checks that every kernel lowers, and lets us assert on the HLO around the
  kernel (no copy / transpose / gather of the cache outside it).
* ``@pytest.mark.gpu`` tests run the kernels for real (skipped without a GPU).

Interpret mode is slow: shapes here are tiny (D 16-32, W <= 131).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import qsa_jax
from qsa_jax.config import SparseAttentionConfig
from qsa_testing import cases as C
from qsa_testing import oracle
from qsa_testing.agreement import assert_fidelity


# The Triton lowering warns that it is deprecated upstream (docs/spec.md §8).
pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")


def _run_sparse(case, kv, config=None, launch=None):
    return np.asarray(qsa_jax.sparse_attention(
        case.q, kv, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        use_prefill_config=case.use_prefill_config, config=config, implementation="pallas", launch=launch))


def _oracle(case, cfg):
    k, v = case.split_caches()
    return oracle.sparse_attention_oracle(
        case.q, k, v, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        block_n=cfg.block_n, num_tiles=cfg.num_tiles, num_splits=cfg.num_splits)


def _small_case(seed, rows=6, heads=6, kv_heads=2, d=16, page=16, blocks=8, width=None, edge=True):
    rng = np.random.default_rng(seed)
    case = C.sparse_attention_case(
        rng, rows=rows, num_query_heads=heads, num_kv_heads=kv_heads, head_dim=d, page_size=page,
        selection_blocks=blocks, context_tokens=160, selection_width=width)
    if edge:
        C.add_edge_rows(rng, case)
    return case


# W = 131 with block_n 16 gives 9 tiles; W = 2051 would be too slow to interpret,
# so the large split counts use a narrow block_n on a wide-enough selection.
@pytest.mark.parametrize("splits", list(range(1, 10)) + [16, 64])
def test_every_split_count_against_oracle(splits):
    block_n = 16
    width = max(131, 16 * splits)  # at least one tile per split
    case = _small_case(100 + splits, rows=4, blocks=32, width=width)
    tiles = -(-width // block_n)
    cfg = SparseAttentionConfig(block_n, 4, tiles, splits)
    C.poison_unreferenced(case, cfg)
    got = _run_sparse(case, case.kv_cache, config=tuple(cfg))
    assert_fidelity(got, _oracle(case, cfg), what=f"pallas splits={splits}")


@pytest.mark.parametrize("layout", ["fused", "split"])
@pytest.mark.parametrize("geometry", [(8, 2, 16), (12, 1, 32), (6, 1, 16), (4, 4, 16)])
def test_default_config_edges_and_nan(geometry, layout):
    heads, kv_heads, d = geometry
    case = _small_case(sum(geometry), rows=10, heads=heads, kv_heads=kv_heads, d=d)
    C.poison_unreferenced(case)
    assert np.isnan(case.kv_cache.astype(np.float32)).any()
    kv = case.kv_cache if layout == "fused" else case.split_caches()
    got = _run_sparse(case, kv)
    expected = _oracle(case, case.config())
    assert_fidelity(got, expected, what=f"pallas {geometry} {layout}")
    # Degenerate rows (count <= 0, bad request, all -1) give exact zeros.
    assert (expected == 0).all(axis=(1, 2)).any()


def test_partial_last_tile_and_block_n_64():
    # W not a multiple of block_n: the last tile reads clamped columns past W.
    case = _small_case(7, rows=5, blocks=10, width=45, edge=False)
    cfg = SparseAttentionConfig(64, 2, 1, 1)
    C.poison_unreferenced(case, cfg)
    assert_fidelity(_run_sparse(case, case.kv_cache, config=tuple(cfg)), _oracle(case, cfg))


@pytest.mark.parametrize("block_d", [8, 16, 32])
def test_merge_block_d_is_bit_identical(block_d):
    """The merge's D chunking (more programs at small batches) computes the same thing:
    bit-identical in interpret mode (on the GPU a different block shape may associate
    the sum over splits differently: GPU parity covers that), and every chunk is
    written (the oracle has no zeros where a missed chunk would leave them)."""
    case = _small_case(41, rows=5, heads=6, kv_heads=2, d=32, blocks=16, width=131)
    cfg = (16, 4, 9, 3)
    C.poison_unreferenced(case, SparseAttentionConfig(*cfg))
    outs = [_run_sparse(case, case.kv_cache, config=cfg, launch=qsa_jax.PallasLaunch(merge_block_d=b))
            for b in (32, block_d)]
    np.testing.assert_array_equal(outs[1].view(np.uint16), outs[0].view(np.uint16))
    assert_fidelity(outs[1], _oracle(case, SparseAttentionConfig(*cfg)), what=f"merge block_d={block_d}")


def test_merge_layout_and_real_head_dim():
    from qsa_jax.config import PALLAS_MERGE_LAYOUTS, merge_layout

    assert merge_layout(24, 256, 65, PALLAS_MERGE_LAYOUTS) == (32, 1)  # TP1 decode: 8 programs per (row, head)
    assert merge_layout(64 * 24, 256, 1, PALLAS_MERGE_LAYOUTS) == (256, 2)  # many pairs: D whole
    assert merge_layout(8, 16, 4, PALLAS_MERGE_LAYOUTS) == (16, 2)  # D smaller than the chunk: whole
    # The chunked default path at the real D = 256 against the oracle (2 rows x 4 heads).
    case = _small_case(43, rows=2, heads=4, kv_heads=1, d=256, blocks=12, width=131, edge=False)
    cfg = SparseAttentionConfig(16, 4, 9, 4)
    C.poison_unreferenced(case, cfg)
    assert_fidelity(_run_sparse(case, case.kv_cache, config=tuple(cfg)), _oracle(case, cfg),
                  what="pallas D=256 chunked merge")
    with pytest.raises(ValueError, match="merge_block_d=512 must divide head_dim=256"):
        _run_sparse(case, case.kv_cache, launch=qsa_jax.PallasLaunch(merge_block_d=512))
    with pytest.raises(ValueError, match="merge_block_d must be a power of two"):
        qsa_jax.PallasLaunch(merge_block_d=48)


def test_hopper_launch_table_is_keyed_by_device(monkeypatch):
    """The Hopper launch table (2 warps where the originals use 1) applies on a Hopper GPU
    only, and never over an explicit config."""
    import dataclasses

    from qsa_jax import config as config_module
    from qsa_jax.ops.sparse_attention import base

    case = _small_case(5, rows=3, edge=False)
    args = (case.q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req,
            case.output_gate)
    auto = base.check_sparse_attention_args(*args, use_prefill_config=False, config=None)
    auto = dataclasses.replace(auto, config=auto.config._replace(num_warps=1))
    explicit = base.check_sparse_attention_args(*args, use_prefill_config=False, config=(16, 1, 9, 1))
    warps = lambda p: config_module.pallas_launch(p).num_warps  # noqa: E731
    assert config_module.running_on_hopper() is False  # CPU
    assert warps(auto) == 1
    monkeypatch.setattr(config_module, "running_on_hopper", lambda: True)
    assert warps(auto) == 2
    assert warps(explicit) == 1
    # The caller's launch= wins over the device's choice.
    assert warps(dataclasses.replace(auto, launch=qsa_jax.PallasLaunch(num_warps=4))) == 4


def test_zero_rows():
    case = _small_case(3, rows=0, edge=False)
    assert _run_sparse(case, case.kv_cache).shape == (0, 6, 16)


def test_compress_and_store_against_oracle():
    rng = np.random.default_rng(5)
    for rope in (True, False):
        case = C.compress_case(rng, chunk_lens=[3, 1, 5], head_dim=40, ring=8, with_rope=rope, edge=True)
        a = case.arrays()
        pos32 = a["raw_positions"].astype(np.int32)
        rope32 = None if case.rope_cache is None else case.rope_cache.astype(np.int32)
        got_pooled, got_first = qsa_jax.compress_groups_with_ratio(
            a["raw_keys"], pos32, a["compressor_state_cache"], a["compressor_state_block_table"],
            a["token_to_req"], a["query_start_loc"], a["logical_positions"], a["compressed_slots"],
            case.compress_ratio, rope32, implementation="pallas")
        ref_pooled, ref_first = oracle.compress_groups_oracle(
            a["raw_keys"], a["raw_positions"], a["compressor_state_cache"],
            a["compressor_state_block_table"], a["token_to_req"], a["query_start_loc"],
            a["logical_positions"], a["compressed_slots"], case.compress_ratio, case.rope_cache)
        np.testing.assert_array_equal(np.asarray(got_pooled).astype(np.float64), ref_pooled)
        np.testing.assert_array_equal(np.asarray(got_first).astype(np.int64), ref_first)

    case = C.store_case(rng, n=37, pages=5, page_size=8, width=140, rows_dtype=np.float32)
    expected = oracle.store_cache_rows_oracle(case.cache, case.slot_mapping, case.rows)
    for donate in (False, True):
        got = qsa_jax.store_cache_rows(jnp.asarray(case.cache), case.slot_mapping, case.rows,
                                       donate=donate, implementation="pallas")
        np.testing.assert_array_equal(np.asarray(got).view(np.uint16), expected.view(np.uint16))


# ---------------------------------------------------------------------------------
# The Triton lowering, produced on CPU


@pytest.fixture
def cuda_lowering(monkeypatch):
    """Lower jitted functions for CUDA on this CPU machine (sm_90 stand-in)."""
    from jax._src.pallas.triton import gpu_info, pallas_call_registration

    monkeypatch.setattr(
        pallas_call_registration.gpu_info_lib, "get_gpu_info",
        lambda: gpu_info.GpuInfo(gpu_version=None, arch_name="sm_90", compute_capability=90))
    # Pick the Triton path (not the interpreter) while tracing.
    monkeypatch.setattr("qsa_jax._implementations.backend", lambda: "gpu")

    def lower(fn, *args):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

    return lower


def _sparse_lowered(lower, rows, layout, config=None):
    from qsa_jax.ops.sparse_attention import base, pallas

    nb, hk, p, d, heads, w = 40, 2, 1600, 256, 24, 2051
    q = jax.ShapeDtypeStruct((rows, heads, d), jnp.bfloat16)
    if layout == "fused":
        kv = (jax.ShapeDtypeStruct((nb, hk, p, 2 * d), jnp.bfloat16),)
    else:
        kv = (jax.ShapeDtypeStruct((nb, p, hk, d), jnp.bfloat16),) * 2
    li = jax.ShapeDtypeStruct((rows, w + 1), jnp.int32)
    bt = jax.ShapeDtypeStruct((rows, 41), jnp.int32)
    tr = jax.ShapeDtypeStruct((rows,), jnp.int32)
    problem = base.check_sparse_attention_args(q, kv[0] if len(kv) == 1 else kv, li, bt, tr, q,
                                               use_prefill_config=False, config=config)
    return problem, lower(lambda q, kv, li, bt, tr, g: pallas.run(problem, q, kv, li, bt, tr, g),
                          q, kv, li, bt, tr, q)


@pytest.mark.parametrize("layout", ["fused", "split"])
@pytest.mark.parametrize("rows", [1, 64, 2048])
def test_triton_lowering_touches_cache_only_in_kernel(cuda_lowering, rows, layout):
    problem, hlo = _sparse_lowered(cuda_lowering, rows, layout)
    calls = re.findall(r"custom_call @__gpu\$xla\.gpu\.triton\(([^)]*)\)", hlo)
    assert len(calls) == (1 if problem.config.num_splits == 1 else 2), calls
    cache_type = "tensor<40x2x1600x512xbf16>" if layout == "fused" else "tensor<40x1600x2x256xbf16>"
    row_type = "tensor<128000x512xbf16>" if layout == "fused" else "tensor<128000x256xbf16>"
    # Every op that consumes a cache-sized value: only free reshapes to the
    # row view, and the kernel itself. No transpose, copy, gather, slice, pad.
    cache_ops = [line for line in hlo.splitlines() if cache_type in line or row_type in line]
    assert any("__gpu$xla.gpu.triton" in line for line in cache_ops), hlo[:2000]
    for line in cache_ops:
        if "func.func" in line:
            continue
        assert ("stablehlo.reshape" in line or "__gpu$xla.gpu.triton" in line), line
        for banned in ("transpose", "gather", "copy", "slice", "pad", "concatenate", "select"):
            assert f"stablehlo.{banned}" not in line, line
    # The one-split path writes the bf16 output from the kernel (no merge).
    if problem.config.num_splits == 1:
        assert "tensor<" + f"{rows * 24}x256xbf16>" in hlo.split("__gpu$xla.gpu.triton")[1].split("\n")[0]


def test_triton_lowering_compress_and_store(cuda_lowering):
    from qsa_jax.ops.compress_groups import base as cbase, pallas as cpallas
    from qsa_jax.ops.store_cache_rows import base as sbase, pallas as spallas

    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
    bf = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)  # noqa: E731
    args = (bf(64, 1, 128), i32(64, 1, 3), bf(10, 4, 1, 128), i32(8, 1), i32(64), i32(9), i32(64), i32(64))
    for rope in (i32(10, 4, 1, 3), None):
        problem = cbase.check_compress_args(*args, 4, rope)
        if rope is None:
            hlo = cuda_lowering(lambda *a: cpallas.run(problem, *a, None), *args)
        else:
            hlo = cuda_lowering(lambda *a: cpallas.run(problem, *a), *args, rope)
        assert "__gpu$xla.gpu.triton" in hlo
    cache, slots, rows = bf(100, 64, 1, 140), i32(300), bf(300, 140)
    problem = sbase.check_store_args(cache, slots, rows)
    hlo = cuda_lowering(lambda c, s, r: spallas.run(problem, c, s, r), cache, slots, rows)
    assert "__gpu$xla.gpu.triton" in hlo and "output_operand_alias" in hlo


# ---------------------------------------------------------------------------------
# On a GPU


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 7, 64, 600])
def test_gpu_pallas_matches_xla(rows):
    """Real Triton kernels vs the XLA reference (same arithmetic) at D=256."""
    case = C.gpu_kernel_case(rows, num_query_heads=24, num_kv_heads=2)
    for kv in (case.kv_cache, case.split_caches()):
        args = (case.q, kv, case.logical_indices, case.block_table, case.token_to_req, case.output_gate)
        got = np.asarray(qsa_jax.sparse_attention(*args, implementation="pallas"))
        want = np.asarray(qsa_jax.sparse_attention(*args, implementation="xla"))
        assert_fidelity(got, want, what=f"gpu pallas rows={rows}")


def test_cache_past_int32_elements_is_addressed_in_64_bits(cuda_lowering, monkeypatch, capsys):
    """A real KV cache is tens of GB: K/V addresses must be computed in 64 bits.

    The Triton IR that Pallas emits (``debug=True``) for a cache of more than
    2**31 elements must gather K and V through i64 offsets.
    """
    import jax._src.pallas.pallas_call as pallas_call_module

    from qsa_jax.ops.sparse_attention import base, pallas

    original = pallas_call_module.pallas_call
    monkeypatch.setattr(pallas.pl, "pallas_call", lambda *a, **k: original(*a, **{**k, "debug": True}))
    nb, hk, p, d, heads, w, rows = 2000, 2, 1600, 256, 24, 2051, 2048
    assert nb * hk * p * 2 * d > 2**31
    q = jax.ShapeDtypeStruct((rows, heads, d), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((nb, hk, p, 2 * d), jnp.bfloat16)
    li = jax.ShapeDtypeStruct((rows, w + 1), jnp.int32)
    bt = jax.ShapeDtypeStruct((rows, 41), jnp.int32)
    tr = jax.ShapeDtypeStruct((rows,), jnp.int32)
    problem = base.check_sparse_attention_args(q, kv, li, bt, tr, q, use_prefill_config=False, config=None)
    capsys.readouterr()
    cuda_lowering(lambda *a: pallas.run(problem, *a), q, (kv,), li, bt, tr, q)
    ttir = capsys.readouterr().out
    kv_loads = [line for line in ttir.splitlines()
                if "tt.addptr" in line and "x!tt.ptr<bf16>>" in line and "masked_load" in line]
    assert len(kv_loads) == 2, kv_loads  # one K gather, one V gather per tile
    for line in kv_loads:
        assert re.search(r"tensor<\d+x\d+xi64>", line), line


@pytest.mark.gpu
def test_gpu_hopper_detection_matches_the_card():
    """The Hopper launch tables key on compute capability 9.x: on an H100/H200 they must apply."""
    from qsa_jax.config import running_on_hopper

    kind = jax.devices()[0].device_kind
    assert running_on_hopper() == any(name in kind for name in ("H100", "H200", "H800", "H20")), kind
