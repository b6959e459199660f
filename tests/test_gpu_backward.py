"""Pallas backward on the GPU at the real shapes (TP1/TP4 heads, D = 256, W = 2051,
pages of 1600/800), against an fp32 reference of the exact gradient.

Reference: ``backward.xla_backward`` on fp32 copies of the inputs with residuals from
``backward.exact_forward`` in fp32 (HIGHEST-precision dots): its error is ~1e-6, far
below the bf16 floor, so it stands in for the float64 gradient. Bars as on CPU
(tests/test_backward.py): err(pallas) <= BF16_BAR x err(reference rounded to bf16).
Fresh random inputs, every degenerate row kind, NaN in every unreferenced cache row,
requests sharing pages.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import qsa_jax
from qsa_jax import arg_specs
from qsa_jax.ops.sparse_attention import backward as B
from qsa_jax.ops.sparse_attention.base import check_sparse_attention_args
from qsa_testing import cases as C

pytestmark = pytest.mark.gpu

ROWS = tuple(int(r) for r in os.environ.get("QSA_GRAD_ROWS", "1,64,1024,2048").split(","))
# dq measured 1.86-2.11x its floor on the H200 at 1024 rows (2026-12-03), dK/dV 1.78-1.86x,
# dgate 1.54-1.55x; on CPU 1.72-1.90x (tests/test_backward.py).
BF16_BAR = {"q": 2.3, "kv": 2.1, "gate": 2.3}


def _case(geometry, rows: int, shared_pages: bool):
    rng = np.random.default_rng(rows + 31 * geometry.num_query_heads + shared_pages)
    context = 8192  # 4-6 pages per request at the real page sizes
    requests = min(rows, 4)
    pages_needed = requests * -(-context // geometry.page_size)
    case = C.sparse_attention_case(
        rng, rows=rows, num_query_heads=geometry.num_query_heads,
        num_kv_heads=geometry.num_kv_heads, head_dim=geometry.head_dim,
        page_size=geometry.page_size, selection_blocks=arg_specs.SELECTION_BLOCKS,
        context_tokens=context, num_requests=requests,
        # A pool smaller than the contexts makes requests share physical pages.
        num_pages=max(2, pages_needed // 2) if shared_pages else None)
    C.add_edge_rows(rng, case)
    return C.poison_unreferenced(case), rng


def _rel(x, ref):
    x = jnp.asarray(x, jnp.float32)
    return float(jnp.linalg.norm((x - ref).ravel()) / jnp.linalg.norm(ref.ravel()))


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("tp,shared", [("TP1", False), ("TP1", True), ("TP4", False)])
def test_pallas_backward_real_shapes(tp, shared, rows):
    geometry = arg_specs.GEOMETRIES[tp]
    case, rng = _case(geometry, rows, shared)
    li, bt, tr = (jnp.asarray(x) for x in (case.logical_indices, case.block_table, case.token_to_req))
    q, kv, gate = (jnp.asarray(x) for x in (case.q, case.kv_cache, case.output_gate))
    ct = jnp.asarray(C.bf16_random(rng, case.q.shape))

    def f(q, kv, g):
        return qsa_jax.sparse_attention(q, kv, li, bt, tr, g, implementation="pallas")

    out, vjp = jax.vjp(f, q, kv, gate)
    grads = vjp(ct)
    plain = f(q, kv, gate)
    assert bool(jnp.all(jax.lax.bitcast_convert_type(out, jnp.uint16)
                        == jax.lax.bitcast_convert_type(plain, jnp.uint16))), "forward changed under vjp"

    p = check_sparse_attention_args(q, kv, li, bt, tr, gate, use_prefill_config=False, config=None)
    f32 = lambda x: x.astype(jnp.float32)
    kv32 = jnp.where(jnp.isnan(f32(kv)), 0.0, f32(kv))  # NaN rows are unreferenced
    _, attention, lse = jax.jit(B.exact_forward, static_argnums=0)(
        p, f32(q), (kv32,), li, bt, tr, f32(gate))
    ref = jax.jit(B.xla_backward, static_argnums=0)(
        p, f32(q), (kv32,), li, bt, tr, f32(gate), attention, lse, f32(ct))
    ref = (ref[0], ref[1][0], ref[2])
    referenced = C.referenced_rows(case)
    for name, mine, want in zip(("q", "kv", "gate"), grads, ref):
        assert mine.dtype == jnp.bfloat16
        assert not bool(jnp.isnan(f32(mine)).any()), name
        if not bool(jnp.any(want != 0)):  # e.g. a 1-row batch whose row is an edge row
            assert not bool(jnp.any(f32(mine) != 0)), f"{name}: nonzero where the exact gradient is 0"
            continue
        floor = _rel(want.astype(jnp.bfloat16), want)
        err = _rel(mine, want)
        print(f"GRAD {tp} shared={shared} rows={rows} d{name}: err {err:.2e} floor {floor:.2e} "
              f"ratio {err / floor:.2f}")
        assert err <= BF16_BAR[name] * floor, (name, err, floor)
    dkv = np.asarray(f32(grads[1])).transpose(0, 2, 1, 3)
    assert (dkv[~referenced] == 0).all(), "an unreferenced cache row got a gradient"


def test_pallas_backward_vmap_gpu():
    geometry = arg_specs.TP4
    case, rng = _case(geometry, 8, False)
    args = [jnp.asarray(x) for x in (case.q, case.kv_cache, case.logical_indices, case.block_table,
                                      case.token_to_req, case.output_gate)]

    def loss(q, kv, li, bt, tr, g):
        out = qsa_jax.sparse_attention(q, kv, li, bt, tr, g, implementation="pallas")
        return jnp.sum(out.astype(jnp.float32) ** 2)

    batched = [jnp.stack([a, a]) for a in args]
    got = jax.vmap(jax.grad(loss, argnums=(0, 5)))(*batched)
    one = jax.grad(loss, argnums=(0, 5))(*args)
    for a, b in zip(got, one):
        # Atomics: the same sums in a possibly different order.
        np.testing.assert_allclose(np.asarray(a[1], np.float32), np.asarray(b, np.float32),
                                   rtol=2e-2, atol=2e-3)


def test_triton_gradients_use_the_pallas_backward():
    """implementation="triton": the output is triton's own (bit-identical under vjp), the
    residuals and the backward come from Pallas, so the gradients match Pallas's up to the
    atomics' summation order."""
    if "triton" not in qsa_jax.available_implementations("sparse_attention"):
        pytest.skip("jax-triton is not available here")
    case, rng = _case(arg_specs.TP1, 64, False)
    li, bt, tr = (jnp.asarray(x) for x in (case.logical_indices, case.block_table, case.token_to_req))
    q, kv, gate = (jnp.asarray(x) for x in (case.q, case.kv_cache, case.output_gate))
    ct = jnp.asarray(C.bf16_random(rng, case.q.shape))
    grads = {}
    for impl in ("triton", "pallas"):
        f = lambda q, kv, g, impl=impl: qsa_jax.sparse_attention(q, kv, li, bt, tr, g, implementation=impl)
        out, vjp = jax.vjp(f, q, kv, gate)
        assert bool(jnp.all(jax.lax.bitcast_convert_type(out, jnp.uint16)
                            == jax.lax.bitcast_convert_type(f(q, kv, gate), jnp.uint16)))
        grads[impl] = vjp(ct)
    for a, b in zip(grads["triton"], grads["pallas"]):
        assert _rel(a, jnp.asarray(b, jnp.float32)) < 1e-2


@pytest.mark.parametrize("kw", [dict(order="sorted"), dict(order="sorted", num_splits=17),
                                dict(order="selection", relaxed_atomics=False), dict(order="selection")],
                         ids=["sorted", "sorted-17splits", "selection-acq_rel", "selection"])
def test_pallas_backward_variants_agree_gpu(kw):
    """The backward's other walks (backward_pallas.ORDERS) and the acq_rel atomics give the
    default's (the inverted walk's) gradients up to summation order, at the real TP1 shapes with shared pages,
    edge rows and NaN in every unreferenced row (which must still get exactly 0)."""
    from qsa_jax.ops.sparse_attention.backward_pallas import pallas_backward

    case, rng = _case(arg_specs.TP1, 1024, True)
    args = (jnp.asarray(case.q), (jnp.asarray(case.kv_cache),)) + tuple(
        jnp.asarray(x) for x in (case.logical_indices, case.block_table, case.token_to_req, case.output_gate))
    ct = jnp.asarray(C.bf16_random(rng, case.q.shape))
    p = check_sparse_attention_args(args[0], args[1][0], *args[2:], use_prefill_config=False, config=None)
    _, attention, lse = jax.jit(B.forward_with_residuals, static_argnums=(0, 1))(p, "pallas", *args)
    def run(**k):
        return jax.tree.leaves(jax.jit(lambda *x: pallas_backward(p, *x, **k))(*args, attention, lse, ct))

    default, variant = run(), run(**kw)
    for name, a, b in zip(("q", "kv", "gate"), variant, default):
        assert not bool(jnp.isnan(a.astype(jnp.float32)).any()), name
        diff = _rel(a, b.astype(jnp.float32))
        print(f"GRAD variant {kw} d{name}: relative difference from the default {diff:.1e}")
        assert diff < 1e-2, (name, diff)
    dkv = np.asarray(variant[1].astype(jnp.float32)).transpose(0, 2, 1, 3)
    assert (dkv[~C.referenced_rows(case)] == 0).all(), "an unreferenced cache row got a gradient"


@pytest.mark.parametrize("layout", ["fused", "split"])
def test_pallas_backward_fp32_cache_cotangent_gpu(layout):
    """kv_dtype=float32 (what each row shard of a mesh returns before the all-reduce) gives the
    default walk's cache cotangent unrounded: rounded to bf16 it is the default's, bit for bit, at
    the real TP1 shapes with shared pages, edge rows and NaN in unreferenced rows."""
    from qsa_jax.ops.sparse_attention.backward_pallas import pallas_backward

    case, rng = _case(arg_specs.TP1, 64, True)
    kv = ((jnp.asarray(case.kv_cache),) if layout == "fused"
          else tuple(jnp.asarray(x) for x in case.split_caches()))
    meta = tuple(jnp.asarray(x) for x in (case.logical_indices, case.block_table, case.token_to_req))
    q, gate = jnp.asarray(case.q), jnp.asarray(case.output_gate)
    ct = jnp.asarray(C.bf16_random(rng, case.q.shape))
    p = check_sparse_attention_args(q, kv if layout == "split" else kv[0], *meta, gate,
                                    use_prefill_config=False, config=None)
    _, attention, lse = jax.jit(B.forward_with_residuals, static_argnums=(0, 1))(p, "pallas", q, kv, *meta, gate)

    def run(**k):
        return jax.jit(lambda *x: pallas_backward(p, *x, **k)[1])(q, kv, *meta, gate, attention, lse, ct)

    wide, default = run(kv_dtype=jnp.float32), run()
    for w, d in zip(wide, default):
        assert w.dtype == jnp.float32 and d.dtype == jnp.bfloat16
        assert np.array_equal(np.asarray(w.astype(jnp.bfloat16)).view(np.uint16), np.asarray(d).view(np.uint16))
        assert bool((w != w.astype(jnp.bfloat16).astype(jnp.float32)).any()), "rounded before widening"


@pytest.mark.parametrize("rows", [r for r in ROWS if r <= 1024])
@pytest.mark.parametrize("tp,fmt", [("TP1", "e4m3"), ("TP4", "bytes")])
def test_pallas_backward_fp8_scaled_real_shapes(tp, fmt, rows):
    """vLLM 0.34's arithmetic at the real shapes: an e4m3 cache (values or uint8 bytes) with
    traced k/v scales 0.5 / 2.0 and 448 / NaN in every unreferenced row. dq and dgate against
    the fp32 reference of the exact gradient (decoded cache, the scale pair) over the bf16
    floor; the e4m3 cache cotangent over the e4m3 floor; uint8 bytes get none. Bars: the
    CPU's (qsa_testing/gradients.py)."""
    import ml_dtypes

    from qsa_testing.gradients import E4M3_KV_BAR, SCALED_BF16_BAR

    geometry = arg_specs.GEOMETRIES[tp]
    case, rng = _case(geometry, rows, False)
    e4m3 = ml_dtypes.float8_e4m3fn
    kv8 = (np.nan_to_num(np.asarray(case.kv_cache, np.float32)) * 3).astype(e4m3)
    bits = kv8.view(np.uint8)
    stray = np.broadcast_to(~C.referenced_rows(case)[:, None, :], kv8.shape[:3])
    d = case.head_dim
    bits[..., :d][stray], bits[..., d:][stray] = 0x7E, 0x7F
    li, bt, tr = (jnp.asarray(x) for x in (case.logical_indices, case.block_table, case.token_to_req))
    q, gate = jnp.asarray(case.q), jnp.asarray(case.output_gate)
    kv = jnp.asarray(kv8 if fmt == "e4m3" else bits)
    ct = jnp.asarray(C.bf16_random(rng, case.q.shape))

    def f(q, kv, g, ks, vs):
        return qsa_jax.sparse_attention(q, kv, li, bt, tr, g, implementation="pallas", k_scale=ks, v_scale=vs)

    _, vjp = jax.vjp(f, q, kv, gate, jnp.float32(0.5), jnp.float32(2.0))
    dq, dkv, dg, dks, dvs = vjp(ct)

    p = check_sparse_attention_args(q, kv, li, bt, tr, gate, use_prefill_config=False, config=None,
                                    scales_given=(True, True))
    f32 = lambda x: x.astype(jnp.float32)
    kv32 = jnp.asarray(np.nan_to_num(kv8.astype(np.float32)))
    pair = jnp.stack([(jnp.float32(d ** -0.5) * 0.5) * jnp.float32(1.4426950408889634), jnp.float32(2.0)])
    # The reference takes the fp8 call's tiling: on a GPU the fp8 table differs from the bf16
    # one (built with config=None it took the bf16 table; session 19 on an H100).
    bf16_problem = check_sparse_attention_args(q, kv32.astype(jnp.bfloat16), li, bt, tr, gate,
                                               use_prefill_config=False, config=p.config,
                                               scales_given=(True, True))
    _, attention, lse = jax.jit(B.exact_forward, static_argnums=0)(
        bf16_problem, f32(q), (kv32,), li, bt, tr, f32(gate), pair)
    ref = jax.jit(B.xla_backward, static_argnums=0)(
        bf16_problem, f32(q), (kv32,), li, bt, tr, f32(gate), attention, lse, f32(ct), pair)
    for name, mine, want in (("q", dq, ref[0]), ("gate", dg, ref[2])):
        assert not bool(jnp.isnan(f32(mine)).any()), name
        if not bool(jnp.any(want != 0)):
            continue
        ratio = _rel(mine, want) / _rel(want.astype(jnp.bfloat16), want)
        print(f"GRAD fp8 {tp} {fmt} rows={rows} d{name}: ratio {ratio:.2f}")
        assert ratio <= SCALED_BF16_BAR["pallas"][name], (name, ratio)
    assert np.isfinite(float(dks)) and np.isfinite(float(dvs))
    if fmt == "bytes":
        assert dkv.dtype == jax.dtypes.float0
        return
    want = ref[1][0]
    assert dkv.dtype == e4m3 and not bool(jnp.isnan(f32(dkv)).any())
    if bool(jnp.any(want != 0)):
        ratio = _rel(dkv, want) / _rel(want.astype(e4m3), want)
        print(f"GRAD fp8 {tp} rows={rows} dkv: ratio {ratio:.2f}")
        assert ratio <= E4M3_KV_BAR, ratio
    assert (np.asarray(f32(dkv)).transpose(0, 2, 1, 3)[~C.referenced_rows(case)] == 0).all()
