"""Gradients of sparse_attention (backward.py, backward_pallas.py) on CPU.

References: the float64 gradient of the exact function (``backward.exact_forward``,
differentiated by JAX in float64 and checked itself against central finite
differences), and hand-computed cases for duplicates and shared pages.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import qsa_jax
from qsa_jax.ops.sparse_attention import backward as B
from qsa_jax.ops.sparse_attention.base import check_sparse_attention_args
from qsa_jax.config import SparseAttentionConfig
from qsa_testing import cases as C
from qsa_testing.gradients import BF16_BAR, float64_gradients, relative_error

IMPLS = ("xla", "pallas")  # pallas: interpret mode on CPU


def _case(seed=0, rows=6, heads=4, hk=2, d=16, page=8, blocks=6, context=48, requests=2, edges=True,
          num_pages=None):
    rng = np.random.default_rng(seed)
    case = C.sparse_attention_case(rng, rows=rows, num_query_heads=heads, num_kv_heads=hk,
                                   head_dim=d, page_size=page, selection_blocks=blocks,
                                   context_tokens=context, num_requests=requests, num_pages=num_pages)
    if edges:
        C.add_edge_rows(rng, case)
    return case, rng


def _meta(case):
    return tuple(jnp.asarray(a) for a in (case.logical_indices, case.block_table, case.token_to_req))


def _problem(case, config=None):
    return check_sparse_attention_args(
        case.q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req,
        case.output_gate, use_prefill_config=False, config=config)


def _vjp(case, impl, ct, config=None, layout="fused"):
    li, bt, tr = _meta(case)
    kv = jnp.asarray(case.kv_cache) if layout == "fused" else tuple(map(jnp.asarray, case.split_caches()))

    def f(q, kv, g):
        return qsa_jax.sparse_attention(q, kv, li, bt, tr, g, config=config, implementation=impl)

    out, vjp = jax.vjp(f, jnp.asarray(case.q), kv, jnp.asarray(case.output_gate))
    return out, vjp(jnp.asarray(ct))


def _exact_grads(case, ct, config=None):
    """float64 (dq, dkv fused, dgate) of the exact function at the case's inputs."""
    dq, (dkv,), dgate = float64_gradients(_problem(case, config), case.q, (case.kv_cache,), *_meta(case),
                                          case.output_gate, ct)
    return dq, dkv, dgate


_rel = relative_error


def test_exact_gradient_matches_finite_differences_and_xla_backward_float64():
    case, rng = _case(seed=1)
    case = C.poison_unreferenced(case)
    p = _problem(case)
    li, bt, tr = _meta(case)
    ct = rng.standard_normal(case.q.shape)
    with jax.enable_x64(True):
        q, kv, g = (jnp.asarray(np.asarray(x, np.float64)) for x in (case.q, case.kv_cache, case.output_gate))
        # NaN rows are unreferenced: finite differences need a finite cache, so
        # poisoning is checked separately below; here the NaNs become zeros.
        kv = jnp.where(jnp.isnan(kv), 0.0, kv)
        c = jnp.asarray(ct)
        loss = lambda q, kv, g: jnp.sum(B.exact_forward(p, q, (kv,), li, bt, tr, g)[0] * c)
        auto = jax.grad(loss, argnums=(0, 1, 2))(q, kv, g)
        _, attention, lse = B.exact_forward(p, q, (kv,), li, bt, tr, g)
        dq, (dkv,), dg = B.xla_backward(p, q, (kv,), li, bt, tr, g, attention, lse, c, chunk=7)
        for mine, ref in zip((dq, dkv, dg), auto):
            np.testing.assert_allclose(np.asarray(mine), np.asarray(ref), rtol=1e-9, atol=1e-12)
        # Central differences along random directions, float64.
        for _ in range(3):
            us = [jnp.asarray(rng.standard_normal(x.shape)) for x in (q, kv, g)]
            eps = 1e-6
            plus = loss(q + eps * us[0], kv + eps * us[1], g + eps * us[2])
            minus = loss(q - eps * us[0], kv - eps * us[1], g - eps * us[2])
            fd = (plus - minus) / (2 * eps)
            analytic = sum(jnp.vdot(a, u) for a, u in zip((dq, dkv, dg), us))
            assert abs(float(fd) - float(analytic)) <= 1e-7 * max(1.0, abs(float(analytic)))


# Bars over the bf16 floor, with how they were measured: qsa_testing/gradients.py.


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("config,page", [(None, 8), ((16, 1, 4, 3), 8), (None, 16)],
                         ids=["table", "splits3", "table-page16"])
def test_bf16_gradients_against_the_floor(impl, config, page):
    """The gradients against the float64 ones, as a ratio to the bf16 floor. Pages of 8 take
    the Pallas backward's selection walk (16-slot blocks do not fit), pages of 16 its default,
    the inverted walk."""
    if page == 16 and impl == "pallas":
        from qsa_jax.ops.sparse_attention import backward_pallas as BP

        assert BP.resolve_order(_problem(_case(page=16, context=64, edges=False)[0]), None) == "inverted"
    case, rng = _case(seed=2, rows=4, heads=12, hk=2, d=32, page=page, blocks=12 * 8 // page, context=64)
    case = C.poison_unreferenced(case, SparseAttentionConfig(*config) if config else None)
    ct = C.bf16_random(rng, case.q.shape)
    out, grads = _vjp(case, impl, ct, config=config)
    exact = _exact_grads(case, ct, config)
    referenced = C.referenced_rows(case, SparseAttentionConfig(*config) if config else None)
    for name, mine, ref in zip(("q", "kv", "gate"), grads, exact):
        mine32 = np.asarray(mine.astype(jnp.float32))
        assert mine.dtype == jnp.bfloat16 and not np.isnan(mine32).any(), name
        floor = _rel(jnp.asarray(ref, jnp.bfloat16), ref)
        err = _rel(mine, ref)
        assert err <= BF16_BAR[impl][name] * floor, (name, err, floor, err / floor)
        assert np.array_equal(mine32 == 0, ref == 0) or name == "kv", name
    dkv = np.asarray(grads[1].astype(jnp.float32))
    # Unreferenced cache rows (NaN in the input): exactly zero gradient.
    assert (dkv.transpose(0, 2, 1, 3)[~referenced] == 0).all()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("page", [8, 16], ids=["page8", "page16"])
def test_nan_in_unreferenced_k_and_v_never_reaches_a_gradient(impl, page):
    """NaN in both halves of every cache row no valid entry reads, and a page 0 of nothing
    but NaN (where masked-off entries' addresses are clamped): in the backward a stray K
    shows too (dq = dS.K, 0 x NaN), unlike in the forward (docs/spec.md §6.5). A K or V
    multiplied by a validity mask instead of selected passed every other test."""
    case, rng = _case(seed=5, rows=6, heads=12, hk=2, d=32, page=page, blocks=12 * 8 // page, context=64)
    referenced = C.referenced_rows(case)
    kv = case.kv_cache.copy()
    kv.view(np.uint16)[np.broadcast_to(~referenced[:, None, :], kv.shape[:3])] = C.BF16_NAN_BITS
    case = C.prepend_poison_page(dataclasses.replace(case, kv_cache=kv), np.nan, np.nan)
    assert np.array_equal(C.referenced_rows(case)[1:], referenced) and not C.referenced_rows(case)[0].any()
    ct = C.bf16_random(rng, case.q.shape)
    out, grads = _vjp(case, impl, ct)
    assert not np.isnan(np.asarray(out.astype(jnp.float32))).any()
    for name, g in zip(("q", "kv", "gate"), grads):
        assert not np.isnan(np.asarray(g.astype(jnp.float32))).any(), name
    dkv = np.asarray(grads[1].astype(jnp.float32)).transpose(0, 2, 1, 3)
    assert (dkv[~C.referenced_rows(case)] == 0).all() and dkv[C.referenced_rows(case)].any()


@pytest.mark.parametrize("kw,layout,pool,rows", [
    (dict(order="sorted"), "fused", None, 5), (dict(order="sorted", num_splits=3, block_n=16), "fused", None, 5),
    (dict(order="selection", num_splits=3, block_n=16), "fused", None, 5),
    # inverted: 12 rows, 5 of them live (2 requests: several rows reference each block,
    # duplicated tokens among them). The named-pages accumulator (2 x 8 table entries < 19
    # pages); then a pool of 6 pages shared by the requests (the whole cache as the
    # accumulator), split layout, 4-slot blocks, 16 lanes.
    # The named-pages case writes those pages straight into the cache-shaped gradient
    # (padding pages write nothing): both layouts.
    (dict(order="inverted", block_n=8), "fused", None, 12), (dict(order="inverted", block_n=8), "split", None, 12),
    (dict(order="inverted", block_n=4, lanes=16), "split", 6, 12)],
    ids=["sorted", "sorted-3splits", "selection-3splits", "inverted", "inverted-split", "inverted-split-shared"])
def test_pallas_backward_orders_and_splits(kw, layout, pool, rows):
    """The Pallas backward's entry orders and splittings (backward_pallas.ORDERS) walk the
    same entries: each meets the float64 bar and equals the default walk within fp32
    summation order (here exactly: sums of bf16 products this small are exact in fp32).
    Poisoned unreferenced rows, edge rows (duplicates among them), splits that do not
    divide the tiles."""
    from qsa_jax.ops.sparse_attention.backward_pallas import pallas_backward

    case, rng = _case(seed=9, rows=rows, heads=12, hk=2, d=32, blocks=12, context=64, num_pages=pool)
    case = C.poison_unreferenced(case)
    ct = jnp.asarray(C.bf16_random(rng, case.q.shape))
    kv = (jnp.asarray(case.kv_cache),) if layout == "fused" else tuple(map(jnp.asarray, case.split_caches()))
    p = check_sparse_attention_args(case.q, kv[0] if layout == "fused" else kv, *_meta(case), case.output_gate,
                                    use_prefill_config=False, config=None)
    args = (jnp.asarray(case.q), kv) + _meta(case) + (jnp.asarray(case.output_gate),)
    _, attention, lse = B.forward_with_residuals(p, "pallas", *args)
    def fused(grads):  # (dq, dkv in the fused layout, dgate)
        dkv = grads[1][0] if layout == "fused" else jnp.concatenate(grads[1], axis=-1).transpose(0, 2, 1, 3)
        return grads[0], dkv, grads[2]

    default = fused(pallas_backward(p, *args, attention, lse, ct))
    dq, dkv, dgate = fused(pallas_backward(p, *args, attention, lse, ct, **kw))
    exact = _exact_grads(case, ct)
    rounded = _selected_thrice(p, case) if kw["order"] == "inverted" else None
    for name, mine, ref, base in zip(("q", "kv", "gate"), (dq, dkv, dgate), exact, default):
        mine32, base32 = (np.asarray(x.astype(jnp.float32)) for x in (mine, base))
        assert not np.isnan(mine32).any(), name
        floor = _rel(jnp.asarray(ref, jnp.bfloat16), ref)
        assert _rel(mine, ref) <= BF16_BAR["pallas"][name] * floor, name
        if name == "kv" and rounded is not None and rounded.any():
            # "inverted" weights dS and p by a row's multiplicity c of a token before the
            # bf16 rounding of the dot operand, the default adds c rounded copies: the same
            # for c <= 2 (exact doubling), one bf16 rounding apart for c >= 3 (shared pages
            # named thrice by one request here; real selections pick distinct blocks).
            assert 2 * rounded.sum() <= rounded.size  # most slots still compared exactly
            mine32, base32 = (x.transpose(0, 2, 1, 3) for x in (mine32, base32))
            np.testing.assert_allclose(mine32[rounded], base32[rounded], rtol=0.05, atol=0.05 * np.abs(base32).max())
            mine32, base32 = mine32[~rounded], base32[~rounded]
        np.testing.assert_array_equal(mine32, base32, err_msg=name)
    dkv = np.asarray(dkv.astype(jnp.float32))
    assert (dkv.transpose(0, 2, 1, 3)[~C.referenced_rows(case)] == 0).all()


def _selected_thrice(p, case):
    """[NB, P] cache slots that some row selects 3 or more times (consumed, valid entries)."""
    from qsa_jax.ops.sparse_attention.backward_pallas import entry_lists

    entries, _, _ = entry_lists(p, *_meta(case), "selection")
    entries = np.asarray(entries)
    kv = p.kv
    mask = np.zeros((kv.num_pages, kv.page_size), bool)
    for row in entries:
        rows, times = np.unique(row[row >= 0], return_counts=True)
        slot = rows[times >= 3] // kv.num_kv_heads if not kv.fused else (
            rows[times >= 3] // (kv.num_kv_heads * kv.page_size) * kv.page_size
            + rows[times >= 3] % (kv.num_kv_heads * kv.page_size))
        mask.reshape(-1)[slot] = True
    return mask


@pytest.mark.parametrize("fused", [True, False])
def test_inverted_index_against_a_loop(fused):
    """backward_pallas.inverted_index (the CSR of references per slot block) against a plain
    Python construction, on scattered single-token entries (no 4-token runs to hide an
    off-by-one at a block boundary), -1 holes and repeated tokens."""
    from qsa_jax.ops.sparse_attention.backward_pallas import inverted_index
    from qsa_jax.ops.sparse_attention.base import KVLayout

    rng = np.random.default_rng(11)
    kv = KVLayout(fused, num_pages=5, page_size=8, num_kv_heads=2, head_dim=16)
    p = _problem(_case(seed=11, rows=1, edges=False)[0])
    p = p.__class__(**{**p.__dict__, "kv": kv})
    rows, width, block = 7, 9, 4
    slots = rng.integers(0, kv.num_pages * kv.page_size, (rows, width))
    slots[rng.random((rows, width)) < 0.25] = -1
    slots[:, 1] = np.where(rng.random(rows) < 0.5, slots[:, 0], slots[:, 1])  # repeats
    page, token = slots // kv.page_size, slots % kv.page_size
    acc = np.where(slots >= 0, kv.row_index(page, token, 0), -1).astype(np.int32)
    starts, ref_rows, counts = (np.asarray(x) for x in inverted_index(p, jnp.asarray(acc), 40, block))
    want = {}
    for r in range(rows):
        for s in slots[r][slots[r] >= 0]:
            want.setdefault((s // block, r), np.zeros(block, int))[s % block] += 1
    refs = sorted(want)
    assert starts[-1] == len(refs)
    for b in range(10):
        mine = [(b, int(r)) for r in ref_rows[starts[b]:starts[b + 1]]]
        assert mine == [k for k in refs if k[0] == b], b
        for i, k in enumerate(mine):
            np.testing.assert_array_equal(counts[starts[b] + i], want[k])


def test_pallas_backward_inverted_rejects_bad_launch_knobs():
    from qsa_jax.ops.sparse_attention.backward_pallas import pallas_backward

    case, rng = _case(seed=10, rows=2, edges=False)  # pages of 8
    p = _problem(case)
    args = (jnp.asarray(case.q), (jnp.asarray(case.kv_cache),)) + _meta(case) + (jnp.asarray(case.output_gate),)
    zeros = jnp.zeros(case.q.shape, jnp.bfloat16)
    lse = jnp.zeros(case.q.shape[:2], jnp.float32)
    with pytest.raises(ValueError, match="block_n dividing the page size 8"):
        pallas_backward(p, *args, zeros, lse, zeros, order="inverted", block_n=16)
    with pytest.raises(ValueError, match="lanes"):
        pallas_backward(p, *args, zeros, lse, zeros, order="inverted", block_n=8, lanes=-1)
    with pytest.raises(ValueError, match="dq_warps must be a power of two"):
        pallas_backward(p, *args, zeros, lse, zeros, order="inverted", block_n=8, dq_warps=3)
    with pytest.raises(ValueError, match="dq_warps is the inverted order's"):
        pallas_backward(p, *args, zeros, lse, zeros, order="selection", dq_warps=4)
    # order=None on pages of 8 takes the selection walk; the inverted walk's knobs then say why
    with pytest.raises(ValueError, match=r"lanes is the inverted order's.*order=None chose it"):
        pallas_backward(p, *args, zeros, lse, zeros, lanes=16)


@pytest.mark.parametrize("impl", IMPLS)
def test_forward_bit_identical_under_grad_and_layouts_agree(impl):
    case, rng = _case(seed=3, rows=4)
    for config in (None, (16, 1, 4, 3)) if impl == "xla" else ((16, 1, 4, 3),):
        li, bt, tr = _meta(case)
        plain = qsa_jax.sparse_attention(case.q, case.kv_cache, li, bt, tr, case.output_gate,
                                         config=config, implementation=impl)
        ct = C.bf16_random(rng, case.q.shape)
        out, fused = _vjp(case, impl, ct, config=config)
        assert np.array_equal(np.asarray(out).view(np.uint16), np.asarray(plain).view(np.uint16))
        _, split = _vjp(case, impl, ct, config=config, layout="split")
        d = case.head_dim
        dk, dv = (np.asarray(x.astype(jnp.float32)) for x in split[1])
        dkv = np.asarray(fused[1].astype(jnp.float32)).transpose(0, 2, 1, 3)
        if impl == "xla":  # same sums in the same order
            assert np.array_equal(dkv[..., :d], dk) and np.array_equal(dkv[..., d:], dv)
        else:
            np.testing.assert_allclose(dkv[..., :d], dk, rtol=2e-2, atol=1e-3)
            np.testing.assert_allclose(dkv[..., d:], dv, rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("impl", IMPLS)
def test_duplicates_and_shared_pages_accumulate(impl):
    """Hand-made: every row selects one token twice (p = 1/2 each, so dV[t] = dA); two
    requests map their page 0 to the same physical page and select the same token."""
    rng = np.random.default_rng(4)
    d, page = 16, 4
    kv = C.bf16_random(rng, (3, 1, page, 2 * d))
    li = np.array([[1, 1, 2], [1, 1, 2], [1, 1, 2]], np.int32)
    bt = np.array([[2], [2], [0]], np.int32)  # requests 0 and 1 share physical page 2
    tr = np.array([0, 1, 2], np.int32)
    q = C.bf16_random(rng, (3, 1, d))
    gate = C.bf16_random(rng, (3, 1, d))
    ct = C.bf16_random(rng, (3, 1, d))

    def f(kv):
        return qsa_jax.sparse_attention(q, kv, li, bt, tr, gate, implementation=impl)

    _, vjp = jax.vjp(f, jnp.asarray(kv))
    (dkv,) = vjp(jnp.asarray(ct))
    dkv = np.asarray(dkv.astype(jnp.float32))
    da = ct.astype(np.float64) / (1 + np.exp(-gate.astype(np.float64)))  # dO * sigmoid(gate)
    np.testing.assert_allclose(dkv[2, 0, 1, d:], da[0, 0] + da[1, 0], rtol=1e-2, atol=1e-3)
    np.testing.assert_allclose(dkv[0, 0, 1, d:], da[2, 0], rtol=1e-2, atol=1e-3)
    # A single selected token has p = 1: its key gets no gradient (softmax of one).
    assert np.abs(dkv[..., :d]).max() <= 1e-4 * np.abs(dkv[..., d:]).max()
    touched = np.zeros((3, page), bool)
    touched[2, 1] = touched[0, 1] = True
    assert (dkv[:, 0][~touched] == 0).all()


def _loss(impl):
    def loss(q, kv, li, bt, tr, g):
        return jnp.sum(qsa_jax.sparse_attention(q, kv, li, bt, tr, g, implementation=impl)
                       .astype(jnp.float32) ** 2)
    return loss


def _args(seed, rows=6):
    case, _ = _case(seed=seed, rows=rows, edges=False)
    return case, (jnp.asarray(case.q), jnp.asarray(case.kv_cache)) + _meta(case) + (
        jnp.asarray(case.output_gate),)


def test_metadata_gets_float0_and_jit():
    _, args = _args(5)
    loss = _loss("xla")
    grads = jax.jit(jax.grad(loss, argnums=range(6), allow_int=True))(*args)
    assert [x.dtype for x in grads[2:5]] == [jax.dtypes.float0] * 3
    eager = jax.grad(loss, argnums=(0, 1, 5))(*args)
    for a, b in zip(eager, (grads[0], grads[1], grads[5])):
        assert np.array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)))


@pytest.mark.parametrize("impl", IMPLS)
def test_vmap_equals_per_example_gradients(impl):
    """vmap over a leading batch of every argument (each element its own cache and
    metadata) gives each element's own gradient."""
    case, args = _args(5, rows=3)
    loss = _loss(impl)
    # Element 1: rows reversed, a different cache.
    other = (args[0][::-1], args[1][::-1], args[2][::-1], args[3], args[4][::-1], args[5][::-1])
    batched = tuple(jnp.stack([a, b]) for a, b in zip(args, other))
    got = jax.vmap(jax.grad(loss, argnums=(0, 1, 5)))(*batched)
    for b, example in enumerate((args, other)):
        want = jax.grad(loss, argnums=(0, 1, 5))(*example)
        for x, y in zip(got, want):
            np.testing.assert_array_equal(np.asarray(x[b].astype(jnp.float32)),
                                          np.asarray(y.astype(jnp.float32)))


def test_strided_query_gradient_lands_in_its_columns():
    case, rng = _case(seed=6, edges=False)
    d, heads, hk = case.head_dim, case.q.shape[1], case.num_kv_heads
    qkv, start = C.qkv_with_query(case.q, hk, leading_heads=1)
    li, bt, tr = _meta(case)
    ct = jnp.asarray(C.bf16_random(rng, case.q.shape))

    def strided(table):
        sq = qsa_jax.StridedQuery.from_columns(table, start=start, num_heads=heads, head_dim=d)
        return jnp.vdot(qsa_jax.sparse_attention(sq, case.kv_cache, li, bt, tr, case.output_gate,
                                                 implementation="xla").astype(jnp.float32), ct)

    def compact(q):
        return jnp.vdot(qsa_jax.sparse_attention(q, case.kv_cache, li, bt, tr, case.output_gate,
                                                 implementation="xla").astype(jnp.float32), ct)

    d_table = np.asarray(jax.grad(strided)(jnp.asarray(qkv)).astype(jnp.float32))
    dq = np.asarray(jax.grad(compact)(jnp.asarray(case.q)).astype(jnp.float32))
    cols = slice(start, start + heads * d)
    np.testing.assert_array_equal(d_table[:, cols], dq.reshape(dq.shape[0], -1))
    rest = np.ones(d_table.shape[1], bool)
    rest[cols] = False
    assert (d_table[:, rest] == 0).all()


def test_pallas_backward_lowers_to_triton_for_sm90(monkeypatch):
    """Without a GPU: lower jax.grad (fused and split layouts, and under vmap) through the
    Triton path for CUDA, as if on an H100/H200 -- catches ops the Triton lowering lacks.
    (Compiling the Triton IR to PTX needs the GPU: tests/test_gpu_backward.py.)"""
    import types

    from jax._src.pallas.triton import pallas_call_registration as registration

    from qsa_jax.ops.sparse_attention import backward_pallas, pallas

    monkeypatch.setattr(registration.gpu_info_lib, "get_gpu_info",
                        lambda: types.SimpleNamespace(compute_capability=90))
    monkeypatch.setattr(backward_pallas, "interpret", lambda: False)
    monkeypatch.setattr(pallas, "interpret", lambda: False)
    case, _ = _case(seed=8, rows=2, heads=24, hk=2, d=256, page=64, blocks=40, context=256, edges=False)
    li, bt, tr = _meta(case)
    q = jax.ShapeDtypeStruct(case.q.shape, jnp.bfloat16)
    fused = jax.ShapeDtypeStruct(case.kv_cache.shape, jnp.bfloat16)
    nb, hk, page, d2 = case.kv_cache.shape
    half = jax.ShapeDtypeStruct((nb, page, hk, d2 // 2), jnp.bfloat16)

    def loss(q, kv, g):
        out = qsa_jax.sparse_attention(q, kv, li, bt, tr, g, implementation="pallas")
        return jnp.sum(out.astype(jnp.float32))

    def export(fn, *args):
        checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
        text = jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args).mlir_module()
        assert "qsa_sparse_attention_backward" in text
        return text

    # order=None resolves to the inverted walk here (page 64 takes its 16-slot blocks).
    assert "qsa_sparse_attention_backward_inverted" in export(jax.grad(loss, argnums=(0, 1, 2)), q, fused, q)
    p = _problem(case)
    lse = jax.ShapeDtypeStruct(case.q.shape[:2], jnp.float32)
    inverted = lambda q, kv, g, a, lse, c: backward_pallas.pallas_backward(  # noqa: E731
        p, q, (kv,), li, bt, tr, g, a, lse, c, order="inverted")
    text = export(inverted, q, fused, q, q, lse, q)
    assert "qsa_sparse_attention_backward_inverted" in text
    # Launch warps as set in backward_pallas (measured on the H200: the inverted kernel 2.99 ms
    # at 2 warps against 6.76 at 8, session 9; its dq walk 1.61 ms at 2 against 3.11 at 8,
    # session 10); the selection walk keeps its own.
    import re

    warps = dict(re.findall(r'name = "(\w+)", num_stages = \d+ : i32, num_warps = (\d+)', text))
    assert int(warps["qsa_sparse_attention_backward_inverted"]) == backward_pallas.INVERTED_WARPS == 2
    assert int(warps["qsa_sparse_attention_backward"]) == backward_pallas.INVERTED_DQ_WARPS == 2
    selection = lambda q, kv, g, a, lse, c: backward_pallas.pallas_backward(  # noqa: E731
        p, q, (kv,), li, bt, tr, g, a, lse, c, order="selection")
    text = export(selection, q, fused, q, q, lse, q)
    assert "qsa_sparse_attention_backward_inverted" not in text
    warps = dict(re.findall(r'name = "(\w+)", num_stages = \d+ : i32, num_warps = (\d+)', text))
    assert int(warps["qsa_sparse_attention_backward"]) == backward_pallas.DEFAULT_WARPS == 8
    dq4 = lambda q, kv, g, a, lse, c: backward_pallas.pallas_backward(  # noqa: E731
        p, q, (kv,), li, bt, tr, g, a, lse, c, order="inverted", dq_warps=4)
    warps = dict(re.findall(r'name = "(\w+)", num_stages = \d+ : i32, num_warps = (\d+)',
                            export(dq4, q, fused, q, q, lse, q)))
    assert (int(warps["qsa_sparse_attention_backward"]), int(warps["qsa_sparse_attention_backward_inverted"])) \
        == (4, backward_pallas.INVERTED_WARPS)
    export(jax.grad(lambda q, k, v, g: loss(q, (k, v), g), argnums=(0, 1, 2, 3)), q, half, half, q)
    # One request in a larger pool: the named pages are written straight into the
    # cache-shaped gradient (a masked store on the GPU), both layouts.
    one, _ = _case(seed=8, rows=2, heads=24, hk=2, d=256, page=64, blocks=40, context=256, requests=1,
                   edges=False, num_pages=12)
    p1 = _problem(one)
    assert backward_pallas.named_pages(p1, jnp.asarray(one.block_table)) is not None
    m1 = _meta(one)
    for kv_spec in (jax.ShapeDtypeStruct(one.kv_cache.shape, jnp.bfloat16),
                    (jax.ShapeDtypeStruct(half.shape[:0] + (12,) + half.shape[1:], jnp.bfloat16),) * 2):
        arrays = kv_spec if isinstance(kv_spec, tuple) else (kv_spec,)
        p_kv = p1 if len(arrays) == 1 else check_sparse_attention_args(
            q, arrays, *m1, q, use_prefill_config=False, config=None)
        text = export(lambda q, g, a, lse, c, *kv: backward_pallas.pallas_backward(
            p_kv, q, kv, *m1, g, a, lse, c, order="inverted"), q, q, q, lse, q, *arrays)
        assert "qsa_sparse_attention_backward_inverted" in text
    batch = lambda s: jax.ShapeDtypeStruct((2,) + s.shape, s.dtype)  # noqa: E731
    export(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))), batch(q), batch(fused), batch(q))


@pytest.mark.slow  # ~14 s, nearly all of it compiling the interpreted kernels
def test_bench_backward_cpu_smoke(tmp_path, monkeypatch):
    """bench.backward runs end to end on CPU (interpret mode, reduced sizes) and writes
    its JSON and table."""
    import json
    import sys

    from bench import backward as bench_backward
    from bench import inputs

    from qsa_jax import arg_specs

    # Smaller than the benchmark's own CPU sizes (D = 32, W = 35, a 16-page pool):
    # compiling the interpreted kernels is most of the time.
    for name, value in (("CPU_BLOCKS", 8), ("CPU_CONTEXT", 512), ("CPU_POOL_PAGES", 16)):
        monkeypatch.setattr(inputs, name, value)
    monkeypatch.setitem(arg_specs.GEOMETRIES, "TP4", arg_specs.TP4._replace(head_dim=32))
    monkeypatch.setattr(sys, "argv", ["backward", "--tp", "TP4", "--rows", "1", "--reps", "1",
                                      "--no-xla", "--out", str(tmp_path)])
    assert bench_backward.main() == 0
    records = json.loads((tmp_path / "backward.json").read_text())["results"]
    assert [r["step"] for r in records] == ["forward", "backward", "backward acq_rel atomics", "grad pallas"]
    assert all(r["wall_us"] > 0 and r["busy_us"] is None for r in records)  # no GPU: no trace
    assert "| TP4 | 1 | 1 | backward |" in (tmp_path / "backward.md").read_text()


def test_bench_backward_no_trace_skips_the_profiler(monkeypatch):
    """``--no-trace`` (runs under Nsight Compute, which holds CUPTI): the step is timed by
    wall clock and JAX's profiler is never started."""
    from bench import backward as bench_backward
    from bench import kernel_trace

    def no_profiler(*args, **kwargs):
        raise AssertionError("the profiler was started")

    monkeypatch.setattr(kernel_trace, "trace_runs", no_profiler)
    record, out = bench_backward._measure(lambda x: x * 2, (jnp.ones(4),), 1, trace=False)
    assert record["wall_us"] > 0 and record["busy_us"] is None and float(out[0]) == 2
    with pytest.raises(AssertionError, match="profiler was started"):
        bench_backward._measure(lambda x: x * 2, (jnp.ones(4),), 1)


def test_bench_default_backward_order_retraces():
    """bench.backward's ``--grad-orders``: inside ``default_backward_order`` a jax.grad of the
    Pallas op traces the requested walk (its kernel appears in the jaxpr), and after it the
    default walk again -- JAX's cached custom_vjp backward must not leak across."""
    from bench.backward import default_backward_order

    case = C.sparse_attention_case(np.random.default_rng(0), rows=4, num_query_heads=4, num_kv_heads=2,
                                   head_dim=16, page_size=16, selection_blocks=4, context_tokens=64,
                                   num_pages=8)
    li, bt, tr = (jnp.asarray(x) for x in (case.logical_indices, case.block_table, case.token_to_req))
    args = tuple(jnp.asarray(x) for x in (case.q, case.kv_cache, case.output_gate))

    def traced():
        grad = jax.grad(lambda q, kv, g: qsa_jax.sparse_attention(
            q, kv, li, bt, tr, g, implementation="pallas").astype(jnp.float32).sum(), argnums=(0, 1, 2))
        return str(jax.make_jaxpr(grad)(*args))

    assert "backward_inverted" in traced()  # the default (page 16 takes its 16-slot blocks)
    with default_backward_order("selection"):
        assert "backward_inverted" not in traced()
    assert "backward_inverted" in traced()


def test_default_order_is_inverted_where_it_launches(monkeypatch):
    """order=None takes the inverted walk when its default 16-slot blocks divide the page and
    R x W < 2**31; otherwise the selection walk. The caller's knobs never change that choice:
    they are checked against the walk chosen (an error, not a silent reinterpretation). An
    explicit order is checked, not replaced."""
    from qsa_jax.ops.sparse_attention import backward_pallas as BP

    assert BP.DEFAULT_WALK == "inverted" and BP.FALLBACK_WALK == "selection"
    p16, p8, p48 = (_problem(_case(page=page, context=96, edges=False)[0]) for page in (16, 8, 48))
    assert BP.resolve_order(p16, None) == "inverted"
    assert BP.resolve_order(p8, None) == "selection"  # 16 does not divide 8
    assert BP.resolve_order(p48, None) == "inverted"  # 48 = 3 x 16
    monkeypatch.setattr(BP, "interpret", lambda: False)
    assert BP.resolve_order(p16, None) == "inverted"  # the GPU's rules hold for the defaults too
    assert BP.resolve_order(p8, "inverted") == "inverted"  # explicit: pallas_backward then raises
    # R x W at 2**31 entries: the inverted walk's int32 entry offsets would overflow.
    huge = dataclasses.replace(p16, num_rows=-(-2**31 // p16.selection_width))
    assert BP.resolve_order(huge, None) == "selection"
    assert BP.resolve_order(dataclasses.replace(p16, num_rows=huge.num_rows - 1), None) == "inverted"
    with pytest.raises(ValueError, match="order must be one of"):
        BP.resolve_order(p16, "token-major")


def test_second_order_gradients_of_the_xla_implementation():
    """Hessian-vector products through implementation="xla" (jvp of grad, and grad of a
    function of grad): the per-shard steps of the gradient have a JVP rule (they run whole
    under it, as without a mesh), and the result is the exact function's float64 HVP within a
    few bf16 floors (measured 2.6-2.7x: the straight-through roundings of the forward)."""
    case, rng = _case(seed=3, edges=False)
    li, bt, tr = _meta(case)
    kv, gate = jnp.asarray(case.kv_cache), jnp.asarray(case.output_gate)
    c = jnp.asarray(rng.standard_normal(case.q.shape), jnp.float32)
    u = jnp.asarray(rng.standard_normal(case.q.shape), jnp.float32)

    def loss(q):
        out = qsa_jax.sparse_attention(q.astype(jnp.bfloat16), kv, li, bt, tr, gate, implementation="xla")
        return jnp.sum(out.astype(jnp.float32) * c)

    q = jnp.asarray(case.q).astype(jnp.float32)
    hvp = jax.jvp(jax.grad(loss), (q,), (u,))[1]
    grad_of_grad = jax.grad(lambda q: jnp.sum(jax.grad(loss)(q) * u))(q)
    p = _problem(case)
    with jax.enable_x64(True):
        f64 = lambda x: jnp.asarray(np.asarray(x, np.float64))  # noqa: E731

        def loss64(q):
            return jnp.sum(B.exact_forward(p, q, (f64(case.kv_cache),), li, bt, tr, f64(case.output_gate))[0]
                           * f64(c))

        ref = np.asarray(jax.jvp(jax.grad(loss64), (f64(q),), (f64(u),))[1])
    floor = _rel(jnp.asarray(ref, jnp.bfloat16), ref)
    for got in (hvp, grad_of_grad):
        assert _rel(got, ref) <= 4 * floor, (_rel(got, ref), floor)


@pytest.mark.parametrize("impl, order", [("xla", None), ("pallas", "inverted"), ("pallas", "selection")])
@pytest.mark.parametrize("layout", ["fused", "split"])
def test_fp32_cache_cotangent_rounds_to_the_default(impl, order, layout):
    """kv_dtype=float32 (what each row shard of a mesh returns before the all-reduce): the same
    cache cotangent unrounded -- rounded to bf16 it is the default's, bit for bit; dq and dgate
    unchanged."""
    from qsa_jax.ops.sparse_attention.backward_pallas import pallas_backward

    case, rng = _case(seed=8, page=16, context=64)
    case = C.poison_unreferenced(case)
    kv = ((jnp.asarray(case.kv_cache),) if layout == "fused"
          else tuple(jnp.asarray(x) for x in case.split_caches()))
    meta = _meta(case)
    q, gate = jnp.asarray(case.q), jnp.asarray(case.output_gate)
    ct = jnp.asarray(C.bf16_random(rng, case.q.shape))
    p = check_sparse_attention_args(q, kv if layout == "split" else kv[0], *meta, gate,
                                    use_prefill_config=False, config=None)
    _, attention, lse = B.forward_with_residuals(p, impl, q, kv, *meta, gate)
    backward = B.xla_backward if impl == "xla" else functools.partial(pallas_backward, order=order)
    wide = backward(p, q, kv, *meta, gate, attention, lse, ct, kv_dtype=jnp.float32)
    default = backward(p, q, kv, *meta, gate, attention, lse, ct)
    for name, w, d in zip(("q", "kv", "gate"), wide, default):
        for wl, dl in zip(jax.tree.leaves(w), jax.tree.leaves(d)):
            assert wl.dtype == (jnp.float32 if name == "kv" else dl.dtype), name
            assert np.array_equal(np.asarray(wl.astype(dl.dtype)).view(np.uint16),
                                  np.asarray(dl).view(np.uint16)), name
    # Unrounded: some values lie between bf16 neighbours (a walk that rounds first and widens
    # after would give the same bits above).
    for x in wide[1]:
        x = np.asarray(x)
        assert (x != np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32))).any()


class _RegistryWithoutPallas:
    """The sparse-attention registry of a JAX without Pallas's Triton backend: "pallas"
    cannot run; "triton" stands in as the XLA forward (jax-triton does not import on CPU)."""

    def __init__(self, real):
        self.real = real

    def why_not(self, name):
        return "no Pallas here" if name == "pallas" else self.real.why_not(name)

    def run(self, name):
        assert name != "pallas", "a gradient of triton called Pallas where it cannot run"
        return self.real.run("xla" if name == "triton" else name)


@pytest.mark.parametrize("pallas_runs", [True, False])
def test_triton_gradient_takes_pallas_or_else_xla(monkeypatch, pallas_runs):
    """"triton" keeps no residuals: its gradient takes the Pallas residual forward and backward,
    or the XLA ones where Pallas cannot run (before, it called Pallas regardless)."""
    case, _ = _case(3)
    ct = C.bf16_random(np.random.default_rng(3), case.q.shape)
    problem, arrays = _problem(case), (jnp.asarray(case.q), (jnp.asarray(case.kv_cache),), *_meta(case),
                                       jnp.asarray(case.output_gate))
    if not pallas_runs:
        monkeypatch.setattr(B, "_registry", lambda: _RegistryWithoutPallas(qsa_jax._implementations.REGISTRIES[
            "sparse_attention"]))
    assert B.gradient_implementation("triton") == ("pallas" if pallas_runs else "xla")
    assert B.gradient_implementation("xla") == "xla" and B.gradient_implementation("pallas") == "pallas"
    if pallas_runs:
        return  # the Pallas route is what every other test of "pallas" gradients runs
    out, pull = jax.vjp(lambda q, kv, g: B.differentiable(problem, "triton", q, kv, *arrays[2:5], g, None),
                        arrays[0], arrays[1], arrays[5])
    got = pull(jnp.asarray(ct))
    want_out, want = _vjp(case, "xla", ct)
    for x, y in zip(jax.tree.leaves((out, got)), jax.tree.leaves((want_out, (want[0], (want[1],), want[2])))):
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))


def test_registry_names_an_implementation_that_does_not_import():
    from qsa_jax._implementations import Registry

    registry = Registry("sparse_attention", "qsa_jax.ops.no_such_package")
    with pytest.raises(NotImplementedError, match="'pallas' cannot run here"):
        registry.run("pallas")


@pytest.mark.parametrize("impl", IMPLS)
def test_float32_gate_gets_a_float32_cotangent(impl):
    """An fp32 gate (read at full width, as the originals read any float gate) gets an fp32
    cotangent; all three cotangents stay within the bf16 bars of the float64 gradient at that
    gate (the attention residual is bf16 either way)."""
    case, rng = _case(seed=12, rows=4, heads=12, hk=2, d=32, page=8, blocks=12, context=64)
    case.output_gate = C.off_grid_gate(rng, case.output_gate)
    ct = C.bf16_random(rng, case.q.shape)
    _, grads = _vjp(case, impl, ct)
    exact = _exact_grads(case, ct)
    assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.bfloat16, jnp.float32]
    for name, mine, ref in zip(("q", "kv", "gate"), grads, exact):
        floor = _rel(jnp.asarray(ref, jnp.bfloat16), ref)
        assert _rel(mine, ref) <= BF16_BAR[impl][name] * floor, name
