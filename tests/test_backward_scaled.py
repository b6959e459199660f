"""Gradients through vLLM 0.34's arithmetic (k/v scales, fp8 caches) on CPU.

The function differentiated is the exact one of backward.py with the scale operand: scores
D^-0.5 k_scale q.K, attention v_scale sum p V, K and V the cache's decoded e4m3 values. The
reference is its float64 gradient (``backward.exact_forward`` with the scale pair, by JAX's
autodiff, itself checked against the hand-written float64 backward and finite differences).
Bars: qsa_testing/gradients.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import qsa_jax
from qsa_jax.ops.sparse_attention import backward as B
from qsa_jax.ops.sparse_attention.base import LOG2_E, check_sparse_attention_args
from qsa_testing import cases as C
from qsa_testing.gradients import (
    BF16_BAR, E4M3_KV_BAR, SCALED_BF16_BAR, relative_error, scale_error_over_floor)

E4M3 = ml_dtypes.float8_e4m3fn
K_SCALE, V_SCALE = 0.5, 2.0
IMPLS = ("xla", "pallas")  # pallas: interpret mode on CPU


def _case(seed, page=16, rows=4, requests=2):
    rng = np.random.default_rng(seed)
    case = C.sparse_attention_case(rng, rows=rows, num_query_heads=12, num_kv_heads=2, head_dim=32,
                                   page_size=page, selection_blocks=12 * 8 // page, context_tokens=64,
                                   num_requests=requests)
    C.add_edge_rows(rng, case)
    return case, rng


def _fp8_cache(case, poison=True):
    """The case's cache in e4m3 (spread x3 over the format's range); with ``poison`` every row
    no consumed valid entry reads holds 448 in K and the NaN code in V."""
    kv = (np.asarray(case.kv_cache, np.float32) * 3).astype(E4M3)
    if poison:
        bits = kv.view(np.uint8)
        stray = np.broadcast_to(~C.referenced_rows(case)[:, None, :], kv.shape[:3])  # [NB, Hk, P]
        d = case.head_dim
        bits[..., :d][stray] = 0x7E
        bits[..., d:][stray] = 0x7F
    return kv


def _layout(kv, layout):
    if layout == "fused":
        return kv
    d = kv.shape[-1] // 2
    t = kv.transpose(0, 2, 1, 3)
    return np.ascontiguousarray(t[..., :d]), np.ascontiguousarray(t[..., d:])


def _meta(case):
    return tuple(jnp.asarray(a) for a in (case.logical_indices, case.block_table, case.token_to_req))


def _multiplier(d, k_scale):
    """The score multiplier a traced k_scale gives (base.scale_operand), in float64."""
    return float(np.float32(np.float32(d ** -0.5) * np.float32(k_scale)) * np.float32(LOG2_E))


def _grads(case, kv, impl, ct, k_scale=K_SCALE, v_scale=V_SCALE):
    """(out, cotangents of q, kv, gate, k_scale, v_scale) through the public API, the scales
    traced (so that they have cotangents)."""
    li, bt, tr = _meta(case)
    kv = jax.tree.map(jnp.asarray, kv)

    def f(q, kv, g, ks, vs):
        return qsa_jax.sparse_attention(q, kv, li, bt, tr, g, implementation=impl, k_scale=ks, v_scale=vs)

    out, pull = jax.vjp(f, jnp.asarray(case.q), kv, jnp.asarray(case.output_gate), jnp.float32(k_scale),
                        jnp.float32(v_scale))
    return out, pull(jnp.asarray(ct))


def _exact(case, kv, ct, k_scale=K_SCALE, v_scale=V_SCALE, fp8=True):
    """float64 (dq, dkv arrays, dgate, d k_scale, d v_scale, |terms| of each scale's sum) of
    the exact function at the decoded cache (poison, unreferenced, read as 0)."""
    kv_arrays = kv if isinstance(kv, tuple) else (kv,)
    li, bt, tr = _meta(case)
    # The oracle reads decoded values (float64): its problem is the bf16 one of the same shapes
    # and tiling.
    as_bf16 = tuple(np.asarray(a, np.float32).astype(ml_dtypes.bfloat16) for a in kv_arrays)
    p = check_sparse_attention_args(case.q, as_bf16 if len(as_bf16) == 2 else as_bf16[0], *li_bt_tr(case),
                                    case.output_gate, use_prefill_config=False, config=None,
                                    scales_given=(True, True))
    assert p.config == check_sparse_attention_args(
        case.q, kv, *li_bt_tr(case), case.output_gate, use_prefill_config=False, config=None,
        scales_given=(True, True)).config
    d = case.head_dim
    m = _multiplier(d, k_scale) if fp8 else _multiplier(d, 1.0)
    v = v_scale if fp8 else 1.0
    with jax.enable_x64(True):
        f64 = lambda x: jnp.asarray(np.nan_to_num(np.asarray(x, np.float64)))  # noqa: E731
        c = f64(ct)

        def loss(q, kv_arrays, g, mv):
            return jnp.sum(B.exact_forward(p, q, kv_arrays, li, bt, tr, g, mv)[0] * c)

        q, g = f64(case.q), f64(case.output_gate)
        mv = jnp.asarray([m, v], jnp.float64)
        dq, dkv, dg, dmv = jax.grad(loss, (0, 1, 2, 3))(q, tuple(f64(a) for a in kv_arrays), g, mv)
        out, attention, _ = B.exact_forward(p, q, tuple(f64(a) for a in kv_arrays), li, bt, tr, g, mv)
        # The scale cotangents are sums over (row, head, dim) of q.dq / m and of dA.A / v:
        # their terms' magnitudes bound the error a sum of rounded terms can have.
        rows = q.reshape(-1, d)[B.q_rows(p)]
        terms_m = float(jnp.sum(jnp.abs(rows * dq))) / m
        terms_v = float(jnp.sum(jnp.abs(out * c))) / v
        dm, dv = (float(x) for x in dmv)
    dks = dm * m / k_scale if fp8 else 0.0  # d multiplier / d k_scale = multiplier / k_scale
    return (np.asarray(dq), tuple(np.asarray(x) for x in dkv), np.asarray(dg), dks, dv,
            terms_m * m / k_scale, terms_v)


def li_bt_tr(case):
    return case.logical_indices, case.block_table, case.token_to_req


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt", ["e4m3", "bytes"])
@pytest.mark.parametrize("layout,page", [("fused", 16), ("split", 16), ("fused", 8)],
                         ids=["fused-inverted", "split-inverted", "fused-selection"])
def test_fp8_gradients_against_float64(impl, fmt, layout, page):
    """Every cotangent against the float64 gradient: q and the gate over the bf16 floor, an
    e4m3 cache over the e4m3 floor (its cotangent is e4m3, as JAX's autodiff of a
    dequantising function gives), uint8 bytes none (float0), the scales within a rounded sum
    of their terms; NaN and 448 in every unreferenced row never reach a gradient, whose rows
    there are exactly 0. Pages of 16 take the Pallas backward's inverted walk, of 8 its
    selection walk."""
    case, rng = _case(seed=11 + page, page=page)
    kv8 = _fp8_cache(case)
    kv = _layout(kv8 if fmt == "e4m3" else kv8.view(np.uint8), layout)
    ct = C.bf16_random(rng, case.q.shape)
    out, (dq, dkv, dg, dks, dvs) = _grads(case, kv, impl, ct)
    exact = _exact(case, _layout(kv8, layout), ct)
    bars = SCALED_BF16_BAR[impl]
    for name, mine, ref in (("q", dq, exact[0]), ("gate", dg, exact[2])):
        assert mine.dtype == jnp.bfloat16 and np.isfinite(np.asarray(mine, np.float32)).all(), name
        ratio = relative_error(mine, ref) / relative_error(jnp.asarray(ref, jnp.bfloat16), ref)
        assert ratio <= bars[name], (name, ratio)
    for name, mine, ref, terms in (("k_scale", dks, exact[3], exact[5]), ("v_scale", dvs, exact[4], exact[6])):
        ratio = scale_error_over_floor(float(mine), ref, terms)
        assert ratio <= bars["scales"], (name, float(mine), ref, ratio)
    referenced = C.referenced_rows(case)  # [NB, P]
    for mine, ref, cache in zip(jax.tree.leaves(dkv), exact[1], jax.tree.leaves(kv)):
        if fmt == "bytes":
            assert mine.dtype == jax.dtypes.float0 and mine.shape == cache.shape
            continue
        assert mine.dtype == E4M3
        m32 = np.asarray(mine, np.float32)
        assert not np.isnan(m32).any()
        ratio = relative_error(mine, ref) / relative_error(jnp.asarray(ref, E4M3), ref)
        assert ratio <= E4M3_KV_BAR, ratio
        rows = m32 if layout == "split" else m32.transpose(0, 2, 1, 3)  # [NB, P, Hk, *]
        assert (rows[~referenced] == 0).all()


def test_scaled_xla_backward_is_the_exact_gradient_float64():
    """In float64 the XLA backward with the scale pair is the autodiff gradient of the exact
    function to rounding (all five cotangents, the pair's included), and that gradient
    matches central differences along random directions, the pair's too."""
    case, rng = _case(seed=5)
    kv8 = _fp8_cache(case, poison=False)
    li, bt, tr = _meta(case)
    p = check_sparse_attention_args(case.q, kv8, *li_bt_tr(case), case.output_gate, use_prefill_config=False,
                                    config=None, scales_given=(True, True))
    with jax.enable_x64(True):
        f64 = lambda x: jnp.asarray(np.asarray(x, np.float64))  # noqa: E731
        q, g, kv = f64(case.q), f64(case.output_gate), f64(kv8)
        sc = jnp.asarray([0.3, 1.7], jnp.float64)
        c = f64(rng.standard_normal(case.q.shape))
        loss = lambda q, kv, g, sc: jnp.sum(B.exact_forward(p, q, (kv,), li, bt, tr, g, sc)[0] * c)  # noqa: E731
        auto = jax.grad(loss, (0, 1, 2, 3))(q, kv, g, sc)
        _, attention, lse = B.exact_forward(p, q, (kv,), li, bt, tr, g, sc)
        dq, (dkv,), dg, dsc = B.xla_backward(p, q, (kv,), li, bt, tr, g, attention, lse, c, sc, chunk=7,
                                            kv_dtype=jnp.float64)
        for mine, ref in zip((dq, dkv, dg, dsc), auto):
            np.testing.assert_allclose(np.asarray(mine), np.asarray(ref), rtol=1e-9, atol=1e-12)
        for _ in range(3):
            us = [jnp.asarray(rng.standard_normal(x.shape)) for x in (q, kv, g, sc)]
            eps = 1e-6
            fd = (loss(*(x + eps * u for x, u in zip((q, kv, g, sc), us)))
                  - loss(*(x - eps * u for x, u in zip((q, kv, g, sc), us)))) / (2 * eps)
            analytic = sum(jnp.vdot(a, u) for a, u in zip((dq, dkv, dg, dsc), us))
            assert abs(float(fd) - float(analytic)) <= 1e-7 * max(1.0, abs(float(analytic)))


@pytest.mark.parametrize("impl", IMPLS)
def test_bf16_cache_with_scales(impl):
    """A bf16 cache ignores the scales' values (as 0.34.0 does): its gradients are those of
    the exact function with the pair (1, 1) within the bf16 bars, and the scales get exactly
    zero cotangents."""
    case, rng = _case(seed=21)
    ct = C.bf16_random(rng, case.q.shape)
    out, (dq, dkv, dg, dks, dvs) = _grads(case, case.kv_cache, impl, ct)
    exact = _exact(case, case.kv_cache, ct, fp8=False)
    for name, mine, ref in (("q", dq, exact[0]), ("kv", dkv, exact[1][0]), ("gate", dg, exact[2])):
        ratio = relative_error(mine, ref) / relative_error(jnp.asarray(ref, jnp.bfloat16), ref)
        assert ratio <= BF16_BAR[impl][name], (name, ratio)
    assert float(dks) == 0.0 and float(dvs) == 0.0


@pytest.mark.parametrize("impl", IMPLS)
def test_scaled_gradients_under_vmap_and_jit(impl):
    """vmap over a batch (the cache and the scales batched too) gives each example's own
    gradients under jit: bit for bit, but for the scales' (fp32 sums: to 1e-6)."""
    first = _case(seed=31)[0]
    cases = [first, dataclass_with_meta(_case(seed=32)[0], first)]  # vmap shares the metadata
    caches = [_fp8_cache(c) for c in cases]
    rng = np.random.default_rng(3)
    cts = [C.bf16_random(rng, c.q.shape) for c in cases]
    scales = [(0.5, 2.0), (0.25, 3.0)]
    li, bt, tr = _meta(cases[0])
    per = [_grads(c, kv, impl, ct, *s) for c, kv, ct, s in zip(cases, caches, cts, scales)]

    def one(q, kv, g, ks, vs, ct):
        f = functools.partial(qsa_jax.sparse_attention, logical_indices=li, block_table=bt, token_to_req=tr,
                              implementation=impl)
        out, pull = jax.vjp(lambda q, kv, g, ks, vs: f(q, kv, output_gate=g, k_scale=ks, v_scale=vs),
                            q, kv, g, ks, vs)
        return out, pull(ct)

    stack = lambda xs: jnp.stack([jnp.asarray(x) for x in xs])  # noqa: E731
    batched = jax.jit(jax.vmap(one))(stack([c.q for c in cases]), stack(caches),
                                     stack([c.output_gate for c in cases]),
                                     stack([np.float32(s[0]) for s in scales]),
                                     stack([np.float32(s[1]) for s in scales]), stack(cts))
    for i, (out, grads) in enumerate(per):
        want = jax.tree.leaves((out, grads))
        got = [x[i] for x in jax.tree.leaves(batched)]
        assert len(want) == len(got)
        for w, g in zip(want, got):
            if np.ndim(w) == 0:  # a scale's cotangent: an fp32 sum, whose order jit may change
                np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=1e-6)
            else:
                np.testing.assert_array_equal(np.asarray(w, np.float32), np.asarray(g, np.float32))


def dataclass_with_meta(case, meta_from):
    """``case`` with ``meta_from``'s selection metadata (vmap shares it across the batch)."""
    import dataclasses

    return dataclasses.replace(case, logical_indices=meta_from.logical_indices,
                               block_table=meta_from.block_table, token_to_req=meta_from.token_to_req)


@pytest.mark.parametrize("fmt", ["e4m3", "bytes"])
def test_scaled_fp8_backward_lowers_to_triton_for_sm90(monkeypatch, fmt):
    """Without a GPU: jax.grad of an fp8 call with traced scales lowers through the Triton path
    for CUDA (both walks of the Pallas backward, fused and split caches), as on an H100/H200:
    the backward kernels are in the exported program, the inverted dK/dV walk for e4m3; for
    uint8 bytes (no cotangent) the dK/dV kernel is not in the program. (What the kernels
    compute with the scales is checked numerically in interpret mode, above, and on the GPU.)"""
    import types

    from jax._src.pallas.triton import pallas_call_registration as registration

    from qsa_jax.ops.sparse_attention import backward_pallas, pallas

    monkeypatch.setattr(registration.gpu_info_lib, "get_gpu_info",
                        lambda: types.SimpleNamespace(compute_capability=90))
    monkeypatch.setattr(backward_pallas, "interpret", lambda: False)
    monkeypatch.setattr(pallas, "interpret", lambda: False)
    rng = np.random.default_rng(8)
    case = C.sparse_attention_case(rng, rows=2, num_query_heads=24, num_kv_heads=2, head_dim=256, page_size=64,
                                   selection_blocks=40, context_tokens=256, num_requests=2)
    li, bt, tr = _meta(case)
    dtype = E4M3 if fmt == "e4m3" else jnp.uint8
    q = jax.ShapeDtypeStruct(case.q.shape, jnp.bfloat16)
    fused = jax.ShapeDtypeStruct(case.kv_cache.shape, dtype)
    nb, hk, page, d2 = case.kv_cache.shape
    half = jax.ShapeDtypeStruct((nb, page, hk, d2 // 2), dtype)
    scalar = jax.ShapeDtypeStruct((), jnp.float32)

    def loss(q, kv, g, ks, vs):
        out = qsa_jax.sparse_attention(q, kv, li, bt, tr, g, implementation="pallas", k_scale=ks, v_scale=vs)
        return jnp.sum(out.astype(jnp.float32))

    def export(fn, *args):
        checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
        return jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args).mlir_module()

    argnums = (0, 2, 3, 4) if fmt == "bytes" else (0, 1, 2, 3, 4)
    text = export(jax.grad(loss, argnums=argnums), q, fused, q, scalar, scalar)
    assert "qsa_sparse_attention_backward" in text
    # Page 64 takes the inverted walk for dK/dV; uint8 bytes get no cotangent, and the program
    # then holds no dK/dV kernel at all (JAX drops the unused computation).
    assert ("qsa_sparse_attention_backward_inverted" in text) == (fmt == "e4m3")
    split = export(jax.grad(lambda q, k, v, g, ks, vs: loss(q, (k, v), g, ks, vs), argnums=(0, 3, 4)),
                   q, half, half, q, scalar, scalar)
    assert "qsa_sparse_attention_backward" in split
    p = check_sparse_attention_args(q, fused, li, bt, tr, q, use_prefill_config=False, config=None,
                                    scales_given=(True, True))
    lse = jax.ShapeDtypeStruct(case.q.shape[:2], jnp.float32)
    pair = jax.ShapeDtypeStruct((2,), jnp.float32)
    selection = export(lambda q, kv, g, a, lse, c, s: backward_pallas.pallas_backward(
        p, q, (kv,), li, bt, tr, g, a, lse, c, s, order="selection"), q, fused, q, q, lse, q, pair)
    assert "qsa_sparse_attention_backward" in selection and "_inverted" not in selection
