"""qsa_jax/ops/_relaxed_atomics.py on CPU: the relaxed atomic add reaches the Triton IR
lowered for sm_90 with relaxed order, next to Pallas's own (acquire-release) one, and the
gradient's backward kernel uses it by default. Fails when a JAX upgrade changes the private
lowering this rests on (the module then raises, or the IR shows another order)."""

from __future__ import annotations

import os
import re
import sys
import types

import pytest

import jax
import jax.numpy as jnp

registration = pytest.importorskip("jax._src.pallas.triton.pallas_call_registration")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
from sm90_ptx_fp8 import captured_triton_ir  # noqa: E402


@pytest.fixture
def triton_ir(monkeypatch):
    """Lower Pallas for "cuda" as on an sm_90 GPU; the list fills with each kernel's Triton IR."""
    monkeypatch.setattr(registration.gpu_info_lib, "get_gpu_info",
                        lambda: types.SimpleNamespace(compute_capability=90))
    with captured_triton_ir() as captured:
        yield captured


def _atomics(ttir: str) -> list[tuple[str, str]]:
    return re.findall(r"tt\.atomic_rmw (\w+), (\w+), (?:\w+),", ttir)


def test_relaxed_atomic_add_lowers_with_relaxed_order(triton_ir):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    from qsa_jax.ops._relaxed_atomics import relaxed_atomic_add

    def kernel(x_ref, idx_ref, _acc_in, acc_ref):
        rows, cols = idx_ref[...][:, None], jnp.arange(16)[None, :]
        mask = jnp.broadcast_to(rows >= 0, (16, 16))
        relaxed_atomic_add(acc_ref, (rows, cols), x_ref[...], mask=mask)
        plgpu.atomic_add(acc_ref, (rows, cols), x_ref[...], mask=mask)  # untouched: acq_rel

    def f(x, idx, acc):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((64, 16), jnp.float32), grid=(1,),
                              in_specs=[pl.no_block_spec] * 3, out_specs=pl.no_block_spec,
                              input_output_aliases={2: 0},
                              compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1))(x, idx, acc)

    sds = jax.ShapeDtypeStruct
    jax.jit(f).trace(sds((16, 16), jnp.float32), sds((16,), jnp.int32),
                     sds((64, 16), jnp.float32)).lower(lowering_platforms=("cuda",))
    (ttir,) = triton_ir
    assert _atomics(ttir) == [("fadd", "relaxed"), ("fadd", "acq_rel")]


@pytest.mark.parametrize("order", ["selection", None])
@pytest.mark.parametrize("relaxed", [True, False])
def test_backward_kernel_atomics_follow_the_switch(triton_ir, monkeypatch, relaxed, order):
    """pallas_backward's fp32 atomics: relaxed by default, Pallas's acq_rel with
    relaxed_atomics=False (the benchmark's A/B). The selection walk has dK, dV and the
    split-K dq in one kernel; the default (inverted) walk, two kernels, adds atomically
    only in its split-K dq walk."""
    from qsa_jax.ops.sparse_attention import backward_pallas
    from qsa_jax.ops.sparse_attention.base import check_sparse_attention_args
    from qsa_testing import cases as C
    import numpy as np

    monkeypatch.setattr(backward_pallas, "interpret", lambda: False)
    case = C.sparse_attention_case(np.random.default_rng(1), rows=2, num_query_heads=4, num_kv_heads=2,
                                   head_dim=32, page_size=16, selection_blocks=8, context_tokens=64,
                                   num_requests=2, make_cache=False)
    sds = jax.ShapeDtypeStruct
    q = sds(case.q.shape, jnp.bfloat16)
    kv = sds(case.kv_shape, jnp.bfloat16)
    li, bt, tr = (jnp.asarray(x) for x in (case.logical_indices, case.block_table, case.token_to_req))
    problem = check_sparse_attention_args(q, kv, li, bt, tr, q, use_prefill_config=False, config=None)
    rows, heads, d = case.q.shape
    assert backward_pallas.resolve_order(problem, order) == (order or "inverted")

    def backward(q, kv, g, att, lse, ct):
        return backward_pallas.pallas_backward(problem, q, (kv,), li, bt, tr, g, att, lse, ct,
                                               num_splits=2, relaxed_atomics=relaxed, order=order)

    jax.jit(backward).trace(q, kv, q, q, sds((rows, heads), jnp.float32), q).lower(
        lowering_platforms=("cuda",))
    kernels = [t for t in triton_ir if "qsa_sparse_attention_backward" in t]
    assert len(kernels) == (1 if order == "selection" else 2), len(kernels)
    found = [a for ttir in kernels for a in _atomics(ttir)]
    assert len(found) >= (3 if order == "selection" else 1), found  # dK, dV and the split-K dq
    assert set(found) == {("fadd", "relaxed" if relaxed else "acq_rel")}, found
