"""The sharded operators on every device of this machine, against one device.

    python tools/multi_gpu.py [--rows 1,64,1024,4096] [--out DIR] [--small]

For each head split h in (2, 4) that divides the device count n: the TP1 model
(24 query heads, 2 KV heads, D = 256, W = 2051, pages of 1600) on a mesh of
(n / h rows) x (h heads) — each device then runs the TP2 (h = 2) or TP4
(h = 4, KV heads repeated) shapes — checked bit for bit against one device's
call with the shard's tiling, its compiled program searched for collectives,
and timed: per-device busy time from a profiler trace (GPU only) beside the
one-device call on one shard's arrays (the same per-shard program), and the
whole mesh's wall clock; the same for ``jax.vjp`` of the call (device 0's results
against the vjp of its shard alone; with rows split the cache cotangent's all-reduce
is the one expected collective). Then the indexer operators with rows (compress) or
pages (store) over all n devices. One device gives the degenerate 1 x 1 mesh.

``--small`` (reduced sizes) is what runs on CPU, e.g. with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (tests/test_tools.py).
Writes ``multi_gpu.json`` and ``multi_gpu.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import qsa_jax  # noqa: E402
from bench.kernel_trace import gpu_kernels_by_device  # noqa: E402
from qsa_jax.arg_specs import TP1  # noqa: E402
from qsa_jax.config import select_config  # noqa: E402
from qsa_jax.ops.sparse_attention import backward_pallas as bp  # noqa: E402
from qsa_jax.ops.sparse_attention.base import check_sparse_attention_args  # noqa: E402
from qsa_testing.cases import compress_case, sparse_attention_case, store_case  # noqa: E402
from qsa_testing.sharding_checks import bits, collectives_in, make_mesh, put, shard_vjp, vjp_call  # noqa: E402

CALLS = 10  # calls per timed execution


def attention_inputs(rows: int, small: bool):
    rng = np.random.default_rng(rows)
    if small:
        return sparse_attention_case(rng, rows=rows, num_query_heads=8, num_kv_heads=2, head_dim=16,
                                     page_size=16, selection_blocks=12, context_tokens=120,
                                     num_requests=min(rows, 4))
    return sparse_attention_case(rng, rows=rows, num_query_heads=TP1.num_query_heads,
                                 num_kv_heads=TP1.num_kv_heads, head_dim=TP1.head_dim,
                                 page_size=TP1.page_size, selection_blocks=512, context_tokens=8192,
                                 num_requests=min(rows, 8))


def timed(fn, args):
    """(wall µs per call, per-device busy µs per call or None) of ``fn(*args)`` called CALLS times."""
    def once():
        out = None
        for _ in range(CALLS):
            out = fn(*args)
        return out

    jax.block_until_ready(once())
    walls = []
    for _ in range(5):
        t = time.perf_counter()
        jax.block_until_ready(once())
        walls.append((time.perf_counter() - t) / CALLS * 1e6)
    if jax.default_backend() != "gpu":
        return statistics.median(walls), None
    kernels = gpu_kernels_by_device(lambda: jax.block_until_ready(once()))
    # GPUs the call did not use have no kernels in the trace.
    busy = [sum(k.duration_ns for k in ks) / CALLS / 1e3 for _, ks in sorted(kernels.items()) if ks]
    return statistics.median(walls), busy or None


def relative_error(got, want) -> float:
    got, want = (np.asarray(x, np.float64) for x in (got, want))
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def mesh_args(mesh, case, heads):
    """(the cache with KV heads repeated up to ``heads`` shards, the call's arrays on ``mesh``:
    rows over "data", heads over "model")."""
    kv = jnp.asarray(case.kv_cache)
    if heads > case.num_kv_heads:
        kv = qsa_jax.repeat_kv_heads(kv, heads // case.num_kv_heads)
    return kv, (put(mesh, case.q, "data", "model"), put(mesh, kv, None, "model"),
                put(mesh, case.logical_indices, "data"), put(mesh, case.block_table),
                put(mesh, case.token_to_req, "data"), put(mesh, case.output_gate, "data", "model"))


def attention_grad_row(n, heads, rows, small, implementation):
    """jax.vjp of the sharded call: device 0's output, dq and dgate (and its cache cotangent when
    rows are whole) against the same vjp on device 0's shard alone; with rows split its cache
    cotangent against the row shards' fp32 ones summed and rounded once, and the all-reduce
    that sums them the one collective expected; timed like the forward."""
    data = n // heads
    row = {"op": "sparse_attention vjp", "mesh": f"{data}x{heads}", "rows": rows}
    if rows % data:
        return {**row, "skipped": f"{rows} rows do not split over {data} row shards"}
    mesh = make_mesh((data, heads), ("data", "model"))
    case = attention_inputs(rows, small)
    kv, args = mesh_args(mesh, case, heads)
    d_out = np.random.default_rng(rows + 1).standard_normal(case.q.shape).astype(case.q.dtype)
    args += (put(mesh, d_out, "data", "model"),)
    fn = jax.jit(vjp_call(implementation))
    got = fn(*args)
    def on(device):  # that device's shard of every argument
        return jax.tree.map(lambda a: next(s.data for s in a.addressable_shards if s.device == device), args)

    shard = on(mesh.devices[0, 0])
    one = fn(*shard)
    checked = (0, 1, 3) if data > 1 else (0, 1, 2, 3)  # out, dq, dkv, dgate
    # Where the Pallas dq walk splits a row's columns, the splits add into dq atomically: its
    # bits depend on the run (README "Gradients"), so dq is held to 1e-3 there instead.
    problem = check_sparse_attention_args(*shard[:6], use_prefill_config=False, config=None)
    dq_splits = bp.default_splits(problem, bp.DEFAULT_BLOCK_N) if implementation != "xla" else 1
    extra = {"dq_splits": dq_splits}

    def agrees(i, g, o):
        if i == 1 and dq_splits > 1:
            extra["dq_rel_diff"] = relative_error(g, o)
            return extra["dq_rel_diff"] <= 1e-3
        return np.array_equal(bits(g), bits(o))

    same = all(agrees(i, g.addressable_shards[0].data, o)
               for i in checked for g, o in zip(jax.tree.leaves(got[i]), jax.tree.leaves(one[i])))
    if data > 1:
        # The all-reduced cache cotangent: the row shards' unrounded (fp32) ones, summed, rounded
        # once. Bit for bit at 2 row shards; with more, the reduction's order is NCCL's.
        config = select_config(rows // data, max(1, case.num_kv_heads // heads), False, case.selection_width)
        parts = [np.asarray(shard_vjp(implementation, config, *on(mesh.devices[i, 0]))[2]) for i in range(data)]
        want = np.asarray(jnp.asarray(sum(parts), jnp.bfloat16))
        mine = got[2].addressable_shards[0].data
        extra["dkv_rel_diff"] = relative_error(mine, want)
        same = same and (np.array_equal(bits(mine), bits(want)) if data == 2 else extra["dkv_rel_diff"] <= 1e-3)
    wall, busy = timed(fn, args)
    one_wall, one_busy = timed(fn, shard)
    return {**row, "per_device": f"rows {rows // data}, heads {case.q.shape[1] // heads}, "
                                 f"kv heads {kv.shape[1] // heads}",
            "bit_identical": bool(same), "collectives": collectives_in(fn, *args),
            "expected_collectives": ["all-reduce"] if data > 1 else [],
            "mesh_wall_us": wall, "busy_us_per_device": busy,
            "one_device_wall_us": one_wall, "one_device_busy_us": one_busy[0] if one_busy else None, **extra}


def attention_row(n, heads, rows, small, implementation):
    data = n // heads
    if rows % data:
        return {"op": "sparse_attention", "mesh": f"{data}x{heads}", "rows": rows,
                "skipped": f"{rows} rows do not split over {data} row shards"}
    mesh = make_mesh((data, heads), ("data", "model"))
    case = attention_inputs(rows, small)
    local_rows, local_kv = rows // data, max(1, case.num_kv_heads // heads)
    config = select_config(local_rows, local_kv, False, case.selection_width)
    want = qsa_jax.sparse_attention(case.q, jnp.asarray(case.kv_cache), case.logical_indices, case.block_table,
                                    case.token_to_req, case.output_gate, config=config,
                                    implementation=implementation)
    # The one-device call with its own tiling (keyed on the whole rows x KV heads):
    # a different tiling differs within the accuracy bar, not bit for bit.
    default = qsa_jax.sparse_attention(case.q, jnp.asarray(case.kv_cache), case.logical_indices,
                                       case.block_table, case.token_to_req, case.output_gate,
                                       implementation=implementation)
    kv, args = mesh_args(mesh, case, heads)
    fn = jax.jit(lambda *a: qsa_jax.sparse_attention(*a, implementation=implementation))
    got = fn(*args)
    # One shard's arrays on one device: the per-shard program alone.
    shard = [a.addressable_shards[0].data for a in args]
    wall, busy = timed(fn, args)
    one_wall, one_busy = timed(fn, shard)
    return {
        "op": "sparse_attention", "mesh": f"{data}x{heads}", "rows": rows,
        "per_device": f"rows {local_rows}, heads {case.q.shape[1] // heads}, kv heads {kv.shape[1] // heads}",
        "config": list(config), "bit_identical": bool(np.array_equal(bits(got), bits(want))),
        "one_device_tiling": list(select_config(rows, case.num_kv_heads, False, case.selection_width)),
        "rel_err_vs_one_device_tiling": relative_error(got, default),
        "collectives": collectives_in(fn, *args),
        "mesh_wall_us": wall, "busy_us_per_device": busy,
        "one_device_wall_us": one_wall, "one_device_busy_us": one_busy[0] if one_busy else None,
    }


def indexer_rows(n, small, implementation):
    mesh = make_mesh((n,), ("data",))
    out = []
    case = compress_case(np.random.default_rng(1), chunk_lens=[5, 7, 3, 9] * (1 if small else 64), edge=True)
    a = case.arrays()
    order = ("raw_keys", "raw_positions", "compressor_state_cache", "compressor_state_block_table",
             "token_to_req", "query_start_loc", "logical_positions", "compressed_slots")
    per_row = {"token_to_req", "logical_positions", "compressed_slots"}
    rows = len(a["token_to_req"])
    if rows % n == 0:
        want = qsa_jax.compress_groups_with_ratio(*(a[k] for k in order), case.compress_ratio, a["rope_cache"],
                                                  implementation=implementation)
        args = [put(mesh, a[k], "data" if k in per_row else None) for k in order] + [put(mesh, a["rope_cache"])]
        fn = jax.jit(lambda *x: qsa_jax.compress_groups_with_ratio(*x[:8], case.compress_ratio, x[8],
                                                                   implementation=implementation))
        got = fn(*args)
        wall, busy = timed(fn, args)
        out.append({"op": "compress_groups_with_ratio", "mesh": f"rows over {n}", "rows": rows,
                    "bit_identical": all(np.array_equal(bits(g), bits(w)) for g, w in zip(got, want)),
                    "collectives": collectives_in(fn, *args), "mesh_wall_us": wall,
                    "busy_us_per_device": busy})
    pages = 16 * max(n, 4)  # 1024+ slots: 512 distinct ones (a duplicate's last writer is run-dependent)
    sc = store_case(np.random.default_rng(2), n=64 if small else 512, pages=pages, page_size=16)
    want = qsa_jax.store_cache_rows(sc.cache, sc.slot_mapping, sc.rows, implementation=implementation)
    args = (put(mesh, sc.cache, "data"), put(mesh, sc.slot_mapping), put(mesh, sc.rows))
    fn = jax.jit(lambda *x: qsa_jax.store_cache_rows(*x, implementation=implementation))
    got = fn(*args)
    wall, busy = timed(fn, args)
    out.append({"op": "store_cache_rows", "mesh": f"pages over {n}", "rows": len(sc.slot_mapping),
                "bit_identical": bool(np.array_equal(bits(got), bits(want))),
                "collectives": collectives_in(fn, *args), "mesh_wall_us": wall, "busy_us_per_device": busy})
    return out


def markdown(report) -> str:
    lines = [f"# Sharded operators on {report['devices']} x {report['device_kind']}", "",
             f"implementation `{report['implementation']}`; {CALLS} calls per timed execution; busy time from "
             "a profiler trace (GPU only); one-device columns: one shard's arrays on one device; bit-identical: against the one-device call "
             "on the whole arrays with the shard's tiling (vjp rows: device 0's results against the vjp of its "
             "shard alone); the last column: against it with its own tiling.", "",
             "| op | mesh | rows | per device | bit-identical | collectives | mesh wall µs/call | busy µs/call per device | one-device wall | one-device busy | rel. err vs whole-array tiling |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        if "skipped" in r:
            lines.append(f"| {r['op']} | {r['mesh']} | {r['rows']} | skipped: {r['skipped']} ||||||||")
            continue
        busy = r.get("busy_us_per_device")
        lines.append("| {} | {} | {} | {} | {} | {} | {:.1f} | {} | {} | {} | {} |".format(
            r["op"], r["mesh"], r["rows"], r.get("per_device", ""), r["bit_identical"],
            ", ".join(r["collectives"]) or "none", r["mesh_wall_us"],
            " / ".join(f"{b:.1f}" for b in busy) if busy else "-",
            f"{r['one_device_wall_us']:.1f}" if "one_device_wall_us" in r else "-",
            f"{r['one_device_busy_us']:.1f}" if r.get("one_device_busy_us") else "-",
            f"{r['rel_err_vs_one_device_tiling']:.1e}" if "rel_err_vs_one_device_tiling" in r else "-"))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,64,1024,4096")
    ap.add_argument("--small", action="store_true", help="reduced sizes (CPU)")
    ap.add_argument("--implementation", default=None)
    ap.add_argument("--out", default="bench/results/multi_gpu")
    ap.add_argument("--no-grad", dest="grad", action="store_false",
                    help="skip the gradient (jax.vjp) rows of sparse_attention")
    args = ap.parse_args(argv)
    n = jax.device_count()
    results = []
    splits = [h for h in (2, 4) if n % h == 0] or [1]
    for heads in splits:
        for rows in (int(r) for r in args.rows.split(",")):
            results.append(attention_row(n, heads, rows, args.small, args.implementation))
            print(json.dumps(results[-1]), flush=True)
            if args.grad:
                results.append(attention_grad_row(n, heads, rows, args.small, args.implementation))
                print(json.dumps(results[-1]), flush=True)
    results += indexer_rows(n, args.small, args.implementation)
    report = {"devices": n, "device_kind": jax.devices()[0].device_kind,
              "implementation": args.implementation or "default", "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "multi_gpu.json").write_text(json.dumps(report, indent=1))
    (out / "multi_gpu.md").write_text(markdown(report))
    print(markdown(report))
    bad = [r for r in results if "skipped" not in r
           and (not r["bit_identical"] or r["collectives"] != r.get("expected_collectives", []))]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
