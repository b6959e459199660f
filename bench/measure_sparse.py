"""Measuring sparse attention: one K/V pool per (TP geometry, cache dtype), fresh input
sets per row count, every implementation per (rows, use_prefill_config), checked against
the original (or, without one on CPU, the float64 oracle of the same tiling)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterator

import jax
import numpy as np

import qsa_jax
from bench import inputs as I
from bench.measure import (TORCH_IMPLS, Context, Draft, JaxCalls, jax_measure, measure_impls, prepare_jax,
                           torch_measure)
from bench.records import AUTO, ORIGINALS, SHIMS, Case, CaseResult, Check, Workload
from bench.timing import eager_latency_once_each, eager_latency_paired, sequential_calls
from qsa_testing import agreement

# Dequantisation scales of the fp8 rows: other than 1 so that a dropped or swapped
# scale shows in the check.
FP8_K_SCALE, FP8_V_SCALE = 0.5, 2.0
# --cold-l2: the K/V bytes one timed unit reads, at least this many times the card's L2, and at
# most this many sets (sets_per_unit).
COLD_L2_FACTOR, COLD_L2_MAX_SETS = 4, 256
# The whole output's relative Frobenius error from the reference that ``check`` allows beside
# the accuracy contract on its sampled rows (see there).
WHOLE_OUTPUT_BAR = 1e-2


def measure_geometry(ctx: Context, tp: str, kv_dtype: str, cases: list[Case]) -> Iterator[CaseResult]:
    """The results of ``cases`` (all of geometry ``tp`` and ``kv_dtype``, grouped by rows
    then use_prefill_config, as ``bench.run`` plans them) on one pool."""
    geo = ctx.geometries[tp]
    fp8 = kv_dtype == "fp8"
    torch = None
    if ctx.torch_modules:
        import torch
    kv_t, kv = I.make_pool(geo, gpu=ctx.gpu and torch is not None, seed=ctx.seed + 17, fp8=fp8)
    scales = dict(k_scale=FP8_K_SCALE, v_scale=FP8_V_SCALE) if fp8 else {}
    ctx.say(f"{cases[0].geometry}: pool {geo.pool_pages} pages x Hk {geo.num_kv_heads} x P {geo.page_size} "
            f"x 2D {2 * geo.head_dim} {kv_dtype}; W = {geo.selection_width}")
    oracle_kv = []  # the pool on the host, split, made once when the oracle needs it
    try:
        for rows, by_rows in itertools.groupby(cases, key=lambda c: c.rows):
            inp = I.sparse_inputs(geo, rows, sets_per_unit(ctx, geo, rows, fp8),
                                  ctx.seed + 1000 * rows + geo.num_query_heads, own_requests=ctx.cold_l2)
            tt = _torch_inputs(inp, kv_t, geo, fp8) if torch is not None else None
            for flag, same in itertools.groupby(by_rows, key=lambda c: c.use_prefill_config):
                yield from _measure_shape(ctx, geo, kv, inp, tt, flag, list(same), scales, oracle_kv)
            del inp, tt
    finally:
        del kv, kv_t
        if torch is not None:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def l2_bytes(gpu: bool) -> int:
    """The current GPU's L2 size (torch's device properties; 50 MiB, an H100's, where torch
    does not say), 0 off a GPU."""
    if not gpu:
        return 0
    try:
        import torch

        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size)
    except Exception:  # no torch, or a torch without the field
        return 50 << 20


def sets_per_unit(ctx, geo, rows: int, fp8: bool) -> int:
    """Input sets (calls) per timed unit: ``--n-calls``; with ``--cold-l2`` at least as many as
    make the unit's K/V reads COLD_L2_FACTOR x the L2 (each set its own requests' pages), so a
    cyclic replay of the unit cannot find them there (at most COLD_L2_MAX_SETS)."""
    if not ctx.cold_l2:
        return ctx.n_calls
    per_call = I.sparse_bytes(geo, rows, rows * geo.selection_width, kv_bytes=1 if fp8 else 2)["total"]
    return min(COLD_L2_MAX_SETS, max(ctx.n_calls, -(-COLD_L2_FACTOR * l2_bytes(ctx.gpu) // per_call)))


def _torch_inputs(inp, kv_t, geo, fp8) -> dict:
    """The same inputs as torch tensors (zero-copy), K/V as vLLM's strided views of the pool."""
    import torch

    from qsa_testing.torch_interop import kv_views

    k_c, v_c = kv_views(kv_t, geo.head_dim)
    return dict(q=torch.from_dlpack(inp.q), gate=torch.from_dlpack(inp.gate),
                bt=torch.from_dlpack(inp.block_table), t2r=[torch.from_dlpack(x) for x in inp.t2r],
                idx=[torch.from_dlpack(x) for x in inp.idx], k=k_c, v=v_c,
                scales=(FP8_K_SCALE, FP8_V_SCALE) if fp8 else ())


def _measure_shape(ctx, geo, kv, inp, tt, flag, cases, scales, oracle_kv) -> Iterator[CaseResult]:
    """Every implementation at one (rows, use_prefill_config)."""
    rows, fp8 = cases[0].rows, bool(scales)
    impls = [c.impl for c in cases]
    mean_valid = float(np.mean(inp.valid_entries))
    cfg = qsa_jax.select_config(rows, geo.num_kv_heads, flag, geo.selection_width,
                                **({"is_fp8": True} if fp8 else {}))
    workload = Workload(bytes_per_call=I.sparse_bytes(geo, rows, mean_valid, kv_bytes=1 if fp8 else 2),
                        config=tuple(cfg), config_fields=tuple(cfg._fields), valid_entries_per_call=mean_valid)
    ref = ref_name = None
    if "original" not in impls and not ctx.gpu:
        ref, ref_name = _oracle(geo, kv, inp, cfg, scales, oracle_kv), "float64 oracle"
    pre, pre_s = prepare_jax(impls, functools.partial(_jax_calls, kv, inp, flag, scales=scales))
    exact = None
    paired: dict = {}  # "baseline": (the first original's name, its eager calls) (_measure_torch)

    def measure_one(case: Case, draft: Draft) -> Check | None:
        nonlocal ref, ref_name, exact
        if case.impl in TORCH_IMPLS:
            got = _measure_torch(ctx, case, draft, tt, flag, paired)
        else:
            got = jax_measure(ctx, case, draft, pre[case.impl], pre_s)
        if case.impl in ORIGINALS and ref is None:
            ref, ref_name = got, case.impl
            return Check(ok=True, reference="itself")
        if ref is None and ctx.gpu:  # no original: the first implementation is the reference
            ref, ref_name = got, case.impl
            return Check(ok=True, reference="itself (no original)")
        if exact is None and ref is not None:
            exact = _exact_rows(kv, inp, rows, scales)
        return check(got, ref, ref_name, exact)

    yield from measure_impls(ctx, cases, workload, measure_one)


def _oracle(geo, kv, inp, cfg, scales, oracle_kv):
    """The float64 oracle at the tiling of ``cfg`` (CPU mode's reference)."""
    from qsa_testing.oracle import sparse_attention_oracle

    if not oracle_kv:
        kvn = np.asarray(kv).transpose(0, 2, 1, 3)
        oracle_kv += [kvn[..., :geo.head_dim], kvn[..., geo.head_dim:]]
    return sparse_attention_oracle(
        np.asarray(inp.q), oracle_kv[0], oracle_kv[1], np.asarray(inp.idx[0]),
        np.asarray(inp.block_table), np.asarray(inp.token_to_req), np.asarray(inp.gate),
        block_n=cfg.block_n, num_tiles=cfg.num_tiles, num_splits=cfg.num_splits, **scales)


def check(got, ref, ref_name, exact=None) -> Check | None:
    """The contracts of docs/spec.md §6 against the reference (the originals on a GPU, the
    float64 tiling-faithful oracle on CPU). ``exact``: (rows, exact float64 attention of those
    rows) or None. With it, ``ok`` is the accuracy contract, which holds for any tiling (the
    default route's launch table on Hopper may change the tiling); the fidelity measures
    against the reference are recorded beside it. Without it, ``ok`` is fidelity."""
    if ref is None:
        return None
    a = np.asarray(got, np.float64)
    e = np.asarray(ref, np.float64)
    if a.shape != e.shape:
        return Check(ok=False, reference=ref_name, why=f"shape {a.shape} != {e.shape}")
    fid = agreement.fidelity(a, e)
    res = Check(ok=fid["ok"], contract="fidelity", reference=ref_name, rel_err=fid["rel_err"],
                ulp_fraction=fid["ulp_fraction"], nan=fid["nan"],
                nonzero_where_reference_zero=fid["nonzero_where_zero"], fidelity_ok=fid["ok"])
    if exact is None:
        return res
    rows, ex = exact
    acc = agreement.accuracy(a[rows], e[rows], ex)
    # The accuracy contract sees up to 16 rows; the rest of the output must not hide a NaN, a
    # written row where the reference's is empty (zero whatever the tiling), or garbage: two
    # good tilings differ by about their own error (2-4e-3), one wrong row in 4096 by 1.6e-2.
    whole = [why for bad, why in ((fid["nan"], f"{fid['nan']} NaN in the output"),
                                  (fid["nonzero_where_zero"],
                                   f"{fid['nonzero_where_zero']} elements nonzero where the reference row is empty"),
                                  (not fid["rel_err"] <= WHOLE_OUTPUT_BAR,
                                   f"relative error {fid['rel_err']:.1e} from the reference over the whole output "
                                   f"> {WHOLE_OUTPUT_BAR:g}")) if bad]
    return dataclasses.replace(res, ok=acc["ok"] and not whole, contract="accuracy", exact_rows=len(rows),
                               err_exact=acc["err"], err_exact_reference=acc["err_originals"],
                               exact_ratio=acc["ratio"], why="; ".join(whole) or None)


def _exact_rows(kv, inp, rows, scales):
    """(rows, exact float64 attention) for up to 16 rows spread over the batch, the cache
    rows they name fetched from the pool (a multi-GB pool never comes to the host whole).
    An fp8 pool (uint8 e4m3 bytes) is read at its e4m3 values, times the scales."""
    import ml_dtypes

    from qsa_testing.exact import exact_attention_fetched, spread_rows

    jnp = jax.numpy

    def fetch(pages, slots):
        got = np.asarray(kv[jnp.asarray(pages), :, jnp.asarray(slots)])
        return got.view(ml_dtypes.float8_e4m3fn) if got.dtype == np.uint8 else got

    picked = spread_rows(rows)
    ex = exact_attention_fetched(
        np.asarray(inp.q), fetch, tuple(kv.shape), np.asarray(inp.idx[0]), np.asarray(inp.block_table),
        np.asarray(inp.token_to_req), np.asarray(inp.gate), rows=picked, **scales)
    return picked, ex


def _many(q, kv, sets, block_table, gate, *, flag, impl, scales):
    """N calls in sequence, one per (selection, token_to_req) set (one jitted function)."""
    return sequential_calls(lambda s: qsa_jax.sparse_attention(
        q, kv, s[0], block_table, s[1], gate, use_prefill_config=flag, implementation=impl, **scales),
        sets)


def _jax_calls(kv, inp, flag, impl, *, scales) -> JaxCalls:
    impl = None if impl == AUTO else impl  # the library's own choice

    def one(i):
        return qsa_jax.sparse_attention(inp.q, kv, inp.idx[i], inp.block_table, inp.t2r[i], inp.gate,
                                        use_prefill_config=flag, implementation=impl, **scales)

    return JaxCalls(first=lambda: np.asarray(jax.block_until_ready(one(0))),
                    calls=[functools.partial(one, i) for i in range(len(inp.idx))],
                    many=jax.jit(functools.partial(_many, flag=flag, impl=impl, scales=scales)),
                    args=(inp.q, kv, tuple(zip(inp.idx, inp.t2r)), inp.block_table, inp.gate))


def _measure_torch(ctx, case, draft, tt, flag, paired):
    import torch

    from qsa_testing.torch_interop import to_numpy

    fn = ctx.torch_modules[case.impl].qsa_sparse_paged_attention
    out = torch.empty_like(tt["q"])
    calls = [functools.partial(fn, tt["q"], tt["k"], tt["v"], idx, tt["bt"], t2r, flag, out, *tt["scales"],
                               output_gate=tt["gate"]) for idx, t2r in zip(tt["idx"], tt["t2r"])]
    got = torch_measure(ctx, case, draft, calls, to_numpy)
    # The shape's original (0.30.0's, or 0.34.0's where 0.30.0 has no path), measured first,
    # leaves its calls for the shims: their eager latency timed in turns with it.
    if case.impl in ORIGINALS:
        paired.setdefault("baseline", (case.impl, calls))
    elif case.impl in SHIMS and "baseline" in paired:
        name, baseline = paired["baseline"]
        draft.timing.update(eager_latency_paired(baseline, calls, lambda _: torch.cuda.synchronize(),
                                                 count=ctx.eager_calls), eager_paired_with=name)
    # vLLM passes new q/gate activations every step (its metadata buffers persist): time
    # calls whose q, gate and indices are tensor objects never seen before (the shim's
    # import cache misses on them). Small shapes only (the clones are made up front).
    count = ctx.eager_calls
    if case.impl in SHIMS and 2 * tt["q"].numel() * tt["q"].element_size() * count <= 2**30:
        fresh = [functools.partial(fn, tt["q"].clone(), tt["k"], tt["v"], tt["idx"][i % len(tt["idx"])].clone(),
                                   tt["bt"], tt["t2r"][i % len(tt["t2r"])], flag, out, *tt["scales"],
                                   output_gate=tt["gate"].clone())
                 for i in range(count + 1)]
        torch.cuda.synchronize()
        timed = eager_latency_once_each(fresh, lambda _: torch.cuda.synchronize())
        draft.timing["eager_new_tensors_s"] = timed["eager_s"]
    return got
