"""Sweep of the Pallas sparse-attention tiling and launch knobs on the GPU, per program bucket.

    python -m bench.hopper_sweep --out DIR [--buckets 1,2,4,...] [--budget-s 480] [--kv-dtype fp8]

For every bucket of programs (rows x KV heads = 1, 2, 4, ..., 8192) it times, in one
process on the same fresh selections, the Pallas kernel under many tilings
(block_n x split count, at 2 warps), then refines the three best with other warp
counts and pipelining depths, next to vLLM 0.30.0's and 0.34.0's originals. Each
config's output is also checked against exact attention (float64, no tiling:
``exact_attention_torch`` below) on the first rows of one selection set, so that a
config is eligible only if it meets the accuracy bar: its error from exact is at
most 1.10x the 0.30.0 original's on the same rows.

With ``--kv-dtype fp8`` the cache is float8_e4m3fn (passed to Pallas as its uint8
bytes) with k/v scales 0.5 and 2.0; the comparator and the accuracy reference is then
vLLM 0.34.0 alone (0.30.0 has no fp8 path), and exact attention is computed from the
dequantised fp8 values times the scales.

Each bucket is measured on the TP1 geometry (rows = programs / 2) and the TP4
geometry (rows = programs): G = 12 and 6 query heads per program. TP2 does the
same work per program as TP1 (G = 12, page 1600) and is left to the grid. The
winner of a bucket is the eligible config with the smallest worst-case ratio to
the fastest config of each geometry.

Busy time = sum of the GPU's kernel durations per call from one profiler trace per
stage (``bench.kernel_trace``); the configs run one after the other in that trace,
separated by idle gaps, and the kernels are attributed to configs by those gaps.
Writes ``sweep.json`` (every measurement) and ``sweep.md`` (the winners) to --out,
incrementally, so a run cut short by its budget keeps what it finished.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np

BLOCK_NS = (16, 32, 64, 128)
ALL_TILES = 0  # marker: one tile per split
GAP_S = 0.05  # idle time between configs in a trace
GAP_SPLIT_NS = 20_000_000  # kernels further apart than this belong to different configs
ACCURACY_FACTOR = 1.10
EXACT_ROWS = 32  # rows of set 0 compared with exact attention
FP8_SCALES = (0.5, 2.0)  # k_scale, v_scale of the fp8 sweep: not 1, so a dropped scale shows
VERSIONS = {"bf16": ("0.30.0", "0.34.0"), "fp8": ("0.34.0",)}  # originals timed beside Pallas


def versions_of(results) -> tuple[str, ...]:
    """The originals a sweep compared with; the first is its accuracy reference (sweeps
    written before fp8 existed have no ``kv_dtype`` and are bf16)."""
    return VERSIONS[results.get("kv_dtype", "bf16")]


def split_choices(programs: int) -> tuple[int, ...]:
    """Split counts worth trying for a bucket: enough programs to fill 132 SMs, not
    so many that the merge's traffic dominates."""
    if programs <= 4:
        return (16, 32, 64, ALL_TILES)
    if programs <= 16:
        return (8, 16, 32, 64)
    if programs <= 32:
        return (4, 8, 16, 32)
    if programs <= 64:
        return (2, 4, 8, 16)
    if programs <= 128:
        return (2, 4, 8)
    if programs <= 256:
        return (1, 2, 4, 8)
    if programs <= 512:
        return (1, 2, 4)
    return (1, 2)


@dataclasses.dataclass(frozen=True)
class Variant:
    block_n: int
    splits: int  # resolved (never ALL_TILES)
    warps: int
    stages: int = 2

    def key(self) -> str:
        return f"bn{self.block_n}/s{self.splits}/w{self.warps}/st{self.stages}"


def stage1_variants(programs: int, width: int) -> list[Variant]:
    out = []
    for bn in BLOCK_NS:
        if bn == 16 and programs > 64:
            continue  # 16-wide tiles cannot keep up with bandwidth once the GPU is full
        tiles = -(-width // bn)
        for s in split_choices(programs):
            s = tiles if s == ALL_TILES else s
            if s <= tiles:
                v = Variant(bn, s, 2)
                if v not in out:
                    out.append(v)
    return out


def exact_attention_torch(q, kv, idx, block_table, token_to_req, gate, rows: int,
                          k_scale: float = 1.0, v_scale: float = 1.0):
    """Exact gated attention of the first ``rows`` rows in float64 on the GPU (torch).

    The same definition as ``qsa_testing.exact`` (tests/test_bench.py checks the two agree),
    computed where the multi-GB pool lives instead of fetching its rows to the host.

    Valid entries as the operator defines them (request in range, token >= 0, page in
    the table, physical page in range, column < count); softmax(q.K^T k_scale / sqrt(D))
    V v_scale, times sigmoid(gate), with no rounding in between. Rows with no valid entry
    give 0. An fp8 ``kv`` is gathered as bytes (torch lacks float8 indexing kernels) and
    dequantised exactly.
    """
    import torch

    nb, hk, page, d2 = kv.shape
    d = d2 // 2
    w = idx.shape[1] - 1
    idx = idx[:rows].long()
    count = idx[:, w].clamp(max=w)
    tok = idx[:, :w]
    col = torch.arange(w, device=idx.device)[None, :]
    req = token_to_req[:rows].long()
    req_ok = (req >= 0) & (req < block_table.shape[0])
    safe_tok = tok.clamp(min=0)
    lpage = safe_tok // page
    valid = req_ok[:, None] & (tok >= 0) & (col < count[:, None]) & (lpage < block_table.shape[1])
    pg = block_table[req.clamp(0, block_table.shape[0] - 1)[:, None], lpage.clamp(max=block_table.shape[1] - 1)].long()
    valid &= (pg >= 0) & (pg < nb)
    pg = torch.where(valid, pg, 0)
    slot = torch.where(valid, safe_tok % page, 0)
    if kv.dtype == torch.float8_e4m3fn:
        rows_kv = kv.view(torch.uint8)[pg, :, slot, :].view(torch.float8_e4m3fn).double()  # [R, W, Hk, 2D]
    else:
        rows_kv = kv[pg, :, slot, :].double()  # [R, W, Hk, 2D]
    # Invalid entries read row 0, which may hold anything (NaN): zero them, never multiply.
    rows_kv = torch.where(valid[:, :, None, None], rows_kv, 0.0)
    keys, values = rows_kv[..., :d], rows_kv[..., d:]
    h = q.shape[1]
    g = h // hk
    qd = q[:rows].double().reshape(rows, hk, g, d)
    scores = torch.einsum("rkgd,rwkd->rkgw", qd, keys) * (d ** -0.5 * k_scale)
    scores = scores.masked_fill(~valid[:, None, None, :], -math.inf)
    any_valid = valid.any(dim=1)[:, None, None, None]
    probs = torch.softmax(torch.where(any_valid, scores, 0.0), dim=-1)
    probs = torch.where(any_valid & valid[:, None, None, :], probs, 0.0)
    out = torch.einsum("rkgw,rwkd->rkgd", probs, values).reshape(rows, h, d) * v_scale
    return out * torch.sigmoid(gate[:rows].double())


def rel_err(x, exact) -> float:
    import torch

    x = x.double()
    denom = torch.linalg.norm(exact).item()
    return torch.linalg.norm(x - exact).item() / denom if denom else 0.0


def split_bursts(kernels, expected: int):
    bursts, current = [], []
    for k in kernels:
        if current and k.start_ns - current[-1].end_ns > GAP_SPLIT_NS:
            bursts.append(current)
            current = []
        current.append(k)
    if current:
        bursts.append(current)
    return bursts if len(bursts) == expected else None


def traced_job_bursts(jobs, runs: int, rounds: int = 1):
    """One profiler trace of ``rounds`` passes over ``jobs`` (``(run, wait)`` pairs: ``runs``
    back-to-back ``run()``, then ``wait(last result)``, then ``GAP_S`` idle), split into one
    burst of kernels per job and pass (pass-major), or None where the trace does not split so."""
    from bench import kernel_trace

    def traced():
        for _ in range(rounds):
            for run, wait in jobs:
                out = None
                for _ in range(runs):
                    out = run()
                wait(out)
                time.sleep(GAP_S)
    return split_bursts(kernel_trace.gpu_kernels(traced), rounds * len(jobs))


class Case:
    """One (geometry, rows) case: inputs, the originals' busy time and error, exact output."""

    def __init__(self, geo_name: str, rows: int, n_sets: int, pools, mods, seed: int, scales=None):
        import jax
        import torch

        from bench import inputs

        self.geo_name, self.rows = geo_name, rows
        self.geo, self.kv_t, self.kv = pools[geo_name]
        geo = self.geo
        self.inp = inputs.sparse_inputs(geo, rows, n_sets, seed=seed)
        self.programs = rows * geo.num_kv_heads
        t = torch.from_dlpack
        self.tq, self.tgate = t(self.inp.q), t(self.inp.gate)
        self.tbt, self.tt2r = t(self.inp.block_table), t(self.inp.token_to_req)
        self.tidx = [t(x) for x in self.inp.idx]
        d = geo.head_dim
        self.k, self.v = self.kv_t.transpose(1, 2).split(d, -1)
        m = min(rows, EXACT_ROWS)
        self.scales = scales  # None (bf16) or (k_scale, v_scale) for the fp8 cache
        self.exact = exact_attention_torch(self.tq, self.kv_t, self.tidx[0], self.tbt, self.tt2r, self.tgate, m,
                                           *(scales or (1.0, 1.0)))
        self.exact_rows = m
        self.mods = mods
        self.width = geo.selection_width
        self.args = (self.inp.q, self.kv, tuple(self.inp.idx), self.inp.block_table, self.inp.token_to_req,
                     self.inp.gate)
        jax.block_until_ready(self.args)

    def original_calls(self, version: str, flag: bool):
        import torch

        mod = self.mods[version]
        out = torch.empty_like(self.tq)

        def run():
            for idx in self.tidx:
                mod.qsa_sparse_paged_attention(self.tq, self.k, self.v, idx, self.tbt, self.tt2r, flag, out,
                                               *(self.scales or ()), output_gate=self.tgate)
            return out
        return run, out

    def original_once(self, version: str, flag: bool):
        """The original's output for selection set 0."""
        import torch

        out = torch.empty_like(self.tq)
        self.mods[version].qsa_sparse_paged_attention(self.tq, self.k, self.v, self.tidx[0], self.tbt, self.tt2r,
                                                      flag, out, *(self.scales or ()), output_gate=self.tgate)
        torch.cuda.synchronize()
        return out

    def original_config(self, version: str, flag: bool):
        fp8 = () if self.scales is None else (True,)  # 0.34.0's is_fp8 argument
        return tuple(self.mods[version]._select_config(self.rows, self.geo.num_kv_heads, flag, self.width, *fp8))


def build_fn(case: Case, v: Variant):
    """N sequential public Pallas calls with ``v``'s tiling (``config=``) and pipelining
    depth (``launch=``: both are part of the jitted call's static problem)."""
    import jax

    import qsa_jax
    from bench.timing import sequential_calls

    cfg = (v.block_n, v.warps, -(-case.width // v.block_n), v.splits)
    launch = qsa_jax.PallasLaunch(num_stages=v.stages)
    scales = {} if case.scales is None else dict(zip(("k_scale", "v_scale"), case.scales))

    def chain(q, kv, idx_sets, bt, t2r, gate):
        return sequential_calls(lambda i: qsa_jax.sparse_attention(
            q, kv, i, bt, t2r, gate, config=cfg, implementation="pallas", launch=launch, **scales), idx_sets)
    return jax.jit(chain)


def compile_all(jobs, pool):
    """Lower serially (tracing is Python) and compile in threads (XLA's and Triton's
    compilers release the GIL)."""
    lowered = [build_fn(case, v).lower(*case.args) for case, v in jobs]
    try:
        return list(pool.map(lambda low: low.compile(), lowered))
    except Exception as exc:  # noqa: BLE001 -- a threaded compile failing: do it serially
        print(f"  threaded compile failed ({type(exc).__name__}: {exc}); compiling serially", flush=True)
        return [low.compile() for low in lowered]


def time_jobs(jobs, compiled, n_sets: int, runs: int, originals):
    """Busy µs/call of every job and of every (label, run) in ``originals``, from one trace.

    Returns ({job index: µs}, {label: µs}, {job index: output of set 0}); None entries
    where the trace could not attribute kernels."""
    import jax
    import torch

    from bench import kernel_trace

    outs = {}
    for i, c in enumerate(compiled):  # warm: module load, first launch
        outs[i] = jax.block_until_ready(c(*jobs[i][0].args))[0]
    for _, run in originals:
        run()
    torch.cuda.synchronize()

    def traced():
        for i, c in enumerate(compiled):
            res = None
            for _ in range(runs):
                res = c(*jobs[i][0].args)
            jax.block_until_ready(res)
            time.sleep(GAP_S)
        for _, run in originals:
            for _ in range(runs):
                run()
            torch.cuda.synchronize()
            time.sleep(GAP_S)

    kernels = kernel_trace.gpu_kernels(traced)
    bursts = split_bursts(kernels, len(compiled) + len(originals))
    calls = runs * n_sets
    if bursts is None:
        print(f"  trace: {len(kernels)} kernels could not be split into {len(compiled) + len(originals)} "
              f"bursts; timing one by one", flush=True)
        job_us, orig_us = {}, {}
        for i, c in enumerate(compiled):
            s = kernel_trace.trace_runs(lambda c=c, i=i: c(*jobs[i][0].args), runs=runs, calls_per_run=n_sets,
                                        wait=jax.block_until_ready)
            job_us[i] = s.busy_us_per_call if s else None
        for label, run in originals:
            s = kernel_trace.trace_runs(run, runs=runs, calls_per_run=n_sets, wait=lambda _: torch.cuda.synchronize())
            orig_us[label] = s.busy_us_per_call if s else None
        return job_us, orig_us, outs
    busy = [sum(k.duration_ns for k in b) / calls / 1e3 for b in bursts]
    return ({i: busy[i] for i in range(len(compiled))},
            {label: busy[len(compiled) + j] for j, (label, _) in enumerate(originals)}, outs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--buckets", default="1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192")
    ap.add_argument("--n-sets", type=int, default=10, help="fresh selection sets per timed chain")
    ap.add_argument("--runs", type=int, default=3, help="chains per config in the trace")
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--threads", type=int, default=12)
    ap.add_argument("--pool-gb", type=float, default=2.0)
    ap.add_argument("--kv-dtype", choices=sorted(VERSIONS), default="bf16")
    ap.add_argument("--replot", action="store_true", help="only redraw sweep.png and sweep.md from --out's sweep.json")
    a = ap.parse_args(argv)
    if a.replot:
        with open(os.path.join(a.out, "sweep.json")) as f:
            results = json.load(f)
        with open(os.path.join(a.out, "sweep.md"), "w") as f:
            f.write(markdown(results))
        plot(results, os.path.join(a.out, "sweep.png"))
        return 0
    t_start = time.perf_counter()

    import jax
    import torch

    from bench import inputs
    from qsa_testing import originals

    os.makedirs(a.out, exist_ok=True)
    fp8 = a.kv_dtype == "fp8"
    versions = VERSIONS[a.kv_dtype]
    scales = FP8_SCALES if fp8 else None
    mods = {ver: originals.load(ver) for ver in versions}
    pools = {}
    for name in ("TP1", "TP4"):
        geo = inputs.geometry(name, cpu=False, pool_gb=a.pool_gb)
        kv_t, kv = inputs.make_pool(geo, gpu=True, seed=11 + len(pools), fp8=fp8)
        pools[name] = (geo, kv_t, kv)
    card = jax.devices()[0].device_kind
    results = {"card": card, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "jax": jax.__version__,
               "git_commit": os.environ.get("QSA_GIT_COMMIT", ""), "n_sets": a.n_sets, "runs": a.runs,
               "accuracy_factor": ACCURACY_FACTOR, "exact_rows": EXACT_ROWS, "kv_dtype": a.kv_dtype,
               "scales": scales, "buckets": []}
    pool = concurrent.futures.ThreadPoolExecutor(a.threads)

    def save():
        with open(os.path.join(a.out, "sweep.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(a.out, "sweep.md"), "w") as f:
            f.write(markdown(results))

    for programs in [int(x) for x in a.buckets.split(",")]:
        if time.perf_counter() - t_start > a.budget_s:
            print(f"budget spent before bucket {programs}", flush=True)
            break
        t_bucket = time.perf_counter()
        cases = []
        if programs % 2 == 0:
            cases.append(Case("TP1", programs // 2, a.n_sets, pools, mods, seed=programs, scales=scales))
        cases.append(Case("TP4", programs, a.n_sets, pools, mods, seed=programs + 1, scales=scales))
        bucket = {"programs": programs, "cases": []}
        measured: dict[tuple[str, str], dict] = {}

        def run_stage(variants, with_originals):
            jobs = [(c, v) for c in cases for v in variants]
            compiled = compile_all(jobs, pool)
            origs = []
            if with_originals:
                for c in cases:
                    flags = (False, True) if programs > 2048 else (False,)
                    for ver in versions:
                        for flag in flags:
                            run, _ = c.original_calls(ver, flag)
                            origs.append(((c.geo_name, ver, flag), run))
            job_us, orig_us, outs = time_jobs(jobs, compiled, a.n_sets, a.runs, origs)
            for i, (c, v) in enumerate(jobs):
                got = torch.from_dlpack(outs[i])[: c.exact_rows]
                finite = bool(torch.isfinite(got).all())
                measured[(c.geo_name, v.key())] = {
                    "variant": dataclasses.asdict(v), "busy_us": job_us[i],
                    "err_exact": rel_err(got, c.exact) if finite else float("inf")}
            return orig_us

        orig_us = run_stage(stage1_variants(programs, cases[0].width), True)
        for c in cases:
            rec = {"geometry": c.geo_name, "rows": c.rows, "originals": {}}
            for ver in versions:
                for flag in ((False, True) if programs > 2048 else (False,)):
                    out = c.original_once(ver, flag)
                    rec["originals"][f"{ver}/prefill={flag}"] = {
                        "busy_us": orig_us.get((c.geo_name, ver, flag)),
                        "config": list(c.original_config(ver, flag)),
                        "err_exact": rel_err(out[: c.exact_rows], c.exact)}
            bucket["cases"].append(rec)

        def bar(c_index):
            return ACCURACY_FACTOR * bucket["cases"][c_index]["originals"][f"{versions[0]}/prefill=False"]["err_exact"]

        def ranking():
            keys = {k for (_, k) in measured}
            best = {c.geo_name: min(m["busy_us"] for (g, _), m in measured.items()
                                    if g == c.geo_name and m["busy_us"]) for c in cases}
            scored = []
            for key in keys:
                entries = [measured.get((c.geo_name, key)) for c in cases]
                if any(e is None or not e["busy_us"] for e in entries):
                    continue
                ok = all(e["err_exact"] <= bar(i) for i, e in enumerate(entries))
                worst = max(e["busy_us"] / best[c.geo_name] for e, c in zip(entries, cases))
                scored.append((not ok, worst, key))
            return sorted(scored)

        top = [k for _, _, k in ranking()[:3]]
        refine = []
        for key in top:
            v = Variant(**measured[(cases[0].geo_name, key)]["variant"])
            for w in (1, 4) + ((8,) if v.block_n >= 64 else ()):
                refine.append(dataclasses.replace(v, warps=w))
        if top:
            v = Variant(**measured[(cases[0].geo_name, top[0])]["variant"])
            refine += [dataclasses.replace(v, stages=1), dataclasses.replace(v, stages=3)]
        if time.perf_counter() - t_start < a.budget_s:
            run_stage([v for v in refine if (cases[0].geo_name, v.key()) not in measured], False)
        ranked = ranking()
        bucket["measured"] = [{"geometry": g, "key": k, **m} for (g, k), m in sorted(measured.items())]
        bucket["winner"] = None
        if ranked and not ranked[0][0]:
            bucket["winner"] = {"key": ranked[0][2], "worst_ratio_to_best": ranked[0][1],
                                **measured[(cases[0].geo_name, ranked[0][2])]["variant"]}
        bucket["seconds"] = time.perf_counter() - t_bucket
        results["buckets"].append(bucket)
        save()
        print(bucket_line(bucket, versions), flush=True)
        del cases
    save()
    print(markdown(results))
    return 0


def plot(results, path: str) -> None:
    """Busy time against programs, one line per (block_n, splits) family at its best
    warps/stages, beside the two originals, for each geometry."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    geos = ("TP1", "TP4")
    fig, axes = plt.subplots(1, len(geos), figsize=(13, 5), sharey=True)
    for ax, geo in zip(axes, geos):
        lines: dict[str, dict[int, float]] = {}
        for b in results["buckets"]:
            for m in b["measured"]:
                if m["geometry"] != geo or not m["busy_us"]:
                    continue
                v = m["variant"]
                splits = "1 split" if v["splits"] == 1 else "splits"
                label = f"block_n {v['block_n']}, {splits}"
                best = lines.setdefault(label, {})
                best[b["programs"]] = min(best.get(b["programs"], math.inf), m["busy_us"])
            for c in b["cases"]:
                if c["geometry"] != geo:
                    continue
                for ver in versions_of(results):
                    o = c["originals"][f"{ver}/prefill=False"]
                    if o["busy_us"]:
                        lines.setdefault(f"vLLM {ver}", {})[b["programs"]] = o["busy_us"]
        for label, pts in sorted(lines.items()):
            xs = sorted(pts)
            style = (dict(lw=2.5, color="black" if versions_of(results)[0] in label else "gray")
                     if "vLLM" in label else dict(lw=1))
            ax.plot(xs, [pts[x] for x in xs], marker="o", ms=3, label=label, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("programs (rows x KV heads)")
        ax.set_title(f"{geo}: best of each family")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("GPU busy time per call (µs)")
    axes[-1].legend(fontsize=7)
    fig.suptitle(f"Pallas sparse attention tiling sweep ({results.get('kv_dtype', 'bf16')} cache), "
                 f"{results['card']}, {results['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def winner_of(b, c):
    """The bucket winner's measurement on case ``c``'s geometry (None without a winner)."""
    w = b["winner"]
    return next((m for m in b["measured"] if m["geometry"] == c["geometry"] and w and m["key"] == w["key"]), None)


def bucket_line(b, versions) -> str:
    w = b["winner"]
    parts = [f"programs {b['programs']:5d}: winner {w['key'] if w else 'none'} ({b['seconds']:.0f} s)"]
    for c in b["cases"]:
        mine = winner_of(b, c)
        origs = [c["originals"][f"{ver}/prefill=False"] for ver in versions]
        if mine and mine["busy_us"] and all(o["busy_us"] for o in origs):
            vs = " / ".join(f"{ver[:4]} {o['busy_us']:.1f}" for ver, o in zip(versions, origs))
            parts.append(f"{c['geometry']} rows {c['rows']}: {mine['busy_us']:.1f} µs vs {vs}; "
                         f"err {mine['err_exact']:.2e} vs {origs[0]['err_exact']:.2e}")
    return "; ".join(parts)


def markdown(results) -> str:
    versions = versions_of(results)
    kv = results.get("kv_dtype", "bf16")
    cache = "bf16 cache" if kv == "bf16" else "fp8 cache: e4m3, k_scale {}, v_scale {}".format(*results["scales"])
    lines = [f"# Pallas tiling sweep ({cache}) — {results['card']}, {results['date']}", "",
             f"GPU busy time per call (µs; sum of kernel durations from a profiler trace, "
             f"{results['n_sets']} fresh selection sets x {results['runs']} runs). err = relative Frobenius "
             f"error from exact float64 attention on the first {results['exact_rows']} rows of one set; a config "
             f"is eligible when err <= {results['accuracy_factor']} x the {versions[0]} original's.", "",
             "| programs | geometry | rows | winner (block_n/splits/warps/stages) | busy µs | "
             + "".join(f"{ver} µs | " for ver in versions) + "vs faster original | err | "
             + "".join(f"err {ver} | " for ver in versions) + "configs tried |",
             "|" + "---|" * (8 + 2 * len(versions))]
    for b in results["buckets"]:
        w = b["winner"]
        for c in b["cases"]:
            mine = winner_of(b, c)
            origs = [c["originals"][f"{ver}/prefill=False"] for ver in versions]
            fmt = lambda x, f="{:.1f}": "" if x is None else f.format(x)  # noqa: E731
            ratio = ""
            if mine and mine["busy_us"] and all(o["busy_us"] for o in origs):
                ratio = f"{mine['busy_us'] / min(o['busy_us'] for o in origs):.2f}x"
            tried = sum(1 for m in b["measured"] if m["geometry"] == c["geometry"])
            lines.append(
                f"| {b['programs']} | {c['geometry']} | {c['rows']} | {w['key'] if w else 'none'} | "
                f"{fmt(mine and mine['busy_us'])} | " + "".join(f"{fmt(o['busy_us'])} | " for o in origs)
                + f"{ratio} | {fmt(mine and mine['err_exact'], '{:.2e}')} | "
                + "".join(f"{o['err_exact']:.2e} | " for o in origs) + f"{tried} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
