"""Single-launch decode (``PallasLaunch(merge="fused")``) against the split + merge kernels.

    python -m bench.fused_decode [--out DIR] [--cases TP1:1,...,TP4:1@16] [--n-sets 10] [--runs 3] [--rounds 3]

For the decode cases (TP1 1/2/4/8 rows, TP4 1/4/16 rows: <= 16 programs) at the default
tiling (on an H200 the measured table), in one process on the same fresh selections:

* GPU busy time per call (sum of kernel durations from one CUPTI trace, ``bench.kernel_trace``)
  of the Pallas forward with the separate merge and with the fused merge, beside vLLM 0.30.0
  and 0.34.0 (sm90 table) -- each case's four jobs run in turn, ``--rounds`` times over, and
  the median round is reported; the per-call time of every kernel (and memset) by name shows
  what each launch costs, the counters' zeroing included;
* bits: the fused merge against the separate one over every selection set (identical
  elements, fidelity contract), whether repeated fused runs give the same bits (a race
  between the arrival and the partials would not), and each job's error from exact
  float64 attention on set 0.

A case ``TP:rows@S`` runs the table's block_n and warps with S splits instead (``config=``),
``TP:rows@S/B`` also merges B columns per step (``merge_block_d``, both merges):
where the serial merge of the last arrival (G x S x D partials) might pay off.

Writes ``fused_decode.json`` and ``fused_decode.md`` to --out. Without a GPU it runs the
reduced CPU geometry in interpret mode (bits only, no originals, no trace): a smoke test.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import os
import statistics
import sys
import time

import numpy as np

CASES = "TP1:1,TP1:2,TP1:4,TP1:8,TP4:1,TP4:4,TP4:16"
MODES = ("separate", "fused")
ORIGINALS = ("0.30.0", "0.34.0")


def build_chain(merge: str, config, stages: int, block_d: int | None):
    import jax

    import qsa_jax
    from bench.timing import sequential_calls

    launch = qsa_jax.PallasLaunch(merge=merge, num_stages=stages, merge_block_d=block_d)

    def chain(q, kv, idx_sets, bt, t2r, gate):
        return sequential_calls(lambda i: qsa_jax.sparse_attention(
            q, kv, i, bt, t2r, gate, implementation="pallas", config=config, launch=launch), idx_sets)
    return jax.jit(chain)


def tiling(args, splits=None):
    """(config= to pass, config, launch, G) for ``args``: the table's tiling (config= None),
    or with ``splits`` its block_n and launch with that split count (an explicit config=
    that keeps the table's warps and stages)."""
    import dataclasses

    from qsa_jax.config import pallas_launch
    from qsa_jax.ops.sparse_attention import base

    q, kv, idx_sets, bt, t2r, gate = args
    problem = base.check_sparse_attention_args(q, kv, idx_sets[0], bt, t2r, gate, use_prefill_config=False,
                                               config=None)
    launch = pallas_launch(problem)
    if splits is None:
        return None, problem.config, launch, problem.group_size
    cfg = problem.config._replace(num_warps=launch.num_warps, num_splits=min(splits, problem.config.num_tiles))
    problem = dataclasses.replace(problem, config=cfg, config_explicit=True, num_stages=None)
    return tuple(cfg), cfg, dataclasses.replace(pallas_launch(problem), num_stages=launch.num_stages), \
        problem.group_size


def by_name_per_call(kernels, calls: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for k in kernels:
        out[k.name] = out.get(k.name, 0.0) + k.duration_ns / calls / 1e3
    return out


def short(name: str) -> str:
    for key, label in (("qsa_sparse_attention", "attention"), ("qsa_merge_splits", "merge"),
                       ("_qsa_sparse_paged_attention", "orig split"), ("merge", "orig merge")):
        if key in name:
            return label
    return name[:28]


def _run_original(mod, tq, k_t, v_t, tidx, tbt, tt2r, tgate, out_t):
    """One timed unit of an original: its calls on every selection set, into ``out_t``."""
    for idx in tidx:
        mod.qsa_sparse_paged_attention(tq, k_t, v_t, idx, tbt, tt2r, False, out_t, output_gate=tgate)
    return out_t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--n-sets", type=int, default=10, help="fresh selection sets per chain (calls per chain)")
    ap.add_argument("--runs", type=int, default=3, help="chains per job per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of all jobs in the trace (median reported)")
    ap.add_argument("--repeats", type=int, default=5, help="extra fused chains compared bit for bit (races)")
    ap.add_argument("--pool-gb", type=float, default=2.0)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()

    import jax

    from bench import inputs
    from bench.hopper_sweep import exact_attention_torch, rel_err, traced_job_bursts
    from qsa_testing.agreement import fidelity

    gpu = jax.default_backend() == "gpu"
    mods = {}
    if gpu:
        import torch

        from qsa_testing import originals

        mods = {v: originals.load(v) for v in ORIGINALS}
    pools = {}
    cases = []
    for spec in a.cases.split(","):
        tp, rows = spec.split(":")
        rows, _, splits = rows.partition("@")
        splits, _, block_d = splits.partition("/")
        if tp not in pools:
            geo = inputs.geometry(tp, cpu=not gpu, pool_gb=a.pool_gb)
            pools[tp] = (geo,) + inputs.make_pool(geo, gpu=gpu, seed=21 + len(pools))
        geo, kv_t, kv = pools[tp]
        inp = inputs.sparse_inputs(geo, int(rows), a.n_sets, seed=1000 + 17 * int(rows) + len(cases))
        args = (inp.q, kv, tuple(inp.idx), inp.block_table, inp.token_to_req, inp.gate)
        explicit, cfg, launch, group = tiling(args, int(splits) if splits else None)
        block_d = int(block_d) if block_d else None
        cases.append(dict(tp=tp, rows=int(rows), geo=geo, kv_t=kv_t, inp=inp, args=args, config=tuple(cfg),
                          explicit=explicit, warps=launch.num_warps, stages=launch.num_stages,
                          merge_block_d=block_d or launch.merge_block_d, block_d=block_d, group=group))

    # Compile every chain (lowering is Python; XLA's and Triton's compilers release the GIL).
    lowered = [(c, m, build_chain(m, c["explicit"], c["stages"], c["block_d"]).lower(*c["args"]))
               for c in cases for m in MODES]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        compiled = list(pool.map(lambda x: x[2].compile(), lowered))
    fns = {(id(c), m): f for (c, m, _), f in zip(lowered, compiled)}
    print(f"compiled {len(compiled)} chains in {time.perf_counter() - t0:.0f} s", flush=True)

    results = {"card": jax.devices()[0].device_kind, "date": time.strftime("%Y-%m-%d"),
               "git_commit": os.environ.get("QSA_GIT_COMMIT", ""), "n_sets": a.n_sets, "runs": a.runs,
               "rounds": a.rounds, "cases": []}
    jobs = []  # (case, label, run callable)
    for c in cases:
        outs = {m: [np.asarray(x) for x in jax.block_until_ready(fns[(id(c), m)](*c["args"]))] for m in MODES}
        sep, fus = np.stack(outs["separate"]), np.stack(outs["fused"])
        stable = True
        for _ in range(a.repeats):
            again = np.stack([np.asarray(x) for x in fns[(id(c), "fused")](*c["args"])])
            stable &= bool(np.array_equal(again.view(np.uint16), fus.view(np.uint16)))
        fid = fidelity(fus.astype(np.float32), sep.astype(np.float32), what=f"{c['tp']} rows {c['rows']}")
        rec = {k: c[k] for k in ("tp", "rows", "config", "warps", "stages", "merge_block_d", "group")}
        rec["table_tiling"] = c["explicit"] is None
        s = c["config"][3]
        rec.update(
            # What the last arrival of a (row, KV head) reads in the fused merge: G heads x
            # S splits x D fp32 partials (+ the LSEs), where the merge kernel spreads the same
            # bytes over rows x H x D / block_d programs.
            merge_bytes_per_last_program=c["group"] * s * c["geo"].head_dim * 4 + c["group"] * s * 4,
            merge_kernel_programs=c["rows"] * c["geo"].num_query_heads * (c["geo"].head_dim // c["merge_block_d"]),
            bits_identical=bool(np.array_equal(fus.view(np.uint16), sep.view(np.uint16))),
            elements_differing=int((fus.view(np.uint16) != sep.view(np.uint16)).sum()), elements=int(fus.size),
            fused_stable_over_repeats=stable,
            fidelity={k: fid[k] for k in ("rel_err", "ulp_fraction", "max_ulps", "nan", "nonzero_where_zero", "ok")},
            busy_us={}, kernels_us={}, err_exact={})
        results["cases"].append(rec)
        c["rec"] = rec
        case_jobs = [(c, mode, lambda f=fns[(id(c), mode)], c=c: f(*c["args"]), jax.block_until_ready)
                     for mode in MODES]
        if gpu:
            t = torch.from_dlpack
            tq, tgate, tbt, tt2r = (t(x) for x in (c["inp"].q, c["inp"].gate, c["inp"].block_table,
                                                   c["inp"].token_to_req))
            tidx = [t(x) for x in c["inp"].idx]
            d = c["geo"].head_dim
            k_t, v_t = c["kv_t"].transpose(1, 2).split(d, -1)
            m = min(c["rows"], 32)
            exact = exact_attention_torch(tq, c["kv_t"], tidx[0], tbt, tt2r, tgate, m)
            for mode in MODES:
                rec["err_exact"][mode] = rel_err(t(jax.device_put(outs[mode][0]))[:m].float(), exact)
            for ver in ORIGINALS:
                out_t = torch.empty_like(tq)
                # Bound now: the trace runs every case's jobs after this loop has moved on,
                # so a closure over the loop's variables would see the last case's tensors
                # (the 2026-12-03 H200 run failed so: "output must match its query").
                run = functools.partial(_run_original, mods[ver], tq, k_t, v_t, tuple(tidx), tbt, tt2r, tgate,
                                        out_t)
                run()
                torch.cuda.synchronize()
                # set 0's output for the error: run the first set alone
                mods[ver].qsa_sparse_paged_attention(tq, k_t, v_t, tidx[0], tbt, tt2r, False, out_t,
                                                     output_gate=tgate)
                torch.cuda.synchronize()
                rec["err_exact"][ver] = rel_err(out_t[:m], exact)
                rec.setdefault("original_config", {})[ver] = list(mods[ver]._select_config(
                    c["rows"], c["geo"].num_kv_heads, False, c["geo"].selection_width))
                case_jobs.append((c, ver, run, lambda _: torch.cuda.synchronize()))
        jobs += case_jobs  # per case: separate, fused, 0.30.0, 0.34.0
        print(f"{c['tp']} rows {c['rows']}: config {c['config']}, fused vs separate: "
              f"{'bit-identical' if rec['bits_identical'] else str(rec['elements_differing']) + ' elements differ'}"
              f", rel {fid['rel_err']:.2e}, stable {stable}", flush=True)

    if gpu:
        bursts = traced_job_bursts([(run, wait) for _, _, run, wait in jobs], a.runs, a.rounds)
        calls = a.runs * a.n_sets
        if bursts is None:
            print(f"trace: the kernels did not split into {a.rounds * len(jobs)} bursts", flush=True)
        else:
            for j, (c, label, _, _) in enumerate(jobs):
                mine = [bursts[r * len(jobs) + j] for r in range(a.rounds)]
                busy = [sum(k.duration_ns for k in b) / calls / 1e3 for b in mine]
                c["rec"]["busy_us"][label] = statistics.median(busy)
                c["rec"]["busy_us_rounds"] = c["rec"].get("busy_us_rounds", {})
                c["rec"]["busy_us_rounds"][label] = busy
                mid = mine[busy.index(statistics.median(busy))] if a.rounds % 2 else mine[0]
                c["rec"]["kernels_us"][label] = by_name_per_call(mid, calls)
    results["seconds"] = time.perf_counter() - t0
    text = markdown(results)
    print(text)
    out = a.out or os.path.join("bench", "results", "fused_decode_" + time.strftime("%Y-%m-%d"))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "fused_decode.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out, "fused_decode.md"), "w") as f:
        f.write(text)
    return 0 if all(r["fidelity"]["ok"] and r["fused_stable_over_repeats"] for r in results["cases"]) else 1


def markdown(results) -> str:
    lines = [f"# Single-launch decode (fused merge) — {results['card']}, {results['date']}", "",
             f"GPU busy time per call (µs; sum of kernel durations, CUPTI trace; {results['n_sets']} fresh "
             f"selection sets x {results['runs']} chains, median of {results['rounds']} rounds). "
             "faster orig = the faster of vLLM 0.30.0 and 0.34.0 (sm90 table).", "",
             "| TP | rows | config (bn, w, tiles, S) | G | last merger reads KB | separate | fused | fused − sep | "
             "0.30.0 | 0.34.0 | fused / faster orig | sep / faster orig | bits | fidelity rel / >1ulp | stable |",
             "|" + "---|" * 15]
    f = lambda x, p="{:.2f}": "" if x is None else p.format(x)  # noqa: E731
    for r in results["cases"]:
        b = r["busy_us"]
        sep, fus = b.get("separate"), b.get("fused")
        origs = [b[v] for v in ORIGINALS if b.get(v)]
        best = min(origs) if origs else None
        fid = r["fidelity"]
        bits = "identical" if r["bits_identical"] else f"{r['elements_differing']}/{r['elements']} differ"
        ratio = lambda x: f(x / best if x and best else None, "{:.2f}x")  # noqa: E731
        config = f"{tuple(r['config'])}{'' if r['table_tiling'] else ' (S set)'}, merge bd {r['merge_block_d']}"
        lines.append(
            f"| {r['tp']} | {r['rows']} | {config} | {r['group']} | "
            f"{r['merge_bytes_per_last_program'] / 1024:.0f} | {f(sep)} | {f(fus)} | "
            f"{f(fus - sep if fus and sep else None, '{:+.2f}')} | {f(b.get('0.30.0'))} | {f(b.get('0.34.0'))} | "
            f"{ratio(fus)} | {ratio(sep)} | "
            f"{bits} | {fid['rel_err']:.1e} / {fid['ulp_fraction']:.2%} | {r['fused_stable_over_repeats']} |")
    lines += ["", "Per-call time by kernel (µs), the median round:", "",
              "| TP | rows | job | kernels |", "|---|---|---|---|"]
    for r in results["cases"]:
        for label, ks in r["kernels_us"].items():
            parts = ", ".join(f"{short(n)} {us:.2f}" for n, us in sorted(ks.items(), key=lambda kv: -kv[1]))
            lines.append(f"| {r['tp']} | {r['rows']} | {label} | {parts} |")
    lines += ["", "Error from exact float64 attention (set 0, first ≤ 32 rows):", "",
              "| TP | rows | " + " | ".join(MODES + ORIGINALS) + " |", "|" + "---|" * (2 + len(MODES + ORIGINALS))]
    for r in results["cases"]:
        e = r["err_exact"]
        lines.append(f"| {r['tp']} | {r['rows']} | " + " | ".join(f(e.get(k), "{:.3e}") for k in MODES + ORIGINALS)
                     + " |")
    lines.append(f"\n{results.get('seconds', 0):.0f} s in all.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
