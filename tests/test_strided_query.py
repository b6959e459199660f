"""q read in place from a wider array (``StridedQuery``), and the Pallas prefetch knob.

A ``StridedQuery`` must give exactly (bit for bit) the result of the compact q
it describes, with every other element of its table NaN, so any read outside
q's rows shows up in the output. The Pallas prefetch variant (next tile's
metadata loaded early) must be bit-identical to the plain loop.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import qsa_jax
from qsa_jax import StridedQuery
from qsa_jax.config import PallasLaunch, SparseAttentionConfig
from qsa_testing import cases as C

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")


def _case(seed, rows=7, heads=8, kv_heads=2, d=16, width=None):
    rng = np.random.default_rng(seed)
    case = C.sparse_attention_case(rng, rows=rows, num_query_heads=heads, num_kv_heads=kv_heads,
                                   head_dim=d, page_size=16, selection_blocks=8, context_tokens=160,
                                   selection_width=width)
    C.add_edge_rows(rng, case)
    C.poison_unreferenced(case)
    return case


def _attention(case, q, implementation, config=None):
    return np.asarray(qsa_jax.sparse_attention(
        q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req,
        case.output_gate, config=config, implementation=implementation))


def _bits(x):
    return np.asarray(x).view(np.uint16)


def _strided_views(case):
    """(name, StridedQuery) pairs describing ``case.q`` inside NaN-filled tables."""
    rows, heads, d = case.q.shape
    hk = case.kv_cache.shape[1]
    qkv, start = C.qkv_with_query(case.q, hk)
    shifted, shifted_start = C.qkv_with_query(case.q, hk, leading_heads=3)
    # Head stride 2: q interleaved with another [R, H, D] tensor (e.g. a q/gate chunk).
    inter = np.full((rows, heads, 2, d), C.BF16_NAN_BITS, np.uint16)
    inter[:, :, 0] = case.q.view(np.uint16)
    inter = inter.view(C.BF16).reshape(rows * heads * 2, d)
    return [
        ("qkv", StridedQuery.from_columns(qkv, start=start, num_heads=heads, head_dim=d)),
        ("qkv_offset", StridedQuery.from_columns(shifted, start=shifted_start, num_heads=heads, head_dim=d)),
        ("head_stride_2", StridedQuery(inter, rows, heads, row_stride=2 * heads, head_stride=2)),
    ]


@pytest.mark.parametrize("implementation", ["xla", "pallas"])
def test_strided_query_is_bit_identical_to_compact(implementation):
    case = _case(1)
    want = _attention(case, case.q, implementation)
    assert not np.isnan(want.astype(np.float32)).any()
    for name, view in _strided_views(case):
        got = _attention(case, view, implementation)
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"{implementation} {name}")


def test_strided_query_with_several_splits_pallas():
    case = _case(2, rows=3, width=131)
    cfg = (16, 4, 9, 4)
    want = _attention(case, case.q, "pallas", cfg)
    _, view = _strided_views(case)[1]
    np.testing.assert_array_equal(_bits(_attention(case, view, "pallas", cfg)), _bits(want))
    # and the reference agrees with the kernel on the same strided input
    ref = _attention(case, view, "xla", cfg)
    from qsa_testing.agreement import assert_fidelity
    assert_fidelity(_attention(case, view, "pallas", cfg), ref, what="strided q, 4 splits")


def test_strided_query_validation():
    case = _case(3, rows=2)
    rows, heads, d = case.q.shape
    qkv, start = C.qkv_with_query(case.q, 2)
    args = (case.kv_cache, case.logical_indices, case.block_table, case.token_to_req, case.output_gate)
    with pytest.raises(ValueError, match="multiples of head_dim"):
        StridedQuery.from_columns(qkv, start=start + 1, num_heads=heads, head_dim=d)
    table = qkv.reshape(-1, d)
    with pytest.raises(ValueError, match="addresses table row"):
        qsa_jax.sparse_attention(StridedQuery(table, rows, heads, row_stride=table.shape[0]), *args)
    with pytest.raises(ValueError, match="non-negative int"):
        qsa_jax.sparse_attention(StridedQuery(table, rows, heads, row_stride=-1), *args)
    with pytest.raises(ValueError, match=r"\[N, head_dim=16\]"):
        qsa_jax.sparse_attention(StridedQuery(qkv, rows, heads, row_stride=1), *args)
    with pytest.raises(TypeError, match="q must be bfloat16"):
        qsa_jax.sparse_attention(StridedQuery(table.astype(np.float32), rows, heads, row_stride=12), *args)
    # A StridedQuery's row count must match the metadata like a compact q's.
    with pytest.raises(ValueError, match="logical_indices"):
        qsa_jax.sparse_attention(StridedQuery(table, rows - 1, heads, row_stride=12), *args)


def test_strided_query_through_jit_recompiles_per_layout():
    case = _case(4, rows=3)
    rows, heads, d = case.q.shape
    qkv, start = C.qkv_with_query(case.q, 2)
    fn = jax.jit(lambda q: qsa_jax.sparse_attention(
        q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        implementation="xla"))
    a = fn(StridedQuery.from_columns(qkv, start=start, num_heads=heads, head_dim=d))
    b = fn(jnp.asarray(case.q))
    np.testing.assert_array_equal(_bits(a), _bits(b))


# ---------------------------------------------------------------------------------
# Pallas prefetch: no numeric effect


@pytest.mark.parametrize("cfg", [(16, 4, 9, 2), (16, 4, 9, 3), (16, 4, 9, 1), (16, 4, 9, 9)])
def test_pallas_prefetch_is_bit_identical(cfg):
    case = _case(10 + cfg[3], rows=5, width=131)
    C.poison_unreferenced(case, SparseAttentionConfig(*cfg))
    outs = [np.asarray(qsa_jax.sparse_attention(
        case.q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        config=cfg, implementation="pallas", launch=qsa_jax.PallasLaunch(prefetch=prefetch)))
        for prefetch in (False, True)]
    assert not np.isnan(outs[0].astype(np.float32)).any()
    np.testing.assert_array_equal(_bits(outs[1]), _bits(outs[0]))
    want = _attention(case, case.q, "xla", cfg)
    from qsa_testing.agreement import assert_fidelity
    assert_fidelity(outs[1], want, what=f"prefetch {cfg}")


# ---------------------------------------------------------------------------------
# Triton lowering on CPU (what runs on the GPU)


def test_lowering_reads_strided_q_in_place(monkeypatch):
    """The whole qkv table goes into the kernel: no slice/copy/gather of it in the HLO."""
    from jax._src.pallas.triton import gpu_info, pallas_call_registration

    from qsa_jax.ops.sparse_attention import base, pallas

    monkeypatch.setattr(pallas_call_registration.gpu_info_lib, "get_gpu_info",
                        lambda: gpu_info.GpuInfo(gpu_version=None, arch_name="sm_90", compute_capability=90))
    monkeypatch.setattr("qsa_jax._implementations.backend", lambda: "gpu")
    rows, heads, hk, d, w = 4, 32, 4, 256, 2051
    table = jax.ShapeDtypeStruct((rows * (heads + 2 * hk), d), jnp.bfloat16)
    q = StridedQuery(table, rows, heads, row_stride=heads + 2 * hk)
    kv = jax.ShapeDtypeStruct((40, hk, 64, 2 * d), jnp.bfloat16)
    li = jax.ShapeDtypeStruct((rows, w + 1), jnp.int32)
    bt = jax.ShapeDtypeStruct((rows, 1025), jnp.int32)
    tr = jax.ShapeDtypeStruct((rows,), jnp.int32)
    gate = jax.ShapeDtypeStruct((rows, heads, d), jnp.bfloat16)
    problem = base.check_sparse_attention_args(q, kv, li, bt, tr, gate, use_prefill_config=False, config=None)
    assert problem.q_layout == base.QueryLayout(heads + 2 * hk, 1, 0)
    for prefetch in (False, True):
        with_launch = dataclasses.replace(problem, launch=PallasLaunch(prefetch=prefetch))
        hlo = jax.jit(functools.partial(pallas.run, with_launch)).trace(
            table, (kv,), li, bt, tr, gate).lower(lowering_platforms=("cuda",)).as_text()
        table_type = f"tensor<{rows * (heads + 2 * hk)}x{d}xbf16>"
        uses = [line for line in hlo.splitlines() if table_type in line and "func.func" not in line]
        assert uses and all("__gpu$xla.gpu.triton" in line for line in uses), uses
        assert len(re.findall(r"__gpu\$xla\.gpu\.triton", hlo)) == 2  # split kernel + merge


# ---------------------------------------------------------------------------------
# On a GPU


@pytest.mark.gpu
@pytest.mark.parametrize("implementation", ["pallas", "triton"])
@pytest.mark.parametrize("rows", [1, 64, 600])
def test_gpu_strided_query_is_bit_identical(implementation, rows):
    if implementation not in qsa_jax.available_implementations("sparse_attention"):
        pytest.skip(f"{implementation} is not available here")
    case = C.gpu_kernel_case(rows, num_query_heads=32, num_kv_heads=4)
    qkv, start = C.qkv_with_query(case.q, 4)
    view = StridedQuery.from_columns(jnp.asarray(qkv), start=start, num_heads=32, head_dim=256)
    want = _attention(case, case.q, implementation)
    got = _attention(case, view, implementation)
    assert not np.isnan(want.astype(np.float32)).any()
    np.testing.assert_array_equal(_bits(got), _bits(want))
