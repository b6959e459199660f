"""Speed and memory of the sparse-attention gradients (issue 16).

    python -m bench.backward [--tp TP1] [--rows 1024,2048] [--requests 0,1] [--out DIR]
                             [--variants sorted,sorted:32:8:17,16:4,inverted,inverted:16:8:0:64]
                             [--grad-orders selection]

Per (geometry, rows, requests), on one set of fresh inputs at the real shapes (GPU; CPU runs
reduced sizes as a smoke test, see ``bench.inputs.geometry``):

* ``forward``: the Pallas forward alone (what inference runs);
* ``backward``: the Pallas backward alone (``backward_pallas.pallas_backward`` at its
  default walk, ``resolve_order``: since session 10 the inverted one -- the XLA pre-pass,
  the dq walk, the token-major dK/dV kernel and the index it reads), from residuals
  computed beforehand;
* ``grad pallas``: ``jax.grad`` through ``sparse_attention(implementation="pallas")``
  (the residual forward + the backward);
* ``grad xla``: the same with ``implementation="xla"`` (the XLA reference forward
  and the XLA backward of backward.py);
* ``grad xla autodiff`` (``--autodiff``): JAX's own reverse mode through the XLA
  reference forward, with no custom VJP (what existed before this issue);
* each ``--variants`` entry ``[order:]block_n:num_warps[:splits[:lanes[:dq_warps]]]`` or just
  an order (``backward_pallas.ORDERS``, e.g. ``sorted``; 0: that knob's default; lanes and
  dq_warps: the inverted order's, e.g. ``inverted:16:2:0:0:4``): the backward alone with that
  walk and launch (same gradient up to the atomics' summation order; a bare
  ``block_n:num_warps`` applies to the default walk, i.e. the inverted one's dK/dV kernel);
* ``grad pallas <order>`` for each ``--grad-orders`` entry: ``grad pallas`` with that order
  as the Pallas backward's default while it is traced (e.g. ``selection``);
* ``backward acq_rel atomics`` (skip with ``--no-acq-rel``): the selection walk alone with
  its fp32 atomics in Pallas's own acquire-release order, the default before session 6
  (the default is relaxed order: qsa_jax/ops/_relaxed_atomics.py says why that is sound).

Every backward step after the first also reports ``vs backward``: the largest relative
Frobenius difference of its dq / dK|dV / dgate from the default backward's (summation
order only: ~1e-3 at most is bf16 rounding flips, more is a bug).

Columns: GPU busy time (sum of kernel durations in a profiler trace, ``bench.
kernel_trace``; blank on CPU), wall clock per call, XLA's temporary buffer bytes of
the compiled function (``memory_analysis``: a [rows, H, W] fp32 tensor would show
here) and the device's ``peak_bytes_in_use`` after the step (monotonic over the run:
the steps run in the order above). Targets (issue 16): backward <= 2.5x forward at
>= 1024 programs (rows x KV heads); grad pallas >= 5x faster than grad xla.
Writes ``backward.json`` and ``backward.md`` to ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp

REPS = 5


def _measure(fn, args, reps: int, trace: bool = True) -> tuple[dict, object]:
    """(timing and memory record, the step's output); ``trace=False``: wall time only (no
    busy time), for runs under Nsight Compute, which holds CUPTI so that JAX's profiler
    cannot attach (session 9: its errors ended in a segmentation fault)."""
    from bench import kernel_trace

    compiled = jax.jit(fn).lower(*args).compile()
    mem = compiled.memory_analysis()
    jax.block_until_ready(compiled(*args))
    t0 = time.perf_counter()
    for _ in range(reps):
        out = compiled(*args)
    jax.block_until_ready(out)
    wall = (time.perf_counter() - t0) / reps
    trace = trace and kernel_trace.trace_runs(lambda: compiled(*args), runs=reps, calls_per_run=1,
                                              wait=jax.block_until_ready)
    stats = jax.devices()[0].memory_stats() or {}
    return {"wall_us": wall * 1e6,
            "busy_us": trace.busy_us_per_call if trace else None,
            "kernels": trace.describe(4) if trace else "",
            "temp_bytes": getattr(mem, "temp_size_in_bytes", None),
            "peak_bytes_in_use": stats.get("peak_bytes_in_use")}, out


def _variant(text: str) -> dict:
    """``[order:]block_n:num_warps[:splits[:lanes[:dq_warps]]]`` or just an order (backward_pallas.ORDERS);
    0: the default."""
    fields = text.split(":")
    kw = {"order": fields.pop(0)} if fields and not fields[0].isdigit() else {}
    kw.update(zip(("block_n", "num_warps", "num_splits", "lanes", "dq_warps"), (int(x) or None for x in fields)))
    return kw


@jax.jit
def _relative_difference(x, ref):
    """Largest over the arrays of ||x - ref|| / ||ref|| in fp32 (0 for an all-zero ref)."""
    worst = jnp.float32(0)
    for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(ref)):
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
        norm = jnp.linalg.norm(b)
        worst = jnp.maximum(worst, jnp.where(norm > 0, jnp.linalg.norm(a - b) / norm, 0.0))
    return worst


@contextlib.contextmanager
def default_backward_order(order: str | None):
    """The Pallas backward's default walk set to ``order`` (None: unchanged) while inside.

    JAX caches the custom_vjp's traced backward per (problem, implementation), so the
    caches are cleared on the way in and out: without that a step reuses the backward
    traced with the previous default (on the H200 in session 7, the "grad pallas inverted"
    row ran the default kernel)."""
    from qsa_jax.ops.sparse_attention import backward_pallas

    previous = backward_pallas.DEFAULT_WALK
    if order is None or order == previous:
        yield
        return
    backward_pallas.DEFAULT_WALK = order
    jax.clear_caches()
    try:
        yield
    finally:
        backward_pallas.DEFAULT_WALK = previous
        jax.clear_caches()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", default="TP1")
    ap.add_argument("--rows", default=None, help="default: 64,1024,2048 on GPU, 4,16 on CPU")
    ap.add_argument("--reps", type=int, default=REPS)
    ap.add_argument("--pool-gb", type=float, default=1.0)
    ap.add_argument("--requests", default="0",
                    help="comma-separated: requests the rows are dealt to (0: one per row, pages shared "
                         "at random across requests when the pool is smaller than all contexts; 1: one "
                         "long sequence, as in training)")
    ap.add_argument("--variants", default="",
                    help="comma-separated [order:]block_n:num_warps[:splits[:lanes[:dq_warps]]] or order")
    ap.add_argument("--grad-orders", default="", help="comma-separated orders to time jax.grad with")
    ap.add_argument("--no-acq-rel", dest="acq_rel", action="store_false",
                    help="skip the backward with acquire-release atomics (see the docstring)")
    ap.add_argument("--autodiff", action="store_true", help="also time JAX's autodiff of the XLA forward")
    ap.add_argument("--no-xla", dest="xla", action="store_false", help="skip grad xla")
    ap.add_argument("--no-trace", dest="trace", action="store_false",
                    help="wall time only, no profiler trace (to run under Nsight Compute)")
    ap.add_argument("--out", help="folder for backward.json and backward.md")
    a = ap.parse_args()

    import qsa_jax
    from bench import inputs
    from qsa_jax.ops.sparse_attention import backward as B
    from qsa_jax.ops.sparse_attention import xla as xla_impl
    from qsa_jax.ops.sparse_attention.api import _plan
    from qsa_jax.ops.sparse_attention import backward_pallas
    from qsa_jax.ops.sparse_attention.backward_pallas import pallas_backward
    from qsa_testing import cases as C

    gpu = jax.default_backend() == "gpu"
    rows_list = [int(r) for r in (a.rows or ("64,1024,2048" if gpu else "4,16")).split(",")]
    variants = [(v, _variant(v)) for v in a.variants.split(",") if v]
    results, lines = [], [
        "| geometry | rows | programs | step | busy µs | wall µs | x forward (busy) | vs backward | "
        "temp MB | peak MB | top kernels (mean µs) |", "|" + "---|" * 11]
    for tp in a.tp.split(","):
        geo = inputs.geometry(tp, cpu=not gpu, pool_gb=a.pool_gb)
        _, kv = inputs.make_pool(geo, gpu=False, seed=3)
        for rows, requests in [(r, int(n)) for r in rows_list for n in a.requests.split(",")]:
            inp = inputs.sparse_inputs(geo, rows, 1, seed=rows, num_requests=requests or None)
            label = tp if not requests else f"{tp} {requests} req"
            li = inp.idx[0]
            base = (inp.q, kv, li, inp.block_table, inp.token_to_req, inp.gate)
            problem, _ = _plan(*base, use_prefill_config=False, config=None, implementation="pallas")
            ct = jnp.asarray(C.bf16_random(__import__("numpy").random.default_rng(rows), inp.q.shape))

            def grad_of(impl):
                def loss(q, kv, g):
                    out = qsa_jax.sparse_attention(q, kv, li, inp.block_table, inp.token_to_req, g,
                                                   implementation=impl)
                    return jnp.vdot(out.astype(jnp.float32), ct.astype(jnp.float32))
                return jax.grad(loss, argnums=(0, 1, 2))

            def autodiff_loss(q, kv, g):
                out = xla_impl.run(problem, q, (kv,), li, inp.block_table, inp.token_to_req, g)
                return jnp.vdot(out.astype(jnp.float32), ct.astype(jnp.float32))

            residuals = jax.jit(lambda *x: B.forward_with_residuals(problem, "pallas", *x))(
                inp.q, (kv,), li, inp.block_table, inp.token_to_req, inp.gate)

            def backward(name, **kw):
                def step(q, kv, g, att, lse, c):
                    return pallas_backward(problem, q, (kv,), li, inp.block_table, inp.token_to_req,
                                           g, att, lse, c, **kw)
                return name, step, (inp.q, kv, inp.gate, residuals[1], residuals[2], ct)
            steps = [("forward", lambda q, kv, g: qsa_jax.sparse_attention(
                        q, kv, li, inp.block_table, inp.token_to_req, g, implementation="pallas"),
                      (inp.q, kv, inp.gate)),
                     backward("backward")]
            if a.acq_rel:
                steps.append(backward("backward acq_rel atomics", relaxed_atomics=False, order="selection"))
            steps += [backward(f"backward {label}", **v) for label, v in variants]
            steps.append(("grad pallas", grad_of("pallas"), (inp.q, kv, inp.gate)))
            steps += [(f"grad pallas {order}", grad_of("pallas"), (inp.q, kv, inp.gate))
                      for order in a.grad_orders.split(",") if order]
            if a.xla:
                steps.append(("grad xla", grad_of("xla"), (inp.q, kv, inp.gate)))
            if a.autodiff:
                steps.append(("grad xla autodiff", jax.grad(autodiff_loss, argnums=(0, 1, 2)),
                              (inp.q, kv, inp.gate)))
            measured, reference = {}, None
            for name, fn, args in steps:
                order = name.split()[-1] if name.startswith("grad pallas ") else None
                try:
                    with default_backward_order(order):  # traced (and compiled) inside _measure
                        r, out = _measure(fn, args, a.reps, a.trace)
                    if name == "backward":
                        reference = out
                    elif name.startswith("backward ") and reference is not None:
                        r["vs_backward"] = float(_relative_difference(out, reference))
                    del out
                except Exception as exc:  # noqa: BLE001 -- e.g. out of memory: report and go on
                    r = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                measured[name] = r
                fwd = measured["forward"].get("busy_us") or measured["forward"].get("wall_us")
                own = r.get("busy_us") or r.get("wall_us")
                ratio = f"{own / fwd:.2f}" if own and fwd else ""
                mb = lambda b: "" if b is None else f"{b / 2**20:.0f}"  # noqa: E731
                busy = "" if r.get("busy_us") is None else f"{r['busy_us']:.1f}"
                wall = "" if r.get("wall_us") is None else f"{r['wall_us']:.1f}"
                diff = f"{r['vs_backward']:.1e}" if "vs_backward" in r else ""
                lines.append(f"| {label} | {rows} | {rows * geo.num_kv_heads} | {name} | {busy} | {wall} | "
                             f"{ratio} | {diff} | {mb(r.get('temp_bytes'))} | {mb(r.get('peak_bytes_in_use'))} | "
                             f"{r.get('kernels') or r.get('error', '')} |")
                print(lines[-1], flush=True)
                results.append({"geometry": tp, "rows": rows, "requests": requests or rows, "step": name, **r,
                                "config": list(problem.config)})
                _write(a, gpu, lines, results)  # after every step: a time limit keeps what is done
    print(_write(a, gpu, lines, results))
    return 0


@functools.cache
def _machine(gpu: bool) -> dict:
    from bench import machine

    return machine.describe(gpu)


def _write(a, gpu: bool, lines: list, results: list) -> str:
    card = jax.devices()[0].device_kind
    text = (f"# sparse_attention gradients — {card}\n\n"
            f"{a.reps} runs per step; busy = sum of GPU kernel durations per call (profiler trace); "
            f"'x forward' = busy (else wall) time over the Pallas forward's; temp = XLA temporary "
            f"buffers of the compiled step; peak = device peak_bytes_in_use so far.\n\n"
            + "\n".join(lines) + "\n")
    if a.out:
        out = pathlib.Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "backward.md").write_text(text)
        (out / "backward.json").write_text(json.dumps(
            {"machine": _machine(gpu), "results": results}, indent=1, default=str))
    return text


if __name__ == "__main__":
    sys.exit(main())
