"""The operators inside a caller's ``jax.shard_map``, run in a process with forced host devices.

``python -m qsa_testing.shard_map_checks`` must start with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (tests/test_shard_map.py does that)
and prints one JSON list of cases, each with its ``problem`` (None when it passed).

Inside ``shard_map`` the operators see local arrays; with ``check_vma=True`` (JAX's
default) JAX also types each array with the manual axes it varies over (qsa_jax/ops/_vma.py).
Checked here, for every implementation that can run or lower on this machine:

- results and gradients (``jax.vjp`` through the ``shard_map``, as training takes them) bit
  for bit against each shard's own one-device calls, for heads, rows and rows x heads
  layouts: a cache replicated over the row axis gets the row shards' cotangents summed in
  fp32 and rounded once (``sharding_checks.per_shard_reference``), by a float32 psum;
- independent per-device problems (data-parallel serving: each device its own cache and
  block table) for all three operators;
- the results' types: ``out_specs`` that claim a varying result replicated are refused
  (xla, jax-triton traced, Pallas lowered for CUDA), so no device's value is silently kept;
- Pallas lowered for CUDA (forward, gradient, indexer operators) with the check on; its CPU
  interpreter refused with a clear error, and the JAX limitation behind that refusal
  still present (a canary that fails once a JAX upgrade lifts it);
- vLLM 0.34's fp8 arithmetic with host and per-device traced k/v scales, and its gradients
  (the replicated scales get the shards' summed cotangent, also where the shard_map leaves an
  Explicit axis to the operator); ``shard_map``s
  manual over some axes only (Auto mesh: XLA gathers what is split over the automatic axis;
  Explicit mesh: per shard, its gradient with a replicated cache refused);
- second derivatives, and ``check_vma=False`` (the forward bit for bit; there JAX sums a
  replicated cache's cotangent itself, in bf16).
"""

from __future__ import annotations

import functools
import json
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import qsa_jax
from qsa_testing.cases import E4M3, compress_case, store_case
from qsa_testing.gradients import BF16_BAR
from qsa_testing.sharding_checks import (ROWS, _kv_error_over_floor, _psum_dtypes, _run_case, attention_case,
                                         attention_layouts, bits, collectives_in, make_mesh, mesh_case,
                                         per_shard_reference, shard_vjp)
from qsa_testing.sharding_checks import put as sharding_put

COMPRESS_ORDER = ("raw_keys", "raw_positions", "compressor_state_cache", "compressor_state_block_table",
                  "token_to_req", "query_start_loc", "logical_positions", "compressed_slots")


def _differs(label, got, want) -> str | None:
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    if len(got_leaves) != len(want_leaves):
        return f"{label}: {len(got_leaves)} arrays, expected {len(want_leaves)}"
    for g, w in zip(got_leaves, want_leaves):
        g, w = np.asarray(g), np.asarray(w).reshape(np.shape(g))
        if not np.array_equal(bits(g), bits(w)):
            return f"{label}: {int(np.sum(bits(g) != bits(w)))} elements differ from the shards' one-device calls"
    return None


def _attention_specs(mc):
    kv = P(None, mc.heads_ax) if mc.fused else (P(None, None, mc.heads_ax),) * 2
    rows_heads, rows = P(mc.rows_ax, mc.heads_ax), P(mc.rows_ax)
    return (rows_heads, kv, rows, P(), rows, rows_heads), rows_heads


def _mapped_attention(mc, implementation, check_vma, out_specs=None):
    """(q, kv, logical_indices, block_table, token_to_req, gate) -> output, under shard_map."""
    in_specs, out = _attention_specs(mc)
    return jax.shard_map(
        lambda q, kv, li, bt, t2r, gate: qsa_jax.sparse_attention(q, kv, li, bt, t2r, gate,
                                                                  implementation=implementation),
        mesh=mc.mesh, in_specs=in_specs, out_specs=out if out_specs is None else out_specs, check_vma=check_vma)


def _host_args(mc):
    c = mc.case
    return tuple(jax.tree.map(jnp.asarray, (c.q, mc.kv, c.logical_indices, c.block_table, c.token_to_req,
                                            c.output_gate)))


def _mapped_vjp(mc, implementation, check_vma):
    """jax.vjp through the shard_map: (q, kv, gate, d_out) -> (out, dq, dkv, dgate)."""
    mapped = _mapped_attention(mc, implementation, check_vma)
    _, _, li, bt, t2r, _ = _host_args(mc)

    def f(q, kv, gate, d_out):
        out, pull = jax.vjp(lambda q, kv, gate: mapped(q, kv, li, bt, t2r, gate), q, kv, gate)
        return (out, *pull(d_out))

    return jax.jit(f)


def _expected(mc, implementation, d_out):
    """(out, dq, dkv, dgate) from the shards' one-device vjps (the cache's summed in fp32)."""
    case = mc.case

    def one_device(q, kv, li, t2r, gate, d):
        return shard_vjp(implementation, mc.config, q, kv, jnp.asarray(li), jnp.asarray(case.block_table),
                         jnp.asarray(t2r), gate, jnp.asarray(d))

    return per_shard_reference(mc.shards, mc.fused, case, mc.kv, d_out, one_device)


def attention_check(layout, fused, check_vma, seed):
    lname, shape, names, rows_ax, heads_ax = layout
    mc = mesh_case(shape, names, rows_ax, heads_ax, fused, False, seed=seed)
    d_out = np.random.default_rng(seed).standard_normal(mc.case.q.shape).astype(mc.case.q.dtype)
    want = _expected(mc, "xla", d_out)
    q, kv, li, bt, t2r, gate = _host_args(mc)
    forward = jax.jit(_mapped_attention(mc, "xla", check_vma))
    problem = _differs("output", forward(q, kv, li, bt, t2r, gate), want[0])
    if problem:
        return problem
    grads = _mapped_vjp(mc, "xla", check_vma)
    args = (q, kv, gate, jnp.asarray(d_out))
    got = grads(*args)
    for label, g, w in zip(("output", "dq", "dgate"), got[:2] + got[3:], want[:2] + want[3:]):
        problem = _differs(label, g, w)
        if problem:
            return problem
    # The cache cotangent: bit for bit where rows are split (the shards' fp32 sum, rounded
    # once). With rows whole there is no sum, and XLA on CPU fuses the final rounding
    # differently in this program and in the one-device one (1-ulp differences in a few
    # elements, the same without the check): measured against float64 instead.
    # check_vma=False: JAX sums the row shards' bf16 cotangents itself, rounded twice (1.14x /
    # 1.17x the floor here, fused / split, against 1.02x / 1.03x with the check on).
    bar = BF16_BAR["xla"]["kv"] if check_vma or not rows_ax else 1.5
    ratio = _kv_error_over_floor(mc.case, mc.kv, mc.config, d_out, got[2])
    if not ratio <= bar:
        return f"dkv error {ratio:.2f}x the bf16 floor (bar {bar}x)"
    if rows_ax and check_vma:
        problem = _differs("dkv", got[2], want[2])
        if problem:
            return problem
    psums = _psum_dtypes(grads, args)
    if check_vma and rows_ax and set(psums) != {"float32"}:
        return f"rows split: the cache cotangent's psum operands are {psums}, expected float32 only"
    if not check_vma and rows_ax and set(psums) != {"bfloat16"}:  # JAX's own sum, rounded twice
        return f"check_vma=False: psum operands {psums} (the README says JAX sums the bf16 cotangents)"
    if not rows_ax and (psums or collectives_in(grads, *args)):
        return f"rows whole: the program sums ({psums}, {collectives_in(grads, *args)})"
    return None


def scaled_check():
    """vLLM 0.34's arithmetic inside shard_map: an e4m3 cache with k/v scales, rows x heads over
    a 2 x 2 mesh, equal to each shard's one-device call (host scales, and per-device traced
    scales varying over "data")."""
    mc = mesh_case((2, 2), ("data", "model"), "data", "model", True, False, seed=17, kv_dtype=E4M3)
    case = mc.case
    q, kv, li, bt, t2r, gate = _host_args(mc)
    in_specs, out = _attention_specs(mc)
    host = per_shard_reference(mc.shards, True, case, mc.kv, case.q, lambda q, kv_, li, t2r, gate, _: (
        qsa_jax.sparse_attention(q, kv_, jnp.asarray(li), jnp.asarray(case.block_table), jnp.asarray(t2r), gate,
                                 config=mc.config, implementation="xla", k_scale=0.5, v_scale=2.0),))[0]
    mapped = jax.jit(jax.shard_map(lambda *a: qsa_jax.sparse_attention(
        *a, implementation="xla", k_scale=0.5, v_scale=2.0), mesh=mc.mesh, in_specs=in_specs, out_specs=out))
    problem = _differs("host scales", mapped(q, kv, li, bt, t2r, gate), host)
    if problem:
        return problem
    # Traced scales, one pair per row shard: shard i scales by (0.5, 2.0) * (i + 1).
    scales = jnp.asarray([[0.5, 2.0], [1.0, 4.0]], jnp.float32)
    traced = jax.jit(jax.shard_map(lambda s, *a: qsa_jax.sparse_attention(
        *a, implementation="xla", k_scale=s[0, 0], v_scale=s[0, 1]), mesh=mc.mesh,
        in_specs=(P("data"),) + in_specs, out_specs=out))
    got = np.asarray(traced(scales, q, kv, li, bt, t2r, gate))
    half = ROWS // 2
    for i, (ks, vs) in enumerate(np.asarray(scales)):
        want = per_shard_reference(mc.shards, True, case, mc.kv, case.q, lambda q, kv_, li, t2r, gate, _: (
            qsa_jax.sparse_attention(q, kv_, jnp.asarray(li), jnp.asarray(case.block_table), jnp.asarray(t2r), gate,
                                     config=mc.config, implementation="xla", k_scale=float(ks),
                                     v_scale=float(vs)),))[0]
        shard = slice(i * half, (i + 1) * half)
        problem = _differs(f"traced scales, row shard {i}", got[shard], want[shard])
        if problem:
            return problem
    return None


def scaled_gradient_checks(results):
    """Gradients of the scales (and of q) through vLLM 0.34's arithmetic inside shard_map, with
    per-device e4m3 caches and rows split over "data": the scales, replicated, get the sum of the
    shards' cotangents (to fp32 rounding), q each shard's own. Fully manual (rows x heads, check
    on and off) and manual over "data" only with heads over the Explicit "model" axis (there the
    operator's own shard_map cannot see "data": backward._bwd sums the pair)."""
    mc = mesh_case((2, 2), ("data", "model"), "data", "model", True, True, seed=19, kv_dtype=E4M3)
    case, mesh = mc.case, mc.mesh
    bt = jnp.asarray(case.block_table)
    ct = np.random.default_rng(19).standard_normal(case.q.shape).astype(np.float32)

    def loss(q, kv, li, t2r, g, ks, vs, c, config=None):
        out = qsa_jax.sparse_attention(q, kv, li, bt, t2r, g, implementation="xla", k_scale=ks, v_scale=vs,
                                       config=config)
        return jnp.sum(out.astype(jnp.float32) * c)

    # The reference at the (row, head) shard's own tiling, which the shards pick for themselves.
    grad = jax.jit(jax.grad(functools.partial(loss, config=tuple(mc.config)), (0, 5, 6)))
    half = ROWS // 2
    want_q, want_scales = [], np.zeros(2)
    for i in range(2):  # each row shard: its own problem on the whole (per-device) cache
        rows = slice(i * half, (i + 1) * half)
        dq, dks, dvs = grad(jnp.asarray(case.q[rows]), jnp.asarray(mc.kv), jnp.asarray(case.logical_indices[rows]),
                            jnp.asarray(case.token_to_req[rows]), jnp.asarray(case.output_gate[rows]),
                            jnp.float32(0.5), jnp.float32(2.0), jnp.asarray(ct[rows]))
        want_q.append(np.asarray(dq, np.float32))
        want_scales += (float(dks), float(dvs))
    kv_per_device = np.stack([np.asarray(mc.kv)] * 2)  # [2, NB, Hk, P, 2D], split over "data"

    def body(axes):  # the loss summed over the shards that split it
        return lambda q, kv, li, t2r, g, ks, vs, c: jax.lax.psum(loss(q, kv[0], li, t2r, g, ks, vs, c), axes)

    def compare(got):
        dq, dks, dvs = got
        mine = np.array([float(dks), float(dvs)])
        if not np.allclose(mine, want_scales, rtol=1e-5, atol=0):
            return f"scale cotangents {mine}, the shards' sum {want_scales}"
        return _differs("dq", np.asarray(dq, np.float32), np.concatenate(want_q))

    def grads_through(f):  # rows over "data", heads over "model" in both runs
        with jax.set_mesh(mesh):
            put = lambda x, *spec: sharding_put(mesh, x, *spec)  # noqa: E731
            args = (put(case.q, "data", "model"), put(kv_per_device, "data", None, "model"),
                    put(case.logical_indices, "data"), put(case.token_to_req, "data"),
                    put(case.output_gate, "data", "model"), jnp.float32(0.5), jnp.float32(2.0),
                    put(ct, "data", "model"))
            return compare(jax.jit(jax.grad(f, (0, 5, 6)))(*args))

    def fully_manual(check_vma):
        specs = (P("data", "model"), P("data", None, "model"), P("data"), P("data"), P("data", "model"), P(), P(),
                 P("data", "model"))
        return lambda: grads_through(jax.shard_map(body(("data", "model")), mesh=mesh, in_specs=specs,
                                                   out_specs=P(), check_vma=check_vma))

    def partly_manual():  # "model" left to the operator
        specs = (P("data"), P("data"), P("data"), P("data"), P("data"), P(), P(), P("data"))
        return grads_through(jax.shard_map(body("data"), mesh=mesh, in_specs=specs, out_specs=P(),
                                           axis_names={"data"}, check_vma=True))

    for check_vma in (True, False):
        _run_case(results, f"sparse_attention/xla/fp8-scaled-grad/manual/check_vma={check_vma}",
                  fully_manual(check_vma))
    _run_case(results, "sparse_attention/xla/fp8-scaled-grad/explicit-partly-manual", partly_manual)


def refuses_replicated_out_specs(mc, implementation, trace_only=False) -> str | None:
    """A shard_map claiming the (varying) output replicated must be refused by JAX's check."""
    mapped = _mapped_attention(mc, implementation, True, out_specs=P())
    try:
        jax.jit(mapped).trace(*_host_args(mc)) if trace_only else jax.jit(mapped)(*_host_args(mc))
    except ValueError as exc:
        return None if "out_specs" in str(exc) or "vary" in str(exc) else f"unexpected error: {exc}"
    return f"{implementation}: out_specs=P() accepted for an output that varies over the row axis"


def partly_automatic(results):
    """shard_map over "data" of a (data, model) mesh, "model" left automatic: heads split over
    "model" are gathered by XLA (all-gathers; the README says so), with the check on or off and
    with rows split over "data" or whole; nothing split over "model" runs without collectives;
    each equals the one-device call on each data shard's rows."""
    mc = mesh_case((2, 2), ("data", "model"), "data", None, True, False, seed=16)
    case, mesh = mc.case, mc.mesh
    want = per_shard_reference(mc.shards, True, case, mc.kv, case.q, lambda q, kv, li, t2r, gate, _: (
        qsa_jax.sparse_attention(q, kv, jnp.asarray(li), jnp.asarray(case.block_table), jnp.asarray(t2r), gate,
                                 config=mc.config, implementation="xla"),))[0]
    put = functools.partial(sharding_put, mesh)
    runs = [(None, "data", True, []), ("model", "data", True, ["all-gather"]),
            ("model", "data", False, ["all-gather"]), ("model", None, True, ["all-gather"])]
    for heads, rows, check_vma, expected in runs:
        def check(heads=heads, rows=rows, check_vma=check_vma, expected=expected):
            mapped = jax.jit(jax.shard_map(
                lambda *a: qsa_jax.sparse_attention(*a, implementation="xla"), mesh=mesh,
                in_specs=(P(rows), P(), P(rows), P(), P(rows), P(rows)), out_specs=P(rows), axis_names={"data"},
                check_vma=check_vma))
            args = (put(case.q, rows, heads), put(mc.kv, None, heads), put(case.logical_indices, rows),
                    put(case.block_table), put(case.token_to_req, rows), put(case.output_gate, rows, heads))
            # Rows whole over "data": every device computes all rows (the whole-array tiling).
            reference = want if rows else qsa_jax.sparse_attention(
                *(jnp.asarray(x) for x in (case.q, mc.kv, case.logical_indices, case.block_table,
                                           case.token_to_req, case.output_gate)), implementation="xla")
            problem = _differs("output", mapped(*args), reference)
            found = collectives_in(mapped, *args)
            return problem or (None if found == expected else f"collectives {found}, expected {expected}")

        _run_case(results, f"sparse_attention/xla/partly-automatic/heads-over-{heads or 'nothing'}"
                           f"/rows-{'split' if rows else 'whole'}/check_vma={check_vma}", check)


def explicit_partly_manual(results):
    """An Explicit (data, model) mesh, shard_map manual over "data" only, heads split over the
    Explicit "model" axis: the operator runs per "model" shard in a shard_map of its own (no
    collective), equal to each shard's one-device call, with the check on or off; a gradient
    with the check on, whose cache is replicated over "data", is refused with a clear error
    (the inner shard_map cannot sum over the caller's axis)."""
    mc = mesh_case((2, 2), ("data", "model"), "data", "model", True, True, seed=18)
    case, mesh = mc.case, mc.mesh
    want = per_shard_reference(mc.shards, True, case, mc.kv, case.q, lambda q, kv, li, t2r, gate, _: (
        qsa_jax.sparse_attention(q, kv, jnp.asarray(li), jnp.asarray(case.block_table), jnp.asarray(t2r), gate,
                                 config=mc.config, implementation="xla"),))[0]
    args = (mc.rows_heads(case.q), mc.kv_on_mesh(), mc.rows(case.logical_indices),
            sharding_put(mesh, case.block_table), mc.rows(case.token_to_req),
            mc.rows_heads(case.output_gate))
    specs = (P("data"), P(), P("data"), P(), P("data"), P("data"))

    def mapped(check_vma, out_specs=P("data")):
        return jax.shard_map(lambda *a: qsa_jax.sparse_attention(*a, implementation="xla"), mesh=mesh,
                             in_specs=specs, out_specs=out_specs, axis_names={"data"}, check_vma=check_vma)

    for check_vma in (True, False):
        def forward(check_vma=check_vma):
            with jax.set_mesh(mesh):
                f = jax.jit(mapped(check_vma))
                problem = _differs("output", f(*args), want)
                found = collectives_in(f, *args)
            return problem or (f"collectives {found}" if found else None)

        _run_case(results, f"sparse_attention/xla/explicit-partly-manual/check_vma={check_vma}", forward)

    def typed():  # the inner shard_map's results carry the caller's axis: P() is refused
        with jax.set_mesh(mesh):
            try:
                jax.jit(mapped(True, out_specs=P())).trace(*args)
            except ValueError as exc:
                return None if "out_specs" in str(exc) else f"unexpected error: {exc}"
        return "out_specs=P() accepted for an output that varies over 'data'"

    _run_case(results, "sparse_attention/xla/explicit-partly-manual/out_specs-refused", typed)

    def vjp_refused():
        with jax.set_mesh(mesh):
            try:
                jax.jit(lambda q, kv, g: jax.vjp(lambda q, kv, g: mapped(True)(q, kv, *args[2:5], g), q, kv, g)[1](
                    q))(args[0], args[1], args[5])
            except NotImplementedError as exc:
                return None if "Explicit" in str(exc) and "Auto mesh" in str(exc) else str(exc)
        return "the gradient ran: check that its cache cotangent is summed over 'data', then drop the refusal"

    _run_case(results, "sparse_attention/xla/explicit-partly-manual/vjp-refused", vjp_refused)


def empty_batch_typed(results):
    """No rows: an implementation returns fresh zeros (or the cache as it came), which vary
    over nothing -- the result must still be typed as varying over the rows' axis (as
    jax-triton's untyped outputs must: it cannot import on CPU), so out_specs=P() is refused."""
    mesh = make_mesh((2,), ("data",))
    z = lambda x: jnp.zeros((0,) + np.shape(x)[1:], np.asarray(x).dtype)  # noqa: E731
    case = attention_case(13)
    compress = compress_case(np.random.default_rng(14), chunk_lens=[3]).arrays()
    store = store_case(np.random.default_rng(15), n=4, pages=8, page_size=4, width=24)
    per_row = {"raw_keys", "raw_positions", "token_to_req", "logical_positions", "compressed_slots"}
    calls = {
        "sparse_attention": (lambda q, kv, li, bt, t2r, g: qsa_jax.sparse_attention(
            q, kv, li, bt, t2r, g, implementation="xla"),
            (z(case.q), jnp.asarray(case.kv_cache), z(case.logical_indices), jnp.asarray(case.block_table),
             z(case.token_to_req), z(case.output_gate)), (True, False, True, False, True, True)),
        "compress": (lambda *a: qsa_jax.compress_groups_with_ratio(*a, 4, implementation="xla")[0],
                     tuple(z(compress[k]) if k in per_row else jnp.asarray(compress[k]) for k in COMPRESS_ORDER),
                     tuple(k in per_row for k in COMPRESS_ORDER)),
        "store": (lambda cache, slots, rows: qsa_jax.store_cache_rows(cache, slots, rows, implementation="xla"),
                  (jnp.asarray(store.cache), z(store.slot_mapping), z(store.rows)), (False, True, True)),
    }
    for op, (fn, args, split) in calls.items():
        def check(fn=fn, args=args, split=split):
            mapped = jax.shard_map(fn, mesh=mesh, in_specs=tuple(P("data") if s else P() for s in split),
                                   out_specs=P())
            try:
                jax.jit(mapped).trace(*args)
            except ValueError as exc:
                return None if "out_specs" in str(exc) else f"unexpected error: {exc}"
            return "an empty batch's result came back typed replicated"

        _run_case(results, f"{op}/xla/empty-batch-typed", check)


def per_device_problems(results):
    """Data-parallel serving: each device holds its own batch, cache and block table; every
    operator inside shard_map (check_vma on) equals one-device calls on each device's arrays."""
    mesh = make_mesh((2,), ("data",))

    def mapped(fn, stacked, n_out):
        spec = P("data")
        body = lambda *xs: jax.tree.map(lambda x: x[None], fn(*(x[0] for x in xs)))  # noqa: E731
        out = jax.shard_map(body, mesh=mesh, in_specs=(spec,) * len(stacked),
                            out_specs=(spec,) * n_out if n_out > 1 else spec)
        return jax.jit(out)(*(sharding_put(mesh, x, "data") for x in stacked))

    def check(fn, per_device, n_out):
        stacked = [np.stack(xs) for xs in zip(*per_device)]
        got = mapped(fn, stacked, n_out)
        for i, args in enumerate(per_device):
            want = fn(*(jnp.asarray(x) for x in args))
            problem = _differs(f"device {i}", jax.tree.map(lambda x: x[i], got), want)
            if problem:
                return problem
        return None

    cases = [attention_case(70 + i) for i in range(2)]
    _run_case(results, "per-device/sparse_attention/xla", lambda: check(
        lambda *a: qsa_jax.sparse_attention(*a, implementation="xla"),
        [(c.q, c.kv_cache, c.logical_indices, c.block_table, c.token_to_req, c.output_gate) for c in cases], 1))
    compress = [compress_case(np.random.default_rng(80 + i), chunk_lens=[5, 7, 3, 9], edge=True) for i in range(2)]
    ratio = compress[0].compress_ratio
    _run_case(results, "per-device/compress/xla", lambda: check(
        lambda *a: qsa_jax.compress_groups_with_ratio(*a[:8], ratio, a[8], implementation="xla"),
        [tuple(c.arrays()[k] for k in COMPRESS_ORDER) + (c.rope_cache,) for c in compress], 2))
    store = [store_case(np.random.default_rng(90 + i), n=24, pages=16, page_size=4, width=24) for i in range(2)]
    _run_case(results, "per-device/store/xla", lambda: check(
        lambda *a: qsa_jax.store_cache_rows(*a, implementation="xla"),
        [(s.cache, s.slot_mapping, s.rows) for s in store], 1))

    def shared_queries():
        """q and the gate replicated over 4 devices, each its own cache, block table and
        selection: their cotangents are the sums of the devices' own (bf16 each), summed in
        fp32 and rounded once (a bf16 psum of 4 rounds more often: 4 devices tell them apart)."""
        four = [attention_case(75 + i) for i in range(4)]
        mesh4 = make_mesh((4,), ("data",))
        d_out = np.random.default_rng(75).standard_normal(four[0].q.shape).astype(four[0].q.dtype)
        q, gate, d = (jnp.asarray(x) for x in (four[0].q, four[0].output_gate, d_out))
        spec = P("data")

        def body(q, gate, kv, li, bt, t2r):
            return qsa_jax.sparse_attention(q, kv[0], li[0], bt[0], t2r[0], gate, implementation="xla")

        mapped = jax.shard_map(body, mesh=mesh4, in_specs=(P(), P(), spec, spec, spec, spec), out_specs=spec)
        per_device = [tuple(jnp.asarray(x) for x in (c.kv_cache, c.logical_indices, c.block_table, c.token_to_req))
                      for c in four]
        stacked = [jnp.stack(xs) for xs in zip(*per_device)]
        grads = jax.jit(lambda q, gate, d: jax.vjp(lambda q, gate: mapped(q, gate, *stacked), q, gate)[1](d))
        dq, dgate = grads(q, gate, jnp.concatenate([d] * 4))
        wants = [jax.vjp(lambda q, gate, a=a: body(q, gate, *(x[None] for x in a)), q, gate)[1](d) for a in per_device]
        for label, got, parts in (("dq", dq, [w[0] for w in wants]), ("dgate", dgate, [w[1] for w in wants])):
            total = np.zeros(got.shape, np.float32)
            for part in parts:  # in device order, as the all-reduce of 4 host devices adds
                total += np.asarray(part, np.float32)
            problem = _differs(label, got, total.astype(got.dtype))
            if problem:
                return problem
        psums = _psum_dtypes(grads, (q, gate, jnp.concatenate([d] * 4)))
        return None if psums and set(psums) == {"float32"} else f"psum operands {psums}, expected float32 only"

    _run_case(results, "per-device/sparse_attention/xla/shared-queries-vjp", shared_queries)

    # Mixed types: a state cache (and its block table, rope) or a cache replicated, each
    # device's rows its own -- the replicated arrays are gathered from or written with
    # varying indices, so the operator casts them first.
    shared = {"compressor_state_cache", "compressor_state_block_table", "rope_cache"}
    first = compress[0].arrays()

    def compress_shared(*a):
        merged = dict(zip(COMPRESS_ORDER + ("rope_cache",), a))
        merged.update({k: jnp.asarray(first[k]) for k in shared})
        return qsa_jax.compress_groups_with_ratio(*(merged[k] for k in COMPRESS_ORDER), ratio,
                                                  merged["rope_cache"], implementation="xla")

    _run_case(results, "per-device/compress/xla/shared-state-cache", lambda: check(
        compress_shared, [tuple(c.arrays()[k] for k in COMPRESS_ORDER) + (c.rope_cache,) for c in compress], 2))
    _run_case(results, "per-device/store/xla/shared-cache", lambda: check(
        lambda slots, rows: qsa_jax.store_cache_rows(jnp.asarray(store[0].cache), slots, rows, implementation="xla"),
        [(s.slot_mapping, s.rows) for s in store], 1))


def second_order(results):
    """A Hessian-vector product in q through the shard_map (xla, rows over 2 devices, check on):
    each row shard's equals the one-device HVP of that shard's own loss (second derivatives
    are not bit-reproducible across programs: compared to 1e-4), and is not zero."""
    mc = mesh_case((2,), ("data",), "data", None, True, False, seed=5)
    q, kv, li, bt, t2r, gate = _host_args(mc)
    v = jnp.asarray(np.random.default_rng(6).standard_normal(q.shape), q.dtype)

    def hvp(attention, q, v, *rest):
        loss = lambda q: jnp.sum(attention(q, kv, rest[0], bt, rest[1], rest[2]).astype(jnp.float32) ** 2)  # noqa: E731
        return jax.jit(lambda q, v: jax.jvp(jax.grad(loss), (q,), (v,))[1])(q, v)

    def check():
        got = np.asarray(hvp(_mapped_attention(mc, "xla", True), q, v, li, t2r, gate), np.float32)
        one = functools.partial(qsa_jax.sparse_attention, config=mc.config, implementation="xla")
        want = np.concatenate([np.asarray(hvp(one, q[r], v[r], li[r], t2r[r], gate[r]), np.float32)
                               for r, _, _ in mc.shards])
        if not np.abs(want).max() > 0:
            return "the one-device HVP is zero: the check cannot tell"
        err = float(np.abs(got - want).max() / np.abs(want).max())
        return None if err < 1e-4 else f"HVP differs from the shards' one-device ones by {err:.3g} (relative)"

    _run_case(results, "second-order/xla/rows", check)


# --- Pallas and jax-triton: lowered or traced, not run ---------------------------------

def _as_if_on_a_gpu():
    """Lower Pallas through its Triton path as on an H100/H200 (Compiling to PTX needs the GPU)."""
    from jax._src.pallas.triton import pallas_call_registration as registration

    from qsa_jax.ops.compress_groups import pallas as compress_pallas
    from qsa_jax.ops.sparse_attention import backward_pallas, pallas
    from qsa_jax.ops.store_cache_rows import pallas as store_pallas

    registration.gpu_info_lib.get_gpu_info = lambda: types.SimpleNamespace(compute_capability=90)
    for module in (pallas, backward_pallas, compress_pallas, store_pallas):
        module.interpret = lambda: False


def _export_cuda(fn, *args) -> str:
    checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    return jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args).mlir_module()


def pallas_checks(results):
    mc = mesh_case((2, 2), ("data", "model"), "data", "model", True, False, seed=9)
    q, kv, li, bt, t2r, gate = _host_args(mc)

    def interpreter_refused():
        try:
            jax.jit(_mapped_attention(mc, "pallas", True))(q, kv, li, bt, t2r, gate)
        except NotImplementedError as exc:
            return None if "check_vma" in str(exc) and "implementation='xla'" in str(exc) else str(exc)
        return "the interpreter ran inside shard_map with check_vma=True: lift the refusal in _vma.pallas_call"

    _run_case(results, "pallas/interpreter-refused", interpreter_refused)
    _run_case(results, "pallas/jax-interpreter-limitation-still-present", jax_interpreter_canary)
    _as_if_on_a_gpu()
    d_out = jnp.asarray(np.random.default_rng(2).standard_normal(q.shape), q.dtype)

    def lowered():
        mapped = _mapped_attention(mc, "pallas", True)
        text = _export_cuda(mapped, q, kv, li, bt, t2r, gate)
        if "qsa_sparse_attention" not in text:
            return "the forward kernel is missing from the CUDA program"
        grads = jax.jit(lambda q, kv, g, d: jax.vjp(lambda q, kv, g: mapped(q, kv, li, bt, t2r, g), q, kv, g)[1](d))
        text = _export_cuda(grads, q, kv, gate, d_out)
        if "qsa_sparse_attention_backward" not in text:
            return "the backward kernel is missing from the CUDA program"
        psums = _psum_dtypes(grads, (q, kv, gate, d_out))
        if set(psums) != {"float32"}:
            return f"the cache cotangent's psum operands are {psums}, expected float32 only"
        return None

    _run_case(results, "pallas/cuda-lowering/sparse_attention-rows2xheads2", lowered)
    _run_case(results, "pallas/cuda-lowering/out_specs-refused",
              lambda: refuses_replicated_out_specs(mc, "pallas", trace_only=True))

    def indexer_lowered():
        c = compress_case(np.random.default_rng(3), chunk_lens=[4, 6], edge=True)
        s = store_case(np.random.default_rng(4), n=12, pages=8, page_size=4, width=24)
        mesh = make_mesh((2,), ("data",))
        compress = jax.shard_map(lambda *a: qsa_jax.compress_groups_with_ratio(
            *a, c.compress_ratio, implementation="pallas"), mesh=mesh, in_specs=P(), out_specs=(P(), P()))
        # A replicated cache with per-device rows: each device's copy gets its own rows.
        store = jax.shard_map(lambda cache, slots, rows: qsa_jax.store_cache_rows(
            cache, slots[0], rows[0], implementation="pallas"), mesh=mesh,
            in_specs=(P(), P("data"), P("data")), out_specs=P("data"))
        c_args = tuple(jnp.asarray(c.arrays()[k]) for k in COMPRESS_ORDER)
        s_args = (jnp.asarray(s.cache), jnp.asarray(np.stack([s.slot_mapping] * 2)),
                  jnp.asarray(np.stack([s.rows] * 2)))
        missing = [name for name, text in (("qsa_compress_groups", _export_cuda(compress, *c_args)),
                                           ("qsa_store_cache_rows", _export_cuda(store, *s_args)))
                   if name not in text]
        return f"kernels missing from the CUDA programs: {missing}" if missing else None

    _run_case(results, "pallas/cuda-lowering/indexer-operators", indexer_lowered)
    _run_case(results, "pallas/cuda-lowering/aliased-input-typed", aliased_input_typed)


def aliased_input_typed() -> str | None:
    """A kernel output aliased to an input takes that input's type: ``_vma.pallas_call`` casts
    its inputs (e.g. zeros made for an in-place accumulator) so the output still varies."""
    from qsa_jax.ops import _vma

    mesh = make_mesh((2,), ("data",))
    found = []

    def kernel(x_ref, acc_ref, o_ref):
        o_ref[...] = x_ref[...] + acc_ref[...]

    def body(x):
        out = _vma.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                               input_output_aliases={1: 0})(x, jnp.zeros(x.shape, x.dtype))
        found.append(jax.typeof(out).manual_axis_type.varying)
        return out

    jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data"))).trace(jnp.ones((4, 16)))
    return None if found == [frozenset({"data"})] else f"the aliased output varies over {found}"


def jax_interpreter_canary() -> str | None:
    """JAX's Pallas interpreter fails on a kernel gathering a varying ref at a program id inside
    shard_map with check_vma=True (jax 0.11). When this passes, lift the refusal."""
    from jax.experimental import pallas as pl

    mesh = make_mesh((2,), ("data",))

    def kernel(x_ref, o_ref):
        o_ref[pl.program_id(0), :] = x_ref[pl.program_id(0), :] * 2

    def body(x):
        shape = jax.ShapeDtypeStruct(x.shape, x.dtype, manual_axis_type=jax.typeof(x).manual_axis_type)
        return pl.pallas_call(kernel, out_shape=shape, grid=(x.shape[0],), interpret=True)(x)

    try:
        jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data")))(jnp.ones((4, 8)))
    except ValueError as exc:
        return None if "varying manual axes" in str(exc) else f"fails differently now: {exc}"
    return "JAX's Pallas interpreter now runs under check_vma=True: lift the refusal in _vma.pallas_call"


def _tracing_triton_call(*args, out_shape, **launch):
    """Stands in for ``jax_triton.triton_call`` where jax-triton does not import (a CPU jaxlib):
    the checks here only trace. Like jax-triton's primitive, its outputs carry no varying manual
    axes of their own, whatever the inputs' -- the operator's wrapper must type them."""
    del args, launch
    shapes = [out_shape] if isinstance(out_shape, jax.ShapeDtypeStruct) else list(out_shape)
    outs = [jnp.zeros(s.shape, s.dtype) for s in shapes]
    return outs[0] if isinstance(out_shape, jax.ShapeDtypeStruct) else outs


def triton_checks(results):
    """jax-triton cannot lower here; traced, its (untyped) outputs must come back varying.
    Where jax-triton does not import (jaxlib without CUDA, as on CI) the kernels' modules are
    loaded with ``_tracing_triton_call`` in its place, so the wrappers' typing is still traced."""
    import importlib

    from qsa_jax.ops.compress_groups import triton as compress_triton
    from qsa_jax.ops.sparse_attention import triton as attention_triton
    from qsa_jax.ops.store_cache_rows import triton as store_triton

    for module, kernels in ((attention_triton, "qsa_jax.ops.sparse_attention.triton_kernels"),
                            (compress_triton, "qsa_jax.ops.compress_groups.triton_kernels"),
                            (store_triton, "qsa_jax.ops.store_cache_rows.triton_kernels")):
        if module._IMPORT_ERROR is not None:  # jax-triton needs a CUDA jaxlib
            try:
                module._k = importlib.import_module(kernels)
            except Exception as exc:  # no triton at all: nothing to trace
                results.append({"name": "triton/traced", "problem": None,
                                "skipped": f"neither jax-triton nor the kernels import here ({str(exc)[:120]})"})
                return
            module._jt = types.SimpleNamespace(triton_call=_tracing_triton_call)
            module._IMPORT_ERROR = None
        module.why_not = lambda: None
    mc = mesh_case((2,), ("data",), "data", None, False, False, seed=12)

    def traced():
        jax.jit(_mapped_attention(mc, "triton", True)).trace(*_host_args(mc))
        return refuses_replicated_out_specs(mc, "triton", trace_only=True)

    _run_case(results, "triton/traced/sparse_attention-rows", traced)

    def store_traced():
        s = store_case(np.random.default_rng(5), n=12, pages=8, page_size=4, width=24)
        mesh = mc.mesh
        store = jax.shard_map(lambda cache, slots, rows: qsa_jax.store_cache_rows(
            cache, slots[0], rows[0], implementation="triton"), mesh=mesh,
            in_specs=(P(), P("data"), P("data")), out_specs=P())
        args = (jnp.asarray(s.cache), jnp.asarray(np.stack([s.slot_mapping] * 2)),
                jnp.asarray(np.stack([s.rows] * 2)))
        try:
            jax.jit(store).trace(*args)
        except ValueError:
            return None
        return "store: out_specs=P() accepted for a cache written with per-device rows"

    _run_case(results, "triton/traced/store-out_specs-refused", store_traced)


def main(argv=None) -> int:
    if jax.device_count() < 8:
        print(json.dumps([{"name": "setup", "problem": f"needs 8 devices, has {jax.device_count()}"}]))
        return 1
    results: list[dict] = []
    for i, layout in enumerate(attention_layouts(4)):
        for fused in (True, False):
            for check_vma in (True, False) if layout[0] == "rows" else (True,):
                name = (f"sparse_attention/xla/{layout[0]}/{'fused' if fused else 'split'}"
                        f"/check_vma={check_vma}")
                _run_case(results, name, lambda: attention_check(layout, fused, check_vma, seed=40 + i))
    _run_case(results, "sparse_attention/xla/rows2xheads2/fp8-scaled", scaled_check)
    scaled_gradient_checks(results)
    rows = mesh_case((2,), ("data",), "data", None, True, False, seed=3)
    _run_case(results, "sparse_attention/xla/out_specs-refused", lambda: refuses_replicated_out_specs(rows, "xla"))
    partly_automatic(results)
    explicit_partly_manual(results)
    empty_batch_typed(results)
    per_device_problems(results)
    second_order(results)
    triton_checks(results)
    pallas_checks(results)  # last: it patches the Pallas modules to lower for CUDA
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
