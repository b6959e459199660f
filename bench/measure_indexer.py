"""Measuring the indexer ops (compress_groups_with_ratio, store_cache_rows): N independent
input sets per (op, ring, rows), every implementation, outputs compared bit-exactly with the
original's (or, without one on CPU, the float64 oracle's)."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

import qsa_jax
from bench import inputs as I
from bench.measure import TORCH_IMPLS, Context, Draft, JaxCalls, jax_measure, measure_impls, prepare_jax, torch_measure
from bench.records import Case, CaseResult, Check, Workload
from bench.timing import sequential_calls
from qsa_testing import agreement

COMPRESS, STORE = "compress_groups_with_ratio", "store_cache_rows"
RATIO = 4  # the compress ratio (tokens per group) the model uses


def measure_case(ctx: Context, op: str, ring: int, rows: int, cases: list[Case]) -> Iterator[CaseResult]:
    """The results of ``cases`` (every implementation of ``op`` at one ring and row count)."""
    impls = [c.impl for c in cases]
    torch_needed = any(i in TORCH_IMPLS for i in impls)
    oracle = not ctx.gpu and "original" not in impls  # CPU mode's reference
    ref = None
    if op == COMPRESS:
        sets = I.compress_sets(ctx.seed + 7 * rows + ring, ctx.n_calls, rows, ring)
        workload = Workload(bytes_per_call=I.compress_bytes(rows))
        jx = [_compress_jax_inputs(c) for c in sets]
        tx = [_compress_torch_inputs(c) for c in sets] if torch_needed else None
        if oracle:
            from qsa_testing.oracle import compress_groups_oracle

            c0 = sets[0]
            ref = compress_groups_oracle(c0.raw_keys, c0.raw_positions, c0.compressor_state_cache,
                                         c0.compressor_state_block_table, c0.token_to_req,
                                         c0.query_start_loc, c0.logical_positions, c0.compressed_slots,
                                         RATIO, c0.rope_cache)
        pre, pre_s = prepare_jax(impls, functools.partial(_compress_jax_calls, jx))
    else:
        cache_np, sets_np = I.store_sets(ctx.seed + 11 * rows + ring, ctx.n_calls, rows, ring)
        workload = Workload(bytes_per_call=I.store_bytes(rows))
        if oracle:
            from qsa_testing.oracle import store_cache_rows_oracle

            ref = store_cache_rows_oracle(cache_np, *sets_np[0])
        sets_j = [(jnp.asarray(a), jnp.asarray(b)) for a, b in sets_np]
        pre, pre_s = prepare_jax(impls, functools.partial(_store_jax_calls, cache_np, sets_j))
    ref_name = "float64 oracle"

    def measure_one(case: Case, draft: Draft) -> Check | None:
        nonlocal ref, ref_name
        if case.impl in TORCH_IMPLS and op == COMPRESS:
            got = _compress_torch(ctx, case, draft, tx)
        elif case.impl in TORCH_IMPLS:
            got = _store_torch(ctx, case, draft, cache_np, sets_np)
        else:
            got = jax_measure(ctx, case, draft, pre[case.impl], pre_s)
            if op == STORE:
                draft.timing["method"] += " (cache donated and chained through the N stores)"
        if case.impl == "original" or (ref is None and ctx.gpu):
            ref, ref_name = got, case.impl
            return Check(ok=True, reference="itself")
        return check_exact(got, ref, ref_name)

    yield from measure_impls(ctx, cases, workload, measure_one)


def check_exact(got, ref, ref_name) -> Check | None:
    """Bit-exact comparison of (pooled, first_positions) or of the stored cache."""
    if ref is None:
        return None
    got = got if isinstance(got, tuple) else (got,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    exact, mismatches, rel_errs = [], {}, {}
    for k, (a, e) in enumerate(zip(got, ref)):
        a64, e64 = np.asarray(a, np.float64), np.asarray(e, np.float64)
        if a64.shape != e64.shape:
            a64 = a64.reshape(e64.shape) if a64.size == e64.size else a64
        same = a64.shape == e64.shape and bool(np.array_equal(a64, e64))
        exact.append(same)
        if not same and a64.shape == e64.shape:
            mismatches[k] = int((a64 != e64).sum())
            rel_errs[k] = agreement.rel_frobenius(a64, e64)
    return Check(ok=all(exact), reference=ref_name, exact=tuple(exact), mismatches=mismatches or None,
                 output_rel_err=rel_errs or None)


# --- compress_groups_with_ratio ------------------------------------------------------------


def _compress_torch_inputs(case):
    """Torch tensors as vLLM lays them out: the ring is the first 128 channels of a 140-wide
    bf16 storage whose last 12 bf16 slots are the int64 rope positions."""
    import torch

    from qsa_jax import arg_specs
    from qsa_testing.torch_interop import to_torch

    ring = case.compressor_state_cache
    bs, s, _, dk = ring.shape
    storage = torch.zeros((bs, s, 1, arg_specs.INDEXER_ROW_WIDTH), dtype=torch.bfloat16, device="cuda")
    storage[..., :dk] = to_torch(ring)
    rope = storage[..., dk:].view(torch.int64)
    rope.copy_(to_torch(case.rope_cache))
    return (to_torch(case.raw_keys), to_torch(case.raw_positions), storage[..., :dk],
            to_torch(case.compressor_state_block_table), to_torch(case.token_to_req),
            to_torch(case.query_start_loc), to_torch(case.logical_positions),
            to_torch(case.compressed_slots), rope)


def _compress_jax_inputs(case):
    # JAX runs without x64: positions travel as int32 (they fit).
    return (jnp.asarray(case.raw_keys), jnp.asarray(case.raw_positions.astype(np.int32)),
            jnp.asarray(case.compressor_state_cache), jnp.asarray(case.compressor_state_block_table),
            jnp.asarray(case.token_to_req), jnp.asarray(case.query_start_loc),
            jnp.asarray(case.logical_positions), jnp.asarray(case.compressed_slots),
            jnp.asarray(case.rope_cache.astype(np.int32)))


def _many_compress(sets, *, impl):
    return sequential_calls(lambda s: qsa_jax.compress_groups_with_ratio(
        *s[:8], RATIO, s[8], implementation=impl), sets)


def _compress_jax_calls(jx, impl) -> JaxCalls:
    calls = [functools.partial(qsa_jax.compress_groups_with_ratio, *s[:8], RATIO, s[8], implementation=impl)
             for s in jx]

    def first():
        pooled, fp = jax.block_until_ready(calls[0]())
        return np.asarray(pooled), np.asarray(fp)

    return JaxCalls(first, calls, jax.jit(functools.partial(_many_compress, impl=impl)), (tuple(jx),))


def _compress_torch(ctx, case, draft, tx):
    from qsa_testing.torch_interop import to_numpy

    fn = ctx.torch_modules[case.impl].qsa_compress_groups_with_ratio
    calls = [functools.partial(fn, *t[:8], RATIO, t[8]) for t in tx]
    return torch_measure(ctx, case, draft, calls, lambda res: (to_numpy(res[0]), to_numpy(res[1])))


# --- store_cache_rows ------------------------------------------------------------------------


def _many_store(cache, sets, *, impl):
    for slots, rows in sets:
        cache = qsa_jax.store_cache_rows(cache, slots, rows, implementation=impl)
    return cache


def _store_jax_calls(cache_np, sets, impl) -> JaxCalls:
    def first():
        return np.asarray(jax.block_until_ready(
            qsa_jax.store_cache_rows(jnp.asarray(cache_np), *sets[0], implementation=impl)))

    # Eager: the cache is donated and updated in place, as a serving loop would; the
    # timed N-call function then continues from (and donates) the eager loop's cache.
    box = [jnp.asarray(cache_np)]

    def step(i):
        box[0] = qsa_jax.store_cache_rows(box[0], *sets[i], donate=True, implementation=impl)
        return box[0]

    return JaxCalls(first, [functools.partial(step, i) for i in range(len(sets))],
                    jax.jit(functools.partial(_many_store, impl=impl), donate_argnums=0),
                    (box[0], tuple(sets)), lambda: (box[0], tuple(sets)))


def _store_torch(ctx, case, draft, cache_np, sets_np):
    from qsa_testing.torch_interop import to_numpy, to_torch

    fn = ctx.torch_modules[case.impl].qsa_store_cache_rows
    cache = to_torch(cache_np)
    sets = [(to_torch(s), to_torch(r)) for s, r in sets_np]
    calls = [functools.partial(fn, cache, s, r) for s, r in sets]
    return torch_measure(ctx, case, draft, calls, lambda _: to_numpy(cache))
