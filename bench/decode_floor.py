"""Where the Pallas decode time goes: wall clock against the GPU's own kernel times.

    python -m bench.decode_floor [--tp TP1,TP4] [--rows 1,4,16] [--n-calls 20]

The first table times the Pallas call like ``bench.run`` times the JAX
implementations (one jitted function of N calls in sequence, dispatched back to
back; µs per call) and the originals as a CUDA graph of N calls, in the same
process on the same inputs. Beside the wall clock it gives what a profiler
trace (``bench.kernel_trace``, CUPTI) says the GPU did: the busy time per call
(sum of kernel durations, no launch gaps), each kernel's mean duration and the
median gap between consecutive kernels -- for the Pallas chain and for the
originals' graph replays. The floors are Pallas kernels of one program that
copy one element, timed like the chain: XLA's cost per launch inside one
executable, which the originals' graph does not pay.
Prints a markdown table and writes it to ``--out`` (default: stdout only).

A second table times variants of the Pallas call with the same numerics or
nearly: ``prefetch`` (next tile's index/block-table loads issued during the
current tile's K/V gather; bit-identical), ``65 splits`` (when the table deals 65
tiles to 64 splits, one tile per split -- only the last tile's <= 3 columns move,
notes/triton.md), both, and q read in place from a qkv array (``StridedQuery``).
Each variant's relative error against the default Pallas output is printed.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp


# Runs of the N-call chain (or the originals' graph) under the profiler per case.
TRACE_REPS = 5


def _tiny_kernel(x_ref, o_ref):
    o_ref[0] = x_ref[0] + 1.0


def _tiny(x):
    from jax.experimental import pallas as pl

    return pl.pallas_call(_tiny_kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.float32), grid=(1,),
                          in_specs=[pl.no_block_spec], out_specs=pl.no_block_spec,
                          interpret=jax.default_backend() != "gpu")(x)


def _variants(tp, rows, geo, problem, inp, kv, t_orig, t_pallas, device_us) -> str:
    """One row of the variants table (see the module docstring)."""
    import dataclasses

    import numpy as np

    import qsa_jax
    from bench.timing import sequential_calls
    from qsa_jax.ops.sparse_attention import pallas as P
    from qsa_testing.agreement import rel_frobenius as relative_error

    cfg = problem.config
    one_tile_each = cfg.num_tiles == cfg.num_splits + 1
    p65 = dataclasses.replace(problem, config=cfg._replace(num_splits=cfg.num_tiles)) if one_tile_each else None
    common = (inp.q, kv, inp.block_table, inp.token_to_req, inp.gate, tuple(inp.idx))

    def chain(p, prefetch):
        p = dataclasses.replace(p, launch=qsa_jax.PallasLaunch(prefetch=prefetch))

        def fn(q, kv, bt, t2r, gate, idx_sets):
            return sequential_calls(lambda i: P.run(p, q, (kv,), i, bt, t2r, gate), idx_sets)
        return fn

    heads, d = geo.num_query_heads, geo.head_dim
    qkv = jnp.concatenate([inp.q.reshape(rows, heads * d),
                           jnp.full((rows, 2 * geo.num_kv_heads * d), jnp.nan, jnp.bfloat16)], axis=1)
    strided = qsa_jax.StridedQuery.from_columns(qkv, start=0, num_heads=heads, head_dim=d)

    def strided_chain(qv, kv, bt, t2r, gate, idx_sets):
        return sequential_calls(lambda i: qsa_jax.sparse_attention(qv, kv, i, bt, t2r, gate,
                                                                   implementation="pallas"), idx_sets)

    def once(p, prefetch):
        return np.asarray(jax.jit(chain(p, prefetch))(*common[:5], common[5][:1])[0]).astype(np.float32)

    base = once(problem, False)
    times, errs = [], []
    for p, prefetch in ((problem, True), (p65, False), (p65, True)):
        if p is None:
            times.append(None)
            errs.append("")
            continue
        times.append(device_us(chain(p, prefetch), common))
        errs.append(f"{relative_error(once(p, prefetch), base):.1e}")
    times.append(device_us(strided_chain, (strided,) + common[1:]))
    got = np.asarray(jax.jit(strided_chain)(strided, *common[1:5], common[5][:1])[0]).astype(np.float32)
    errs.append(f"{relative_error(got, base):.1e}")
    fmt = lambda v: "" if v is None else f"{v:.1f}"  # noqa: E731
    return (f"| {tp} | {rows} | {fmt(t_orig)} | {fmt(t_pallas)} | "
            + " | ".join(fmt(t) for t in times) + " | " + " / ".join(errs) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", default="TP1,TP4")
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--n-calls", type=int, default=20)
    ap.add_argument("--out")
    ap.add_argument("--no-variants", dest="variants", action="store_false",
                    help="skip the variants table")
    a = ap.parse_args()

    import qsa_jax
    from bench import inputs, kernel_trace, report, timing
    from bench.timing import sequential_calls
    from qsa_jax.ops.sparse_attention.api import _plan

    gpu = jax.default_backend() == "gpu"
    n = a.n_calls
    orig = None
    if gpu:
        try:
            import torch

            from qsa_testing import originals
            from qsa_testing.torch_interop import kv_views

            orig = originals.load()
        except Exception as exc:  # noqa: BLE001
            print(f"originals not timed: {exc}", file=sys.stderr)

    def device_us(fn, args):
        compiled, _ = timing.compile_jitted(jax.jit(fn), args)
        return timing.jax_device_time(compiled, args, n)[0]["device_s"] * 1e6

    lines = ["| where | rows | config (BN, warps, tiles, splits) | original µs (graph) | original busy µs | "
             "original kernels: mean µs | pallas µs (wall) | pallas busy µs | pallas kernels: mean µs | "
             "pallas median gap µs | 1 tiny launch µs | 2 dependent tiny launches µs |",
             "|" + "---|" * 12]
    variant_lines = ["| where | rows | original µs | pallas µs | prefetch µs | 65 splits µs | "
                     "prefetch + 65 splits µs | strided q (qkv) µs | rel. err vs pallas (prefetch / 65 / "
                     "both / strided) |", "|" + "---|" * 9]
    x = jnp.ones((1,), jnp.float32)
    floor1 = device_us(lambda xs: sequential_calls(_tiny, xs), ([x + i for i in range(n)],))
    floor2 = device_us(lambda xs: sequential_calls(lambda v: _tiny(_tiny(v)), xs), ([x + i for i in range(n)],))
    for tp in a.tp.split(","):
        geo = inputs.geometry(tp, cpu=not gpu, pool_gb=1.0)
        kv_t, kv = inputs.make_pool(geo, gpu=gpu and orig is not None, seed=3)
        for rows in [int(r) for r in a.rows.split(",")]:
            inp = inputs.sparse_inputs(geo, rows, n, seed=rows)
            problem, _ = _plan(inp.q, kv, inp.idx[0], inp.block_table, inp.token_to_req, inp.gate,
                               use_prefill_config=False, config=None, implementation="pallas")
            common = (inp.q, kv, inp.block_table, inp.token_to_req, inp.gate)

            def full(q, kv, bt, t2r, gate, idx_sets):
                return sequential_calls(lambda i: qsa_jax.sparse_attention(q, kv, i, bt, t2r, gate,
                                                                 implementation="pallas"), idx_sets)

            t_full = device_us(full, common + (tuple(inp.idx),))
            full_jit = jax.jit(full)
            args = common + (tuple(inp.idx),)
            jax.block_until_ready(full_jit(*args))
            pallas_trace = kernel_trace.trace_runs(lambda: full_jit(*args), runs=TRACE_REPS, calls_per_run=n,
                                                   wait=jax.block_until_ready)
            t_orig, orig_trace = None, None
            if orig is not None:
                k_c, v_c = kv_views(kv_t, geo.head_dim)
                q_t, g_t = torch.from_dlpack(inp.q), torch.from_dlpack(inp.gate)
                bt_t, r_t = torch.from_dlpack(inp.block_table), torch.from_dlpack(inp.token_to_req)
                out = torch.empty_like(q_t)
                calls = [functools.partial(orig.qsa_sparse_paged_attention, q_t, k_c, v_c,
                                           torch.from_dlpack(i), bt_t, r_t, False, out, output_gate=g_t)
                         for i in inp.idx]
                t_orig = timing.torch_graph_time(calls)["device_s"] * 1e6
                graph = timing.torch_graph(calls)
                orig_trace = kernel_trace.trace_runs(graph.replay, runs=TRACE_REPS, calls_per_run=n,
                                                     wait=lambda _: torch.cuda.synchronize())
                del graph
            cfg = problem.config
            fmt = lambda v: "" if v is None else f"{v:.1f}"  # noqa: E731
            busy = lambda t: "" if t is None else f"{t.busy_us_per_call:.1f}"  # noqa: E731
            lines.append(f"| {tp} | {rows} | ({cfg.block_n}, {cfg.num_warps}, {cfg.num_tiles}, "
                         f"{cfg.num_splits}) | {fmt(t_orig)} | {busy(orig_trace)} | "
                         f"{orig_trace.describe() if orig_trace else ''} | {fmt(t_full)} | "
                         f"{busy(pallas_trace)} | {pallas_trace.describe() if pallas_trace else ''} | "
                         f"{fmt(pallas_trace and pallas_trace.median_gap_us)} | {floor1:.1f} | {floor2:.1f} |")
            print(lines[-1], flush=True)
            if a.variants:
                variant_lines.append(_variants(tp, rows, geo, problem, inp, kv, t_orig, t_full, device_us))
                print(variant_lines[-1], flush=True)
        del kv, kv_t
    table = "\n".join(lines)
    card = jax.devices()[0].device_kind
    flags = os.environ.get("XLA_FLAGS") or "(none)"
    text = (f"# Pallas decode time, decomposed — {card}\n\nN = {n} calls per timed unit "
            f"(fresh selection sets); µs per call; busy = sum of the GPU's kernel durations per call "
            f"in a profiler trace of {TRACE_REPS} runs; XLA_FLAGS: {flags}.\n\n{table}\n"
            + ("\n## Variants\n\n" + "\n".join(variant_lines) + "\n" if a.variants else ""))
    report.print_and_write(text, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
