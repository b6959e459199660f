"""Sharded-call checks, run in a process of their own with forced host devices.

``python -m qsa_testing.sharding_checks [--pallas]`` must start with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (tests/test_sharding.py
does that) and prints one JSON list: for every case its name and ``problem``
(None when the case passed). Every supported layout at 2, 4 and 8 devices is
compared bit for bit with the one-device call, its compiled program searched
for collectives, and every unsupported layout must raise naming the argument.
Gradients (``jax.vjp``) and fp8 calls with k/v scales are compared with the shards'
own one-device calls (``per_shard_reference``).
One process runs all cases: starting JAX costs more than most cases.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import qsa_jax
from qsa_jax.config import select_config
from qsa_jax.ops.sparse_attention.base import scale_operand
from qsa_testing.cases import (E4M3, add_edge_rows, compress_case, poison_unreferenced, sparse_attention_case,
                               store_case)
from qsa_testing.gradients import BF16_BAR, error_over_floor, float64_gradients

ROOT = Path(__file__).resolve().parents[1]


def forced_devices_env(count: int = 8) -> dict:
    """The environment of a subprocess with ``count`` forced host devices (a process-wide XLA
    flag: the calling test process keeps its one device) that imports this checkout."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={count}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def run_with_forced_devices(module: str, *args: str, timeout: int = 900) -> list[dict]:
    """``python -m module *args`` with 8 forced host devices: its JSON list of cases."""
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=forced_devices_env(),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "reduce-scatter", "collective-permute")


def make_mesh(shape, names, explicit=False):
    devices = np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape)
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return jax.sharding.Mesh(devices, names, axis_types=(kind,) * len(names))


def put(mesh, x, *spec):
    return jax.device_put(jnp.asarray(x), NamedSharding(mesh, P(*spec)))


def collectives_in(jitted, *args) -> list[str]:
    text = jitted.lower(*args).compile().as_text()
    return [c for c in COLLECTIVES if c in text]


def bits(x):
    x = np.asarray(x)
    return x.view(np.uint16) if x.dtype.itemsize == 2 else x


def compare(name, got, want, jitted, args) -> str | None:
    """None, or what is wrong with a sharded result."""
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        if g.shape != w.shape or not np.array_equal(bits(g), bits(w)):
            diff = np.argwhere(bits(g) != bits(w)) if g.shape == w.shape else "shape"
            return f"not bit-identical to the one-device call (first differences {str(diff[:3])})"
    found = collectives_in(jitted, *args)
    return f"compiled program holds {found}" if found else None


# --- sparse_attention -----------------------------------------------------

HEADS, KV_HEADS, DIM, ROWS = 8, 2, 16, 16


def attention_case(seed):
    rng = np.random.default_rng(seed)
    case = sparse_attention_case(rng, rows=ROWS, num_query_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=DIM,
                                 page_size=16, selection_blocks=12, context_tokens=120, num_requests=5,
                                 num_pages=48)
    add_edge_rows(rng, case)
    return case


def attention_layouts(n):
    """(name, mesh shape, axis names, rows axis, heads axis) of each supported layout on n devices."""
    out = [("heads", (n,), ("model",), None, "model"), ("rows", (n,), ("data",), "data", None)]
    for h in (2, 4):
        if h < n:
            out.append((f"rows{n // h}xheads{h}", (n // h, h), ("data", "model"), "data", "model"))
    return out


def layout_runs(n, implementation, layouts, explicit_too, suffix="", fused_first=True):
    """(case name, mesh shape, axis names, rows axis, heads axis, fused, explicit) per run:
    layouts alternate fused and split caches, and the first also runs on an Explicit mesh."""
    for i, (lname, shape, names, rows_ax, heads_ax) in enumerate(layouts):
        for explicit in ((False, True) if explicit_too and i == 0 else (False,)):
            fused = (i % 2 == 0) == fused_first
            name = (f"sparse_attention/{implementation}/{n}dev/{lname}/{'fused' if fused else 'split'}{suffix}"
                    + ("/explicit" if explicit else ""))
            yield name, shape, names, rows_ax, heads_ax, fused, explicit


def attention_checks(n, implementation, results, explicit_too=True, layouts=None):
    for run in layout_runs(n, implementation, layouts or attention_layouts(n), explicit_too):
        name, rest = run[0], run[1:]
        results.append(_attention_case(name, n, *rest, implementation))


def _attention_case(name, n, shape, names, rows_ax, heads_ax, fused, explicit, implementation):
    try:
        mc = mesh_case(shape, names, rows_ax, heads_ax, fused, explicit, seed=n)
        case = mc.case
        # The one-device reference: the whole arrays with the original 2-KV-head cache, at the
        # shard's tiling.
        kv_ref = case.kv_cache if fused else case.split_caches()
        want = qsa_jax.sparse_attention(case.q, jax.tree.map(jnp.asarray, kv_ref), case.logical_indices,
                                        case.block_table, case.token_to_req, case.output_gate,
                                        config=mc.config, implementation=implementation)
        # One layout takes the gate as [R, H * D] (vLLM's flat gate), split like q's heads.
        gate = case.output_gate.reshape(ROWS, -1) if "/4dev/rows2xheads2/" in name else case.output_gate
        args = (mc.rows_heads(case.q), mc.kv_on_mesh(), mc.rows(case.logical_indices), put(mc.mesh, case.block_table),
                mc.rows(case.token_to_req), mc.rows_heads(gate))
        jitted = jax.jit(lambda *a: qsa_jax.sparse_attention(*a, implementation=implementation))
        problem = compare(name, jitted(*args), want, jitted, args)
        if problem is None and not explicit:  # the eager call goes the same way
            eager = compare(name, qsa_jax.sparse_attention(*args, implementation=implementation), want,
                            jitted, args)
            problem = eager and "eager call: " + eager
        return {"name": name, "problem": problem}
    except Exception:  # noqa: BLE001 - reported as the case's problem
        return {"name": name, "problem": traceback.format_exc(limit=4)}


def strided_query_check(results):
    """A StridedQuery (a wider qkv array read in place) with everything whole on a mesh, and its vjp."""
    name = "sparse_attention/xla/2dev/StridedQuery-replicated"
    try:
        case = attention_case(11)
        mesh = make_mesh((2,), ("data",))
        qkv = np.concatenate([case.q.reshape(ROWS, -1), case.output_gate.reshape(ROWS, -1)], axis=1)

        def call(qkv, *rest):
            q = qsa_jax.StridedQuery.from_columns(qkv, start=0, num_heads=HEADS, head_dim=DIM)
            return qsa_jax.sparse_attention(q, *rest, implementation="xla")

        rest = (case.kv_cache, case.logical_indices, case.block_table, case.token_to_req, case.output_gate)
        want = call(jnp.asarray(qkv), *(jnp.asarray(x) for x in rest))
        args = (put(mesh, qkv),) + tuple(put(mesh, x) for x in rest)
        jitted = jax.jit(call)
        problem = compare(name, jitted(*args), want, jitted, args)
        if problem is None:  # and its gradient (the table's, the cache's, the gate's)
            d_out = np.random.default_rng(12).standard_normal(case.q.shape).astype(case.q.dtype)

            def vjp(qkv, kv, li, bt, t2r, gate, d):
                out, pull = jax.vjp(lambda qkv, kv, gate: call(qkv, kv, li, bt, t2r, gate), qkv, kv, gate)
                return (out, *pull(d))

            grads = jax.jit(vjp)
            want = grads(jnp.asarray(qkv), *(jnp.asarray(x) for x in rest), jnp.asarray(d_out))
            problem = compare(name, grads(*args, put(mesh, d_out)), want, grads, args + (put(mesh, d_out),))
            problem = problem and "vjp: " + problem
        results.append({"name": name, "problem": problem})
    except Exception:  # noqa: BLE001
        results.append({"name": name, "problem": traceback.format_exc(limit=4)})


def _count(mesh, axes) -> int:
    """Devices along ``axes`` (None, one mesh axis or a tuple of them)."""
    return int(np.prod([mesh.shape[a] for a in (axes if isinstance(axes, tuple) else (axes,))])) if axes else 1


def _shards(mesh, rows_ax, heads_ax):
    """(row slice, head slice, KV-head slice of the repeated cache) of every device's shard,
    and the shard's (rows, KV heads)."""
    row_shards, head_shards = _count(mesh, rows_ax), _count(mesh, heads_ax)
    lr, lh = ROWS // row_shards, HEADS // head_shards
    lk = max(1, KV_HEADS // head_shards)
    return [(slice(i * lr, (i + 1) * lr), slice(j * lh, (j + 1) * lh), slice(j * lk, (j + 1) * lk))
            for i in range(row_shards) for j in range(head_shards)], (lr, lk)


def _kv_heads(kv, fused, heads):
    return jnp.asarray(kv[:, heads]) if fused else tuple(jnp.asarray(x[:, :, heads]) for x in kv)


@dataclasses.dataclass
class MeshCase:
    """A sparse-attention case laid out on a mesh: rows over ``rows_ax``, heads and KV heads over
    ``heads_ax``; ``kv`` the host cache (fused or split; KV heads repeated when there are more
    head shards than KV heads), poisoned where the shard's tiling reads nothing."""

    mesh: jax.sharding.Mesh
    rows_ax: object
    heads_ax: object
    fused: bool
    shards: list
    config: tuple
    case: object
    kv: object

    def kv_on_mesh(self):
        if self.fused:
            return put(self.mesh, self.kv, None, self.heads_ax)
        return tuple(put(self.mesh, x, None, None, self.heads_ax) for x in self.kv)

    def rows_heads(self, x):
        """An [R, H, ...] array on the mesh, rows and heads split."""
        return put(self.mesh, x, self.rows_ax, self.heads_ax)

    def rows(self, x):
        return put(self.mesh, x, self.rows_ax)


def mesh_case(shape, names, rows_ax, heads_ax, fused, explicit, seed, kv_dtype=None) -> MeshCase:
    mesh = make_mesh(shape, names, explicit)
    shards, (lr, lk) = _shards(mesh, rows_ax, heads_ax)
    case = attention_case(seed)
    config = select_config(lr, lk, False, case.selection_width)
    case = poison_unreferenced(case, config)
    kv = case.kv_cache if fused else case.split_caches()
    if kv_dtype is not None:
        kv = jax.tree.map(lambda x: np.asarray(x).astype(kv_dtype), kv)
    head_shards = _count(mesh, heads_ax)
    if head_shards > KV_HEADS:
        kv = jax.tree.map(np.asarray, qsa_jax.repeat_kv_heads(jax.tree.map(jnp.asarray, kv),
                                                              head_shards // KV_HEADS))
    return MeshCase(mesh, rows_ax, heads_ax, fused, shards, config, case, kv)


def per_shard_reference(shards, fused, case, kv, d_out, call, kv_round=jnp.bfloat16):
    """What a sharded call must give, from one-device calls on each shard's arrays:
    ``call(q, kv, logical_indices, token_to_req, gate, d_out)`` -> (out, ) or (out, dq, dkv,
    dgate) with dkv unrounded (fp32, ``shard_kv_cotangent``). Row x head blocks are placed;
    the cache cotangents of a head shard's row shards are summed in fp32 in row order and
    rounded once to bf16, as the sharded backward sums them."""
    out = [np.zeros((ROWS, HEADS, DIM), np.float32) for _ in range(3)]  # out, dq, dgate
    dkv = jax.tree.map(lambda x: np.zeros(x.shape, np.float32), kv)
    for r, h, k in shards:
        got = call(jnp.asarray(case.q[r, h]), _kv_heads(kv, fused, k), case.logical_indices[r],
                   case.token_to_req[r], jnp.asarray(case.output_gate[r, h]), d_out[r, h])
        for whole, part in zip(out, got[:2] + got[3:]):
            whole[r, h] = np.asarray(part, np.float32).reshape(whole[r, h].shape)
        if len(got) > 1:
            leaves = jax.tree.leaves(got[2])
            assert len(leaves) == len(jax.tree.leaves(dkv)) and all(x.dtype == jnp.float32 for x in leaves)
            for whole, part in zip(jax.tree.leaves(dkv), leaves):
                whole[(slice(None), k) if fused else (slice(None), slice(None), k)] += np.asarray(part)
    bf = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16))  # noqa: E731
    return (bf(out[0]), bf(out[1]), jax.tree.map(lambda x: np.asarray(jnp.asarray(x).astype(kv_round)), dkv),
            bf(out[2]))


def vjp_call(implementation, config=None):
    """(q, kv, logical_indices, block_table, token_to_req, gate, d_out) -> (out, dq, dkv, dgate)."""
    def f(q, kv, li, bt, t2r, gate, d_out):
        out, pull = jax.vjp(lambda q, kv, gate: qsa_jax.sparse_attention(
            q, kv, li, bt, t2r, gate, config=config, implementation=implementation), q, kv, gate)
        return (out, *pull(d_out))
    return f


def shard_vjp(implementation, config, q, kv, li, bt, t2r, gate, d_out):
    """One device's (out, dq, dkv, dgate) with dkv before its rounding to bf16 (fp32): the
    public vjp for out, dq and dgate, and for dkv the gradient's own two steps (residual
    forward, backward) asked for fp32 cache cotangents, as a row-split mesh asks each shard."""
    from qsa_jax.ops.sparse_attention import api
    from qsa_jax.ops.sparse_attention import backward as B
    from qsa_jax.ops.sparse_attention.backward_pallas import pallas_backward

    out, dq, _, dgate = vjp_call(implementation, config)(q, kv, li, bt, t2r, gate, d_out)
    kv_arrays = kv if isinstance(kv, tuple) else (kv,)
    problem, name = api._plan(q, kv, li, bt, t2r, gate, use_prefill_config=False, config=tuple(config),
                              implementation=implementation)
    backward = B.xla_backward if name == "xla" else pallas_backward

    @jax.jit  # compiled, as the vjp's own steps are (op by op, fp32 sums could round apart)
    def dkv_f32(q, kv_arrays, li, bt, t2r, gate, d_out):
        _, attention, lse = B.forward_with_residuals(problem, name, q, kv_arrays, li, bt, t2r, gate)
        return backward(problem, q, kv_arrays, li, bt, t2r, gate, attention, lse, d_out,
                        kv_dtype=jnp.float32)[1]

    dkv = dkv_f32(q, kv_arrays, li, bt, t2r, gate, d_out)
    return out, dq, dkv if isinstance(kv, tuple) else dkv[0], dgate


def _kv_error_over_floor(case, kv, config, d_out, dkv) -> float:
    """err(dkv) / err(bf16 floor) against the exact function's float64 cache cotangent."""
    from qsa_jax.ops.sparse_attention.base import check_sparse_attention_args

    kv_arrays = kv if isinstance(kv, tuple) else (kv,)
    meta = (case.logical_indices, case.block_table, case.token_to_req)
    problem = check_sparse_attention_args(
        jnp.asarray(case.q), jax.tree.map(jnp.asarray, kv), *(jnp.asarray(x) for x in meta),
        jnp.asarray(case.output_gate), use_prefill_config=False, config=tuple(config))
    ref = float64_gradients(problem, case.q, kv_arrays, *meta, case.output_gate, d_out, argnums=1)
    return max(error_over_floor(m, r) for m, r in zip(jax.tree.leaves(dkv), ref))


ROWS_OVER_TWO_AXES = ("rows2x2xheads2-gate2d", (2, 2, 2), ("dp", "fsdp", "model"), ("dp", "fsdp"), "model")


def gradient_checks(n, implementation, results, layouts, explicit_too=False, fused_first=True):
    """jax.vjp through a sharded call: the residual forward and the backward run per shard,
    so the output and every cotangent equal the shards' own one-device vjps (the cache's
    summed over row shards in fp32 and rounded once), and the compiled program holds no
    collective but the all-reduce of that sum (none at all when rows are whole). A layout
    named "...-gate2d" passes the gate as [R, H * D]."""
    for run in layout_runs(n, implementation, layouts, explicit_too, "/vjp", fused_first):
        results.append(_gradient_case(*run, implementation, gate2d="-gate2d/" in run[0]))


def _psum_dtypes(jitted_fn, args) -> list[str]:
    """dtypes of every psum operand in the traced program (the shard_map of an Explicit mesh)."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if "psum" in eqn.primitive.name:
                found.extend(str(v.aval.dtype) for v in eqn.invars)
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(jitted_fn)(*args).jaxpr)
    return found


def _gradient_case(name, shape, names, rows_ax, heads_ax, fused, explicit, implementation, gate2d=False):
    try:
        mc = mesh_case(shape, names, rows_ax, heads_ax, fused, explicit, seed=30 + len(name))
        case, kv, config = mc.case, mc.kv, mc.config
        d_out = np.random.default_rng(len(name)).standard_normal(case.q.shape).astype(case.q.dtype)
        flat = (lambda g: g.reshape(g.shape[0], -1)) if gate2d else (lambda g: g)  # noqa: E731

        def one_device(q, kv_, li, t2r, gate, d):
            out, dq, dkv, dgate = shard_vjp(implementation, config, q, kv_, jnp.asarray(li),
                                            jnp.asarray(case.block_table), jnp.asarray(t2r), flat(gate),
                                            jnp.asarray(d))
            return out, dq, dkv, dgate.reshape(gate.shape)

        want = per_shard_reference(mc.shards, fused, case, kv, d_out, one_device)
        args = (mc.rows_heads(case.q), mc.kv_on_mesh(), mc.rows(case.logical_indices), put(mc.mesh, case.block_table),
                mc.rows(case.token_to_req), mc.rows_heads(flat(case.output_gate)), mc.rows_heads(d_out))
        jitted = jax.jit(vjp_call(implementation))
        got = jitted(*args)
        for label, g, w in zip(("out", "dq", "dkv", "dgate"), got, want):
            gl_all, wl_all = jax.tree.leaves(g), jax.tree.leaves(w)
            if len(gl_all) != len(wl_all):
                return {"name": name, "problem": f"{label}: {len(gl_all)} arrays, expected {len(wl_all)}"}
            for gl, wl in zip(gl_all, wl_all):
                wl = wl.reshape(gl.shape) if gl.size == wl.size else wl
                if gl.shape != wl.shape or not np.array_equal(bits(gl), bits(wl)):
                    return {"name": name, "problem": f"{label} differs from the shards' one-device vjps "
                                                     f"({int(np.sum(bits(gl) != bits(wl)))} elements)"}
        found = set(collectives_in(jitted, *args))
        allowed = {"all-reduce"} if rows_ax else set()
        if found - allowed:
            return {"name": name, "problem": f"compiled program holds {sorted(found)}"}
        if rows_ax and not found:
            return {"name": name, "problem": "rows split, but no all-reduce sums the cache cotangent"}
        if rows_ax:
            # With rows split the sum over row shards must stay as accurate as one device's.
            ratio, bar = _kv_error_over_floor(case, kv, config, d_out, got[2]), BF16_BAR[implementation]["kv"]
            if not ratio <= bar:
                return {"name": name, "problem": f"dkv error {ratio:.2f}x the bf16 floor (bar {bar}x)"}
        if explicit and rows_ax:  # the reduction is in the traced program: it must sum fp32
            dtypes = _psum_dtypes(jitted, args)
            if not dtypes or set(dtypes) != {"float32"}:
                return {"name": name, "problem": f"the cache cotangent's psum operands are {dtypes}, not float32"}
        return {"name": name, "problem": None}
    except Exception:  # noqa: BLE001 - reported as the case's problem
        return {"name": name, "problem": traceback.format_exc(limit=4)}


def scaled_checks(n, implementation, results, layouts, explicit_too=False):
    """vLLM 0.34's arithmetic on a mesh: an e4m3 cache with k/v scales runs per shard (the
    scale pair whole on every device), equal to each shard's one-device call, no collectives."""
    for run in layout_runs(n, implementation, layouts, explicit_too, "/fp8-scaled"):
        name, rest = run[0], run[1:]
        results.append(_scaled_case(name, n, *rest, implementation))


def _scaled_case(name, n, shape, names, rows_ax, heads_ax, fused, explicit, implementation):
    try:
        mc = mesh_case(shape, names, rows_ax, heads_ax, fused, explicit, seed=60 + n, kv_dtype=E4M3)
        case = mc.case

        def call(q, kv_, li, t2r, gate, config=None):
            return qsa_jax.sparse_attention(q, kv_, li, case.block_table, t2r, gate, config=config,
                                            implementation=implementation, k_scale=0.5, v_scale=2.0)

        want = per_shard_reference(mc.shards, fused, case, mc.kv, case.q, lambda q, kv_, li, t2r, gate, _: (
            call(q, kv_, jnp.asarray(li), jnp.asarray(t2r), gate, mc.config),))[0]
        args = (mc.rows_heads(case.q), mc.kv_on_mesh(), mc.rows(case.logical_indices), mc.rows(case.token_to_req),
                mc.rows_heads(case.output_gate))
        jitted = jax.jit(call)
        problem = compare(name, jitted(*args), want, jitted, args)
        if problem is None and not explicit:  # the eager call goes the same way
            eager = compare(name, call(*args), want, jitted, args)
            problem = eager and "eager call: " + eager
        if problem is None:  # the pair prepared on the host (qsa_jax.kv_scales), traced
            prepared = (qsa_jax.kv_scales(0.5, 2.0, head_dim=case.head_dim),) + args
            traced = jax.jit(lambda s, q, kv_, li, t2r, gate: qsa_jax.sparse_attention(
                q, kv_, li, case.block_table, t2r, gate, config=None, implementation=implementation, scales=s))
            found = compare(name, traced(*prepared), want, traced, prepared)
            problem = found and "scales=KVScales: " + found
        return {"name": name, "problem": problem}
    except Exception:  # noqa: BLE001 - reported as the case's problem
        return {"name": name, "problem": traceback.format_exc(limit=4)}


def scaled_gradient_checks(n, implementation, results, layouts, explicit_too=False):
    """jax.vjp of vLLM 0.34's arithmetic on a mesh (an e4m3 cache, traced k/v scales): out, dq and
    dgate equal the shards' own one-device vjps bit for bit; the e4m3 cache cotangent is their
    fp32 sum over row shards rounded once to e4m3; the scales' cotangents are the sum of the
    shards' (to fp32 rounding: an all-reduce over every axis that splits rows or heads, the
    program's only collective)."""
    for run in layout_runs(n, implementation, layouts, explicit_too, "/fp8-scaled-vjp"):
        name, rest = run[0], run[1:]
        results.append(_scaled_vjp_case(name, n, *rest, implementation))


def _scaled_vjp(implementation, config=None):
    """(q, kv, li, bt, t2r, gate, k_scale, v_scale, d_out) -> (out, dq, dkv, dgate, dk_scale, dv_scale)."""
    def f(q, kv, li, bt, t2r, gate, ks, vs, d_out):
        out, pull = jax.vjp(lambda q, kv, gate, ks, vs: qsa_jax.sparse_attention(
            q, kv, li, bt, t2r, gate, config=config, implementation=implementation, k_scale=ks, v_scale=vs),
            q, kv, gate, ks, vs)
        return (out, *pull(d_out))
    return f


def _scaled_vjp_case(name, n, shape, names, rows_ax, heads_ax, fused, explicit, implementation):
    from qsa_jax.ops.sparse_attention import api
    from qsa_jax.ops.sparse_attention import backward as B
    from qsa_jax.ops.sparse_attention.backward_pallas import pallas_backward

    try:
        mc = mesh_case(shape, names, rows_ax, heads_ax, fused, explicit, seed=70 + n, kv_dtype=E4M3)
        case = mc.case
        d_out = np.random.default_rng(len(name)).standard_normal(case.q.shape).astype(case.q.dtype)
        ks, vs = jnp.float32(0.5), jnp.float32(2.0)
        scale_sums = np.zeros(2, np.float64)

        def one_device(q, kv_, li, t2r, gate, d):
            li, bt, t2r, d = jnp.asarray(li), jnp.asarray(case.block_table), jnp.asarray(t2r), jnp.asarray(d)
            # jitted: the scales traced, as in the sharded call (host scales round D^-0.5 k_scale
            # from float64 instead: an ulp apart).
            out, dq, _, dgate, dks, dvs = jax.jit(_scaled_vjp(implementation, mc.config))(
                q, kv_, li, bt, t2r, gate, ks, vs, d)
            scale_sums[:] += (float(dks), float(dvs))
            # The cache cotangent before its rounding to e4m3: the gradient's own steps (an fp8
            # cache's backward returns fp32).
            kv_arrays = kv_ if isinstance(kv_, tuple) else (kv_,)
            problem, impl = api._plan(q, kv_, li, bt, t2r, gate, use_prefill_config=False,
                                      config=tuple(mc.config), implementation=implementation,
                                      scales_given=(True, True))
            backward = B.xla_backward if impl == "xla" else pallas_backward

            @jax.jit
            def dkv_f32(q, kv_arrays, gate, d, ks, vs):
                scales = scale_operand(problem, ks, vs)  # traced, as in the sharded call
                _, attention, lse = B.forward_with_residuals(problem, impl, q, kv_arrays, li, bt, t2r, gate, scales)
                return backward(problem, q, kv_arrays, li, bt, t2r, gate, attention, lse, d, scales)[1]

            dkv = dkv_f32(q, kv_arrays, gate, d, ks, vs)
            return out, dq, dkv if isinstance(kv_, tuple) else dkv[0], dgate

        want = per_shard_reference(mc.shards, fused, case, mc.kv, d_out, one_device, kv_round=E4M3)
        args = (mc.rows_heads(case.q), mc.kv_on_mesh(), mc.rows(case.logical_indices), put(mc.mesh, case.block_table),
                mc.rows(case.token_to_req), mc.rows_heads(case.output_gate), ks, vs, mc.rows_heads(d_out))
        jitted = jax.jit(_scaled_vjp(implementation))
        got = jitted(*args)
        for label, g, w in zip(("out", "dq", "dkv", "dgate"), got[:4], want):
            for gl, wl in zip(jax.tree.leaves(g), jax.tree.leaves(w)):
                wl = wl.reshape(gl.shape) if gl.size == wl.size else wl
                if gl.shape != wl.shape or not np.array_equal(bits(gl), bits(wl)):
                    return {"name": name, "problem": f"{label} differs from the shards' one-device vjps "
                                                     f"({int(np.sum(bits(gl) != bits(wl)))} elements)"}
        mine = np.array([float(got[4]), float(got[5])])
        if not np.allclose(mine, scale_sums, rtol=1e-5, atol=0):
            return {"name": name, "problem": f"scale cotangents {mine} against the shards' sum {scale_sums}"}
        found = set(collectives_in(jitted, *args))
        if found != {"all-reduce"}:
            return {"name": name, "problem": f"compiled program holds {sorted(found)}, not one kind: all-reduce"}
        return {"name": name, "problem": None}
    except Exception:  # noqa: BLE001 - reported as the case's problem
        return {"name": name, "problem": traceback.format_exc(limit=4)}


# --- indexer operators ----------------------------------------------------

def compress_checks(n, implementation, results):
    case = compress_case(np.random.default_rng(100 + n), chunk_lens=[5, 7, 3, 9], edge=True)
    a = case.arrays()
    order = ("raw_keys", "raw_positions", "compressor_state_cache", "compressor_state_block_table",
             "token_to_req", "query_start_loc", "logical_positions", "compressed_slots")
    want = qsa_jax.compress_groups_with_ratio(*(a[k] for k in order), case.compress_ratio, a["rope_cache"],
                                              implementation=implementation)
    layouts = [((n,), ("data",), False), ((n // 2, 2), ("data", "model"), False)]
    layouts += [((n,), ("data",), True)] if n == 4 else []
    for shape, names, explicit in layouts:
        name = (f"compress/{implementation}/{n}dev/rows{shape[0]}" + ("" if len(shape) == 1 else "-of-2d")
                + ("/explicit" if explicit else ""))
        try:
            mesh = make_mesh(shape, names, explicit)
            per_row = {"token_to_req", "logical_positions", "compressed_slots"}
            args = [put(mesh, a[k], "data" if k in per_row else None) for k in order] + [put(mesh, a["rope_cache"])]

            def call(*x, ratio=case.compress_ratio):
                return qsa_jax.compress_groups_with_ratio(*x[:8], ratio, x[8], implementation=implementation)

            jitted = jax.jit(call)
            problem = compare(name, jitted(*args), want, jitted, args)
            if problem is None and n == 2 and not explicit:  # without rope_cache (its own layout)
                plain = jax.jit(lambda *x: qsa_jax.compress_groups_with_ratio(
                    *x, case.compress_ratio, implementation=implementation))
                no_rope = qsa_jax.compress_groups_with_ratio(*(a[k] for k in order), case.compress_ratio,
                                                             implementation=implementation)
                problem = compare(name, plain(*args[:8]), no_rope, plain, args[:8])
            results.append({"name": name, "problem": problem})
        except Exception:  # noqa: BLE001
            results.append({"name": name, "problem": traceback.format_exc(limit=4)})


def store_checks(n, implementation, results):
    case = store_case(np.random.default_rng(200 + n), n=24, pages=16, page_size=4, width=24)
    want = qsa_jax.store_cache_rows(case.cache, case.slot_mapping, case.rows, implementation=implementation)
    layouts = [("pages", (n,), ("pages",), False), (None, (n,), ("data",), False)]
    layouts += [("pages", (n,), ("pages",), True)] if n == 4 else []
    for pages_ax, shape, names, explicit in layouts:
        name = (f"store/{implementation}/{n}dev/" + ("pages-split" if pages_ax else "replicated")
                + ("/explicit" if explicit else ""))
        try:
            mesh = make_mesh(shape, names, explicit)
            args = (put(mesh, case.cache, pages_ax), put(mesh, case.slot_mapping), put(mesh, case.rows))
            jitted = jax.jit(lambda *x: qsa_jax.store_cache_rows(*x, implementation=implementation))
            problem = compare(name, jitted(*args), want, jitted, args)
            if problem is None and pages_ax and not explicit:  # eager, the cache donated (in place)
                fresh = (put(mesh, case.cache, pages_ax),) + args[1:]
                donated = qsa_jax.store_cache_rows(*fresh, donate=True, implementation=implementation)
                eager = compare(name, donated, want, jitted, args)
                problem = eager and "eager donated call: " + eager
            results.append({"name": name, "problem": problem})
        except Exception:  # noqa: BLE001
            results.append({"name": name, "problem": traceback.format_exc(limit=4)})


# --- jax.vmap on a mesh ----------------------------------------------------

def _batch_bits_equal(got, want) -> bool:
    """``got``: batched results; ``want``: per-example results (lists of the same trees)."""
    got = [np.asarray(x) for x in jax.tree.leaves(got)]
    return all(np.array_equal(bits(g[i]), bits(w)) for i, one in enumerate(want)
               for g, w in zip(got, jax.tree.leaves(one)))


def vmap_checks(implementation, results):
    """``jax.vmap`` over a leading batch on a mesh runs per shard: forward and ``vmap`` of the
    vjp against one-device calls, the compiled program free of collectives (but the row-split
    backward's one all-reduce), the batch itself split or not, nested vmaps, Auto and
    Explicit meshes; store and compress batched likewise."""
    case = attention_case(21)
    li, bt, t2r = (jnp.asarray(x) for x in (case.logical_indices, case.block_table, case.token_to_req))
    batch = 4
    rng = np.random.default_rng(21)
    scaled = [rng.uniform(0.5, 2.0, 2) for _ in range(batch)]
    qs = jnp.asarray(np.stack([case.q * s[0] for s in scaled]), jnp.bfloat16)
    kvs = jnp.asarray(np.stack([case.kv_cache * s[1] for s in scaled]), jnp.bfloat16)
    gates = jnp.asarray(np.stack([np.roll(case.output_gate, i, axis=0) for i in range(batch)]), jnp.bfloat16)
    d_outs = jnp.asarray(rng.standard_normal(qs.shape), jnp.bfloat16)

    def attend(q, kv, gate, d_out):
        del d_out
        return qsa_jax.sparse_attention(q, kv, li, bt, t2r, gate, implementation=implementation)

    def vjp(q, kv, gate, d_out):
        return jax.vjp(lambda *x: attend(*x, None), q, kv, gate)[1](d_out)

    # (name, mesh shape, axis names, q's and gate's spec, the cache's spec, explicit)
    layouts = [
        ("heads", (2,), ("model",), (None, None, "model"), (None, None, "model"), False),
        ("batch2xheads2", (2, 2), ("data", "model"), ("data", None, "model"), ("data", None, "model"), False),
        ("batch2xheads2/explicit", (2, 2), ("data", "model"), ("data", None, "model"), ("data", None, "model"),
         True),
        ("batch4/explicit", (4,), ("data",), ("data",), ("data",), True),
        # rows split, the batch whole: the backward sums the cache cotangent over the row shards
        ("rows2xheads2", (2, 2), ("data", "model"), (None, "data", "model"), (None, None, "model"), False),
    ]
    for lname, shape, names, q_spec, kv_spec, explicit in layouts:
        name = f"vmap/{implementation}/{lname}"
        try:
            mesh = make_mesh(shape, names, explicit)
            rows_split = q_spec[1:2] not in ((), (None,))
            args = (put(mesh, qs, *q_spec), put(mesh, kvs, *kv_spec), put(mesh, gates, *q_spec),
                    put(mesh, d_outs, *q_spec))
            problems = []
            for what, fn in (("forward", attend), ("vmap(vjp)", vjp)):
                jitted = jax.jit(jax.vmap(fn))
                got = jitted(*args)
                per_example = [fn(*(x[i] for x in (qs, kvs, gates, d_outs))) for i in range(batch)]
                whole = jax.jit(jax.vmap(fn))(qs, kvs, gates, d_outs)  # the same vmap on one device
                whole = [jax.tree.map(lambda x, i=i: np.asarray(x)[i], whole) for i in range(batch)]
                if what == "forward":
                    if not _batch_bits_equal(got, per_example):
                        problems.append("forward: not bit-identical to the per-example one-device calls")
                    if not explicit and not _batch_bits_equal(jax.vmap(fn)(*args), per_example):
                        problems.append("eager forward: not bit-identical")
                else:
                    # dq and dgate bit for bit. XLA on CPU may round a cache cotangent 1 ulp apart
                    # between programs of different shapes: per device it must equal the
                    # per-example calls' or the one-device vmap's. With rows split it is the row
                    # shards' fp32 sum: as accurate as the one-device vmap's (against float64).
                    if not _batch_bits_equal((got[0], got[2]), [(w[0], w[2]) for w in per_example]):
                        problems.append("vmap(vjp): dq or dgate not bit-identical to the per-example calls")
                    if rows_split:
                        ratios = [[_kv_error_over_floor(
                            dataclasses.replace(case, q=np.asarray(qs[i]), output_gate=np.asarray(gates[i])),
                            kvs[i], select_config(ROWS, KV_HEADS, False, 2051), np.asarray(d_outs[i]),
                            dkv) for dkv in (np.asarray(got[1])[i], whole[i][1])] for i in range(batch)]
                        worse = [(round(m, 3), round(o, 3)) for m, o in ratios if not m <= 1.02 * o]
                        if worse:
                            problems.append(f"dkv error over the bf16 floor (mesh, one device): {worse}")
                    elif not (_batch_bits_equal(got[1], [w[1] for w in per_example])
                              or _batch_bits_equal(got[1], [w[1] for w in whole])):
                        problems.append("vmap(vjp): dkv equals neither the per-example calls' nor the "
                                        "one-device vmap's")
                allowed = ("all-reduce",) if rows_split and what != "forward" else ()
                found = collectives_in(jitted, *args)
                if set(found) - set(allowed):
                    problems.append(f"{what}: compiled program holds {found}")
                if allowed and not found:
                    problems.append(f"{what}: rows split, but no all-reduce sums the cache cotangent")
            results.append({"name": name, "problem": "; ".join(problems) or None})
        except Exception:  # noqa: BLE001
            results.append({"name": name, "problem": traceback.format_exc(limit=4)})

    _vmap_edge_checks(implementation, results, case, qs, kvs, gates, attend)

    def nested():  # vmap of vmap: two batch roles
        mesh = make_mesh((2,), ("model",))
        q22, g22 = qs.reshape(2, 2, *qs.shape[1:]), gates.reshape(2, 2, *gates.shape[1:])
        args = (put(mesh, q22, None, None, None, "model"), put(mesh, kvs[0], None, "model"),
                put(mesh, g22, None, None, None, "model"), None)
        jitted = jax.jit(jax.vmap(jax.vmap(attend, in_axes=(0, None, 0, None)), in_axes=(0, None, 0, None)))
        want = [jnp.stack([attend(q22[i, j], kvs[0], g22[i, j], None) for j in range(2)]) for i in range(2)]
        return jitted, args, want

    def store():  # a batch of caches, pages split
        sc = store_case(np.random.default_rng(22), n=24, pages=16, page_size=4, width=24)
        caches = jnp.stack([jnp.asarray(sc.cache), -jnp.asarray(sc.cache)])

        def one(cache):
            return qsa_jax.store_cache_rows(cache, sc.slot_mapping, sc.rows, implementation=implementation)

        return jax.jit(jax.vmap(one)), (put(make_mesh((4,), ("pages",)), caches, None, "pages"),), [
            one(c) for c in caches]

    def compress():  # a batch of raw keys, rows split (the halo)
        cc = compress_case(np.random.default_rng(23), chunk_lens=[5, 7, 3, 9], edge=True)
        a = cc.arrays()
        order = ("raw_keys", "raw_positions", "compressor_state_cache", "compressor_state_block_table",
                 "token_to_req", "query_start_loc", "logical_positions", "compressed_slots")
        keys = jnp.stack([jnp.asarray(a["raw_keys"]), jnp.asarray(a["raw_keys"])[::-1]])
        mesh = make_mesh((2,), ("data",))
        per_row = {"token_to_req", "logical_positions", "compressed_slots"}
        rest = [put(mesh, a[k], "data" if k in per_row else None) for k in order[1:]]

        def one(raw_keys, *others):
            return qsa_jax.compress_groups_with_ratio(raw_keys, *others, cc.compress_ratio, a["rope_cache"],
                                                      implementation=implementation)

        jitted = jax.jit(jax.vmap(one, in_axes=(0,) + (None,) * len(rest)))
        return jitted, (put(mesh, keys),) + tuple(rest), [one(k, *(a[o] for o in order[1:])) for k in keys]

    _vmap_case(results, f"vmap/{implementation}/nested-2x2/heads", nested)
    _vmap_case(results, f"vmap/{implementation}/store/pages-split", store)
    _vmap_case(results, f"vmap/{implementation}/compress/rows-split", compress)


def _vmap_case(results, name, make):
    """One vmap-on-a-mesh case: ``make()`` -> (jitted, args, per-example results), compared bit for
    bit, and no collective in the compiled program."""
    try:
        jitted, args, want = make()
        problem = None if _batch_bits_equal(jitted(*args), want) else "not bit-identical"
        found = collectives_in(jitted, *args)
        results.append({"name": name, "problem": problem or (f"compiled program holds {found}" if found else None)})
    except Exception:  # noqa: BLE001
        results.append({"name": name, "problem": traceback.format_exc(limit=4)})


def _vmap_edge_checks(implementation, results, case, qs, kvs, gates, attend):
    """vmap on an Auto mesh where the layout is not uniform (a review's cases): a StridedQuery
    with the batch split; the batch split on some batched arguments and whole on others (those
    are resliced, no collective); a gate viewed as [R, D, H] with rows split; and the batch of
    one argument on the mesh axis that splits another's rows, refused naming the axis."""
    li, bt, t2r = (jnp.asarray(x) for x in (case.logical_indices, case.block_table, case.token_to_req))
    batch, rows = qs.shape[0], qs.shape[1]

    def per_example(fn, *batched):
        return [fn(*(x[i] for x in batched)) for i in range(batch)]

    def check(name, fn, args, want):
        _vmap_case(results, name, lambda: (jax.jit(jax.vmap(fn)), args, want))

    mesh = make_mesh((2,), ("data",))
    # q read in place from a wider [R, 2 * H * D] table (its first H * D columns)
    tables = jnp.concatenate([qs.reshape(batch, rows, -1), -qs.reshape(batch, rows, -1)], axis=2)

    def strided(table, kv, gate):
        q = qsa_jax.StridedQuery.from_columns(table, start=0, num_heads=HEADS, head_dim=DIM)
        return qsa_jax.sparse_attention(q, kv, li, bt, t2r, gate, implementation=implementation)

    check(f"vmap/{implementation}/StridedQuery/batch2", strided,
          (put(mesh, tables, "data"), put(mesh, kvs, "data"), put(mesh, gates, "data")),
          per_example(strided, tables, kvs, gates))
    mesh2 = make_mesh((2, 2), ("data", "model"))
    check(f"vmap/{implementation}/batch-split-on-some", lambda q, kv, g: attend(q, kv, g, None),
          (put(mesh2, qs, "data", None, "model"), put(mesh2, kvs, None, None, "model"),
           put(mesh2, gates, "data", None, "model")),
          per_example(lambda q, kv, g: attend(q, kv, g, None), qs, kvs, gates))
    views = gates.reshape(batch, rows, DIM, HEADS)  # vLLM's view_as reads it as [R, H, D]
    check(f"vmap/{implementation}/gate-view-RDH/rows2", lambda q, kv, g: attend(q, kv, g, None),
          (put(mesh, qs, None, "data"), put(mesh, kvs), put(mesh, views, None, "data")),
          per_example(lambda q, kv, g: attend(q, kv, g.reshape(rows, HEADS, DIM), None), qs, kvs, views))
    name = f"vmap/{implementation}/batch-and-rows-on-one-axis"
    try:
        tables_b = jnp.stack([bt, jnp.roll(bt, 1, axis=0)])  # the block table batched, its batch on "data"
        fn = jax.jit(jax.vmap(lambda q, l, b, t, g: qsa_jax.sparse_attention(
            q, kvs[0], l, b, t, g, implementation=implementation), in_axes=(None, None, 0, None, None)))
        jax.block_until_ready(fn(put(mesh, qs[0], "data"), put(mesh, li, "data"), put(mesh, tables_b, "data"),
                                 put(mesh, t2r, "data"), put(mesh, gates[0], "data")))  # rows on "data" too
        results.append({"name": name, "problem": "ran: the batch and the rows on one mesh axis"})
    except Exception as e:  # noqa: BLE001 - XLA wraps the partitioner's MeshLayoutError
        ok = "mesh axis 'data' splits both" in str(e)
        results.append({"name": name, "problem": None if ok else traceback.format_exc(limit=4)})


# --- layouts that must be refused -----------------------------------------

def _run_case(results, name, check):
    """Append ``check()``'s problem (None: passed) under ``name``; an exception is the problem."""
    try:
        problem = check()
    except Exception:  # noqa: BLE001 - reported as the case's problem
        problem = traceback.format_exc(limit=6)
    results.append({"name": name, "problem": problem})


def whole_beside_split_checks(results):
    """Arguments whole on every device beside others that split the same role (session 31):
    metadata and gate replicated while q's rows are split, the gate whole while q's heads and
    the cache's KV heads are split, metadata and gate whole beside rows and heads split. Each runs eager and under jit on Auto and Explicit
    meshes: bit-identical to the one-device call, no collective (a whole argument is cut to its
    shard locally); and jax.grad of a loss through it equals the one-device gradient bit for
    bit, each cotangent in its primal's sharding. A whole cache beside split heads stays
    refused (bad_layout_checks): cutting it would copy a slice of the cache every call."""
    case = attention_case(11)
    kv4 = qsa_jax.repeat_kv_heads(jnp.asarray(case.kv_cache), 2)
    base = (jnp.asarray(case.q), kv4, jnp.asarray(case.logical_indices), jnp.asarray(case.block_table),
            jnp.asarray(case.token_to_req), jnp.asarray(case.output_gate))
    layouts = {"rows split, metadata and gate whole": (("data",), (), (), (), (), ()),
               "heads split, gate whole": ((None, "model"), (None, "model"), (), (), (), ()),
               "rows and heads split, metadata and gate whole": (("data", "model"), (None, "model"), (), (), (), ())}
    want = qsa_jax.sparse_attention(*base, implementation="xla")
    weights = jnp.asarray(np.random.default_rng(12).standard_normal(case.q.shape).astype(np.float32))

    def loss(*a):
        return jnp.sum(qsa_jax.sparse_attention(*a, implementation="xla").astype(jnp.float32) * weights)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 5)))
    want_grads = grad(*base)
    for explicit in (False, True):
        mesh = make_mesh((2, 4), ("data", "model"), explicit=explicit)
        kind = "explicit" if explicit else "auto"
        for label, specs in layouts.items():
            args = tuple(put(mesh, x, *sp) for x, sp in zip(base, specs))
            jitted = jax.jit(lambda *a: qsa_jax.sparse_attention(*a, implementation="xla"))
            _run_case(results, f"whole-beside-split/{label}/{kind}/eager",
                      lambda: compare("", qsa_jax.sparse_attention(*args, implementation="xla"), want, jitted, args))
            _run_case(results, f"whole-beside-split/{label}/{kind}/jit",
                      lambda: compare("", jitted(*args), want, jitted, args))

            def grads_check(args=args):
                got = grad(*args)
                for g, w, primal in zip(got, want_grads, (args[0], args[1], args[5])):
                    if not np.array_equal(bits(g), bits(w)):
                        return "gradient not bit-identical to the one-device gradient"
                    if jax.typeof(g).sharding != jax.typeof(primal).sharding and explicit:
                        return f"cotangent typed {jax.typeof(g).sharding}, primal {jax.typeof(primal).sharding}"
                return None
            _run_case(results, f"whole-beside-split/{label}/{kind}/grad", grads_check)



def bad_layout_checks(results):
    """Each unsupported layout raises, eagerly before tracing and under jit, naming the argument."""
    case = attention_case(7)
    mesh = make_mesh((2, 4), ("data", "model"))
    kv4 = qsa_jax.repeat_kv_heads(jnp.asarray(case.kv_cache), 2)

    def attention(q=(None,), kv=(), kv_array=None, li=(), gate=(None,)):
        return (put(mesh, case.q, *q), put(mesh, case.kv_cache if kv_array is None else kv_array, *kv),
                put(mesh, case.logical_indices, *li), put(mesh, case.block_table),
                put(mesh, case.token_to_req, *li[:1]), put(mesh, case.output_gate, *gate))

    cases = {
        "q head_dim split": (qsa_jax.sparse_attention, attention(q=(None, None, "model")), "q"),
        "kv pages split": (qsa_jax.sparse_attention, attention(kv=("model",)), "kv_cache"),
        "heads split, KV heads whole": (qsa_jax.sparse_attention,
                                        attention(q=(None, "model"), gate=(None, "model")), "kv_cache"),
        "heads and KV heads on different axes": (
            qsa_jax.sparse_attention, attention(q=(None, "model"), gate=(None, "model"), kv=(None, "data"),
                                                kv_array=kv4), "kv_cache"),
        "rows split differently": (qsa_jax.sparse_attention, attention(q=("data",), li=("model",)),
                                   "logical_indices"),
    }
    cc = compress_case(np.random.default_rng(3), chunk_lens=[4, 4])
    ca = cc.arrays()
    order = ("raw_keys", "raw_positions", "compressor_state_cache", "compressor_state_block_table",
             "token_to_req", "query_start_loc", "logical_positions", "compressed_slots")
    rows_split = {"raw_keys", "token_to_req", "logical_positions", "compressed_slots"}
    compress_args = [put(mesh, ca[k], "data" if k in rows_split else None) for k in order]
    cases["compress raw_keys split"] = (
        lambda *x, implementation=None: qsa_jax.compress_groups_with_ratio(
            *x, cc.compress_ratio, implementation=implementation), compress_args, "raw_keys")
    sc = store_case(np.random.default_rng(4), n=8, pages=8, page_size=4, width=24)
    cases["store rows split"] = (qsa_jax.store_cache_rows, (put(mesh, sc.cache, "model"),
                                 put(mesh, sc.slot_mapping, "data"), put(mesh, sc.rows, "data")), "slot_mapping")
    cases["store cache whole, rows split"] = (qsa_jax.store_cache_rows, (put(mesh, sc.cache),
                                              put(mesh, sc.slot_mapping), put(mesh, sc.rows, "data")), "rows")
    strided = qsa_jax.StridedQuery.from_columns(put(mesh, case.q.reshape(case.q.shape[0], -1)), start=0,
                                                num_heads=HEADS, head_dim=DIM)
    cases["StridedQuery, rows split"] = (
        qsa_jax.sparse_attention, (strided, put(mesh, case.kv_cache), put(mesh, case.logical_indices, "data"),
                                   put(mesh, case.block_table), put(mesh, case.token_to_req, "data"),
                                   put(mesh, case.output_gate, "data")), "StridedQuery")
    view = case.output_gate.reshape(ROWS, DIM, HEADS)  # vLLM's view_as reads it as [R, H, D]
    cases["heads split, gate viewed as [R, D, H]"] = (
        qsa_jax.sparse_attention, (put(mesh, case.q, None, "model"), put(mesh, kv4, None, "model"),
                                   put(mesh, case.logical_indices), put(mesh, case.block_table),
                                   put(mesh, case.token_to_req), put(mesh, view)), "view_as")
    explicit = make_mesh((2, 4), ("data", "model"), explicit=True)
    cases["explicit mesh: heads split, KV heads whole"] = (
        qsa_jax.sparse_attention, (put(explicit, case.q, None, "model"), put(explicit, case.kv_cache),
                                   *(put(explicit, getattr(case, k)) for k in
                                     ("logical_indices", "block_table", "token_to_req")),
                                   put(explicit, case.output_gate, None, "model")), "kv_cache")
    # A mesh mixing Explicit and Auto axes: the Auto axis's split (here the KV heads') is not in
    # the types; the operator must refuse rather than gather the cache (session 31).
    mixed = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"),
                              axis_types=(AxisType.Explicit, AxisType.Auto))
    cases["heads split, cache whole (KV heads dividing)"] = (
        qsa_jax.sparse_attention, attention(q=(None, "model"), gate=(None, "model"), kv_array=kv4), "kv_cache")
    cases["mixed Explicit/Auto mesh"] = (
        qsa_jax.sparse_attention, (put(mixed, case.q, "data", "model"), put(mixed, kv4, None, "model"),
                                   put(mixed, case.logical_indices, "data"), put(mixed, case.block_table),
                                   put(mixed, case.token_to_req, "data"), put(mixed, case.output_gate, "data", "model")),
        "Auto")
    for label, (fn, args, argname) in cases.items():
        for how in ("eager", "jit"):
            name = f"bad/{label}/{how}"
            call = fn if how == "eager" else jax.jit(lambda *x, fn=fn: fn(*x, implementation="xla"))
            try:
                call(*args) if how == "jit" else call(*args, implementation="xla")
            except qsa_jax.MeshLayoutError as exc:
                ok = argname in str(exc)
                problem = None if ok else f"the error does not name {argname}: {exc}"
            except Exception as exc:  # noqa: BLE001 - under Auto-axes jit XLA wraps our error
                ok = how == "jit" and "MeshLayoutError" in str(exc) and argname in str(exc)
                problem = None if ok else f"{type(exc).__name__}: {str(exc)[:400]}"
            else:
                problem = "no error"
            results.append({"name": name, "problem": problem})


def set_mesh_check(results):
    """Under ``jax.set_mesh`` of an Explicit (or Auto) mesh, arguments on no mesh run whole, as on
    one device: forward (eager and jit), vjp and the store, bit for bit (under an Explicit
    context custom_partitioning does not lower: the local call runs directly)."""
    case = attention_case(19)
    args = tuple(jnp.asarray(x) for x in (case.q, case.kv_cache, case.logical_indices, case.block_table,
                                          case.token_to_req, case.output_gate))
    d_out = jnp.asarray(np.random.default_rng(19).standard_normal(case.q.shape), jnp.bfloat16)
    sc = store_case(np.random.default_rng(20), n=12, pages=8, page_size=4, width=24)
    vjp = vjp_call("xla")

    def everything():
        return (qsa_jax.sparse_attention(*args, implementation="xla"),
                jax.jit(lambda *a: qsa_jax.sparse_attention(*a, implementation="xla"))(*args),
                jax.jit(vjp)(*args, d_out),
                qsa_jax.store_cache_rows(sc.cache, sc.slot_mapping, sc.rows, implementation="xla"))

    want = everything()
    for explicit in (True, False):
        name = f"set_mesh/{'explicit' if explicit else 'auto'}/arguments-on-no-mesh"
        try:
            with jax.set_mesh(make_mesh((2, 2), ("data", "model"), explicit)):
                got = everything()
            problem = None
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                if not np.array_equal(bits(g), bits(w)):
                    problem = "differs from the calls without a mesh context"
            results.append({"name": name, "problem": problem})
        except Exception:  # noqa: BLE001
            results.append({"name": name, "problem": traceback.format_exc(limit=4)})


def control_check(results):
    """The collective search itself: a program that must all-reduce is caught."""
    mesh = make_mesh((8,), ("data",))
    x = put(mesh, np.arange(64, dtype=np.float32), "data")
    found = collectives_in(jax.jit(jnp.sum), x)
    results.append({"name": "control/sharded sum shows a collective",
                    "problem": None if found else "the collective search missed an all-reduce"})


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if jax.device_count() < 8:
        print(json.dumps([{"name": "setup", "problem": f"needs 8 devices, has {jax.device_count()}"}]))
        return 1
    results: list[dict] = []
    control_check(results)
    set_mesh_check(results)
    strided_query_check(results)
    for n in (2, 4, 8):
        attention_checks(n, "xla", results)
        compress_checks(n, "xla", results)
        store_checks(n, "xla", results)
    gradient_checks(2, "xla", results, attention_layouts(2))
    gradient_checks(4, "xla", results, attention_layouts(4), explicit_too=True)
    gradient_checks(8, "xla", results, [x for x in attention_layouts(8) if x[0] == "rows2xheads4"])
    # Rows over two mesh axes, the gate as [R, H * D], an Explicit mesh with rows split.
    gradient_checks(8, "xla", results, [ROWS_OVER_TWO_AXES], explicit_too=True)
    scaled_checks(4, "xla", results, attention_layouts(4), explicit_too=True)
    scaled_gradient_checks(4, "xla", results, attention_layouts(4), explicit_too=True)
    vmap_checks("xla", results)
    if "--pallas" in argv:  # the interpreter is slow: one layout of each kind
        attention_checks(8, "pallas", results, explicit_too=False,
                         layouts=[x for x in attention_layouts(8) if x[0] == "rows4xheads2"])
        attention_checks(4, "pallas", results, explicit_too=False,
                         layouts=[x for x in attention_layouts(4) if x[0] == "heads"])
        gradient_checks(4, "pallas", results, [x for x in attention_layouts(4) if x[0] == "rows2xheads2"])
        gradient_checks(2, "pallas", results, [x for x in attention_layouts(2) if x[0] == "heads"],
                        fused_first=False)
        scaled_checks(8, "pallas", results, [x for x in attention_layouts(8) if x[0] == "rows4xheads2"])
        scaled_gradient_checks(4, "pallas", results, [x for x in attention_layouts(4) if x[0] == "rows2xheads2"])
        compress_checks(2, "pallas", results)
        store_checks(4, "pallas", results)
    whole_beside_split_checks(results)
    bad_layout_checks(results)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
