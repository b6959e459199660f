"""One benchmark command: originals (torch + Triton) vs qsa_jax implementations vs the torch shim.

    python -m bench.run                     # full grid (GPU) or the reduced CPU mode
    python -m bench.run --quick             # a few minutes of device time
    python -m bench.run --op sparse --tp TP1 --rows 1,64 --n-calls 8

See bench/README.md for the method and the byte model. Writes results.json,
results.md and PNG plots to bench/results/<card-slug>_<date>/ (or --out).
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import signal
import sys
import time
import traceback

OPS = ("sparse_attention", "compress_groups_with_ratio", "store_cache_rows")
OP_ALIASES = {"sparse": "sparse_attention", "attention": "sparse_attention",
              "compress": "compress_groups_with_ratio", "store": "store_cache_rows",
              **{op: op for op in OPS}}
IMPLS = ("original", "original034", "xla", "pallas", "triton", "shim")
TORCH_IMPLS = ("original", "original034", "shim")
# The vLLM release each torch-side original is loaded from.
ORIGINAL_VERSIONS = {"original": "0.30.0", "original034": "0.34.0"}
KV_DTYPES = ("bf16", "fp8")
# Dequantisation scales of the fp8 rows: other than 1 so that a dropped or swapped
# scale shows in the check.
FP8_K_SCALE, FP8_V_SCALE = 0.5, 2.0
SHIM_FUNCS = {"sparse_attention": "qsa_sparse_paged_attention",
              "compress_groups_with_ratio": "qsa_compress_groups_with_ratio",
              "store_cache_rows": "qsa_store_cache_rows"}

GPU_ROWS = tuple(2**i for i in range(13))  # 1 .. 4096 (qsa_jax.arg_specs.BENCH_ROWS)
GPU_INDEXER_ROWS = (1, 4, 16, 64, 256, 512, 1024, 4096, 8192)
CPU_ROWS = (1, 4, 16, 64)
CPU_INDEXER_ROWS = (1, 16, 256)
QUICK = {"gpu": dict(rows=(1, 64, 1024, 4096), indexer_rows=(1, 512, 8192), rings=(4,),
                     n_calls=10, eager_calls=10),
         "cpu": dict(rows=(1, 16), indexer_rows=(1, 64), rings=(4,), tps=("TP1", "TP4"),
                     n_calls=3, eager_calls=3)}

BYTE_MODEL = {
    "sparse_attention": "K and V rows of every valid selected entry (valid entries x Hk x 2 x D x 2 B; "
                        "here every entry below a row's count is valid and distinct) + q + output_gate "
                        "read + out written (3 x R x H x D x 2 B). Indices, block table and token_to_req "
                        "(< 0.2% of the K/V bytes) and split-K partials are not counted.",
    "compress_groups_with_ratio": "R x (C=4 members x Dk=128 x 2 B read + 128 x 2 B pooled written "
                                  "+ 3 x 8 B rope positions read + 3 x 8 B first positions written). "
                                  "Per-row metadata is not counted.",
    "store_cache_rows": "n x (140 x 2 B rows read + 140 x 2 B written) + n x 4 B slot numbers.",
}


def _csv(s, cast=str):
    return tuple(cast(x) for x in s.split(",") if x.strip()) if s else None


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", help="comma list of ops: sparse, compress, store (default all)")
    p.add_argument("--tp", help="comma list of geometries: TP1,TP2,TP4 (default all)")
    p.add_argument("--rows", help="sparse-attention rows, comma list (default 1,2,4..4096; CPU 1,4,16,64)")
    p.add_argument("--indexer-rows", help="compress/store rows, comma list (default 1,4,16,64,256,512,1024,4096,8192)")
    p.add_argument("--ring", help="indexer ring sizes, comma list (default 4,8)")
    p.add_argument("--impl", help="comma list of original,original034,triton,pallas,xla,shim (default: all that "
                                  "can run; on CPU: xla only, name pallas to time its interpreter)")
    p.add_argument("--kv-dtype", help="comma list of K/V cache dtypes: bf16, fp8 (e4m3, k_scale 0.5, v_scale 2; "
                                      "vLLM 0.34's path, which 0.30.0 lacks). Default bf16,fp8 on a GPU, bf16 on CPU")
    p.add_argument("--n-calls", type=int, help="N: calls per timed unit, each with a fresh input set (default 20; CPU 4)")
    p.add_argument("--eager-calls", type=int, help="calls for the eager-latency median (default 20; CPU 5)")
    p.add_argument("--quick", action="store_true", help="a small grid: rows 1,64,1024,4096, N=10, ring 4")
    p.add_argument("--prefill", choices=("auto", "false", "true"), default="auto",
                   help="use_prefill_config values: auto = False, plus True where rows*Hk > 2048 (default)")
    p.add_argument("--cpu", action="store_true", help="force the reduced CPU mode (JAX on CPU)")
    p.add_argument("--pool-gb", type=float, default=4.0, help="size of each geometry's K/V page pool on the GPU (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shim-graph", action="store_true",
                   help="try to capture the shim in a CUDA graph (default: time it as an eager loop)")
    p.add_argument("--trace-rows", type=int,
                   help="also take a profiler trace (kernel busy time per call) of the original, pallas and "
                        "triton cases with at most this many rows (default: 64 on a GPU, 0 = none on CPU, "
                        "where the trace holds no kernels)")
    p.add_argument("--out", help="output folder (default bench/results/<card-slug>_<date>)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


class Progress:
    def __init__(self, total, enabled):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="run", dynamic_ncols=True, file=sys.stderr)
            except ImportError:
                pass
        self.done, self.total = 0, total

    def step(self, what):
        self.done += 1
        if self.bar is not None:
            self.bar.set_description(what[:60])
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.total}] {what}", file=sys.stderr, flush=True)

    def write(self, msg):
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


# ---------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    repo = pathlib.Path(__file__).resolve().parents[1]
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))

    import jax
    import numpy as np

    import qsa_jax
    from bench import inputs as I
    from bench import machine, report, timing
    from qsa_testing import agreement

    gpu = machine.jax_gpu() and not args.cpu
    mode = "gpu" if gpu else "cpu"
    tcuda, why_no_torch = machine.torch_cuda() if gpu else (False, "CPU mode")
    t_start = time.perf_counter()

    ops = tuple(dict.fromkeys(OP_ALIASES[o] for o in (_csv(args.op) or OPS)))
    quick = QUICK[mode] if args.quick else {}
    tps = _csv(args.tp) or quick.get("tps") or ("TP1", "TP2", "TP4")
    rows_list = _csv(args.rows, int) or quick.get("rows") or (GPU_ROWS if gpu else CPU_ROWS)
    idx_rows = _csv(args.indexer_rows, int) or quick.get("indexer_rows") or (GPU_INDEXER_ROWS if gpu else CPU_INDEXER_ROWS)
    rings = _csv(args.ring, int) or quick.get("rings") or (4, 8)
    n_calls = args.n_calls or quick.get("n_calls") or (20 if gpu else 4)
    eager_calls = args.eager_calls or quick.get("eager_calls") or (20 if gpu else 5)
    for tp in tps:
        if tp not in ("TP1", "TP2", "TP4"):
            raise SystemExit(f"--tp: unknown geometry {tp!r}; choose from TP1, TP2, TP4")
    if min(rows_list) < 1 or min(idx_rows) < 1 or min(rings) < 4:
        raise SystemExit("--rows / --indexer-rows must be >= 1 and --ring >= 4 (the compress ratio)")
    kv_dtypes = _csv(args.kv_dtype) or (KV_DTYPES if gpu else ("bf16",))
    for name in kv_dtypes:
        if name not in KV_DTYPES:
            raise SystemExit(f"--kv-dtype: unknown dtype {name!r}; choose from {KV_DTYPES}")
    requested = _csv(args.impl)
    for name in requested or ():
        if name not in IMPLS:
            raise SystemExit(f"--impl: unknown implementation {name!r}; choose from {IMPLS}")

    # --- what can run -------------------------------------------------------------
    status: dict[str, dict[str, str]] = {}
    orig_mods = {name: None for name in ORIGINAL_VERSIONS}
    orig_whys = {name: None for name in ORIGINAL_VERSIONS}
    shim_mod = shim_why = None
    if not gpu:
        orig_whys = {name: "CPU mode: the originals are Triton kernels that need CUDA" for name in ORIGINAL_VERSIONS}
        shim_why = "CPU mode: the shim is timed on CUDA tensors only"
    elif not tcuda:
        orig_whys = {name: why_no_torch for name in ORIGINAL_VERSIONS}
        shim_why = why_no_torch
    else:
        for name, version in ORIGINAL_VERSIONS.items():
            try:
                orig_mods[name] = _load_original(version)
            except Exception as exc:  # OriginalsUnavailable or anything its import raises
                orig_whys[name] = f"{type(exc).__name__}: {exc}"
        try:
            import qsa_torch_shim as shim_mod
        except Exception as exc:
            shim_why = f"import qsa_torch_shim failed: {type(exc).__name__}: {exc}"
    impls_by_op = {}
    for op in ops:
        status[op] = {}
        avail = qsa_jax.available_implementations(op)
        chosen = []
        for name in IMPLS:
            if requested is not None and name not in requested:
                status[op][name] = "not requested"
                continue
            if name == "original034" and op != "sparse_attention":
                why = "the same kernels as 0.30.0 (0.34.0 changed only the sparse attention)"
            elif name in ORIGINAL_VERSIONS:
                why = orig_whys[name]
            elif name == "shim":
                why = shim_why or (None if hasattr(shim_mod, SHIM_FUNCS[op])
                                   else f"qsa_torch_shim has no {SHIM_FUNCS[op]}")
            elif name in avail:
                why = None
                if not gpu and name != "xla" and requested is None:
                    why = "CPU mode: interpreter not timed by default (name it in --impl to time it)"
            else:
                try:
                    why = qsa_jax._implementations.REGISTRIES[op].why_not(name) or "not available"
                except Exception as exc:
                    why = repr(exc)
            if why is not None:
                why = str(why).strip().splitlines()[0][:300]
            status[op][name] = "available" if why is None else f"unavailable: {why}"
            if why is None:
                chosen.append(name)
        impls_by_op[op] = chosen

    info = machine.describe(gpu)
    info["mode"] = mode
    if not gpu:
        info["warning"] = ("NOT a GPU measurement: CPU mode runs the JAX implementations on the host CPU "
                           "at reduced size (smaller page size, selection width, context and pool, fewer rows). "
                           "Its numbers say nothing about GPU speed.")
    out_dir = pathlib.Path(args.out) if args.out else report.default_out_dir(repo, info)
    out_dir.mkdir(parents=True, exist_ok=True)

    print(f"qsa-jax benchmark on {info['card']} ({mode} mode), writing to {out_dir}", flush=True)
    if not gpu:
        print("*** " + info["warning"], flush=True)
    for op in ops:
        for name, st in status[op].items():
            if st != "available" and st != "not requested":
                print(f"  {op}: {name}: {st}", flush=True)
    copy_bw = machine.copy_bandwidth(gpu)
    print(f"device copy bandwidth: {copy_bw['gbps']:.0f} GB/s ({copy_bw['method']})", flush=True)

    # --- plan ------------------------------------------------------------------------
    def flags_for(rows, hk):
        if args.prefill == "false":
            return (False,)
        if args.prefill == "true":
            return (True,)
        return (False, True) if rows * hk > 2048 else (False,)

    geos = {tp: I.geometry(tp, cpu=not gpu, pool_gb=args.pool_gb) for tp in tps}
    total = 0
    if "sparse_attention" in ops:
        total += sum(len(flags_for(r, geos[tp].num_kv_heads)) * len(impls_by_op["sparse_attention"])
                     for tp in tps for r in rows_list) * len(kv_dtypes)
    for op in ("compress_groups_with_ratio", "store_cache_rows"):
        if op in ops:
            total += len(rings) * len(idx_rows) * len(impls_by_op[op])
    progress = Progress(total, not args.no_progress)

    results = {
        "machine": info,
        "mode": mode,
        "not_a_gpu_measurement": not gpu,
        "copy_bandwidth": copy_bw,
        "settings": {"ops": ops, "tps": tps, "kv_dtypes": kv_dtypes, "fp8_scales": [FP8_K_SCALE, FP8_V_SCALE], "rows": rows_list, "indexer_rows": idx_rows, "rings": rings,
                     "n_calls": n_calls, "eager_calls": eager_calls, "prefill": args.prefill,
                     "pool_gb": args.pool_gb, "seed": args.seed, "quick": args.quick,
                     "geometries": {tp: g.as_dict() for tp, g in geos.items()}},
        "implementations": status,
        "byte_model": {op: BYTE_MODEL[op] for op in ops},
        "method": {
            "device_time": "torch: CUDA graph capturing N calls (each with its own fresh input set), replayed; "
                           "JAX: one jitted function making the N calls in sequence (optimization barriers "
                           "chain each call after the previous one), dispatched back to back, wall clock; "
                           "both divided by N. The shim (JAX work, which a torch graph cannot capture): N eager "
                           "calls launched back to back, CUDA events, divided by N",
            "busy": "GPU busy time per call from a profiler trace (CUPTI, via jax.profiler; bench.kernel_trace): "
                    "the sum of the durations of every kernel the GPU ran during 3 runs of the timed unit "
                    "(graph replays / executions), divided by the calls; free of host launch gaps. Taken for "
                    "original, pallas and triton where rows <= --trace-rows",
            "eager": "median wall time of one call from Python followed by a device synchronisation "
                     "(torch.cuda.synchronize / block_until_ready), rotating through the input sets",
            "check": "first call of each case against the original (or, without one, the float64 oracle "
                     "in CPU mode): relative Frobenius error <= 1e-3, no NaN, exact zeros where the "
                     "reference is 0; integer outputs and caches exactly",
        },
        "results": [],
    }

    ctx = dict(np=np, jax=jax, qsa_jax=qsa_jax, I=I, timing=timing, agreement=agreement,
               orig=orig_mods["original"], orig034=orig_mods["original034"], shim=shim_mod, gpu=gpu,
               n_calls=n_calls, eager_calls=eager_calls,
               copy_gbps=copy_bw["gbps"], progress=progress, shim_graph=args.shim_graph,
               trace_rows=args.trace_rows if args.trace_rows is not None else (64 if gpu else 0))

    def _interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)
    partial_json = out_dir / "results.partial.json"

    def emit(rec):
        results["results"].append(rec)
        report.write_json(results, partial_json)
        progress.write(report.one_line(rec))
        if rec.get("error"):
            progress.write("    " + rec["error"].strip().splitlines()[-1])

    try:
        if "sparse_attention" in ops:
            for kv_dtype in kv_dtypes:
                for tp in tps:
                    run_sparse_geometry(ctx, geos[tp], rows_list, flags_for, impls_by_op["sparse_attention"],
                                        args.seed, emit, kv_dtype=kv_dtype)
        for op in ("compress_groups_with_ratio", "store_cache_rows"):
            if op in ops:
                for ring in rings:
                    for n in idx_rows:
                        run_indexer_case(ctx, op, ring, n, impls_by_op[op], args.seed, emit)
    except KeyboardInterrupt:
        progress.write("interrupted: writing what was measured")
        results["interrupted"] = True
    finally:
        progress.close()
        results["wall_s"] = time.perf_counter() - t_start
        report.finish(results)
        paths = report.write_all(results, out_dir, plot=not args.no_plot)
        partial_json.unlink(missing_ok=True)
    print(f"done in {results['wall_s']:.0f} s; wrote " + ", ".join(str(p) for p in paths), flush=True)
    bad = [r for r in results["results"] if r.get("error") or (r.get("check") and not r["check"].get("ok", True))]
    if bad:
        print(f"{len(bad)} case(s) FAILED the check or raised: see the table", flush=True)
    # A failed check or an error is the run's verdict too (scripts and CI see it).
    return 1 if bad else 0


def _load_original(version: str):
    from qsa_testing import originals

    return originals.load(version=version)


def _record_error(rec, exc):
    """Keep a failing measurement in the results (flagged), with its traceback."""
    rec["error"] = "".join(traceback.format_exception_only(type(exc), exc))
    rec["traceback"] = traceback.format_exc(limit=8)


def _close_record(ctx, rec, t_rec, baseline, emit, label):
    """Finish one record: rates against the original, emit, progress. Returns the baseline.

    The originals run first in every case; their (device_s, eager_s) become the
    baselines (keyed by impl) of the implementations that follow.
    """
    baseline = dict(baseline)
    if rec["impl"] in ORIGINAL_VERSIONS:
        baseline[rec["impl"]] = (rec.get("device_s"), rec.get("eager_s"))
    rec["wall_s"] = time.perf_counter() - t_rec
    _rates(ctx, rec, *baseline.get("original", (None, None)))
    dev034 = baseline.get("original034", (None, None))[0]
    if rec.get("device_s") and dev034:
        rec["ratio_to_original034"] = rec["device_s"] / dev034
    emit(rec)
    ctx["progress"].step(label)
    return baseline


# --- sparse attention ------------------------------------------------------------------


def _many_sparse(q, kv, idx_sets, block_table, token_to_req, gate, *, flag, impl, scales):
    """N calls in sequence, one per selection set (one jitted function)."""
    import qsa_jax

    from bench.timing import sequential_calls

    return sequential_calls(lambda idx: qsa_jax.sparse_attention(
        q, kv, idx, block_table, token_to_req, gate, use_prefill_config=flag, implementation=impl, **scales),
        idx_sets)


def _check(ctx, got, ref, ref_name, exact=None):
    """The contracts of docs/spec.md §6 against the reference (the originals on a GPU, the
    float64 tiling-faithful oracle on CPU). ``exact``: (rows, exact float64 attention of those
    rows) or None. With it, ``ok`` is the accuracy contract, which holds for any tiling (the
    default route's launch table on Hopper may change the tiling); the fidelity measures
    against the reference are recorded beside it. Without it, ``ok`` is fidelity."""
    np, agreement = ctx["np"], ctx["agreement"]
    if ref is None:
        return None
    a = np.asarray(got, np.float64)
    e = np.asarray(ref, np.float64)
    if a.shape != e.shape:
        return {"ok": False, "reference": ref_name, "why": f"shape {a.shape} != {e.shape}"}
    fid = agreement.fidelity(a, e)
    res = {"ok": fid["ok"], "contract": "fidelity", "reference": ref_name, "rel_err": fid["rel_err"],
           "ulp_fraction": fid["ulp_fraction"], "nan": fid["nan"],
           "nonzero_where_reference_zero": fid["nonzero_where_zero"], "fidelity_ok": fid["ok"]}
    if exact is not None:
        rows, ex = exact
        acc = agreement.accuracy(a[rows], e[rows], ex)
        res.update(ok=acc["ok"], contract="accuracy", exact_rows=len(rows), err_exact=acc["err"],
                   err_exact_reference=acc["err_originals"], exact_ratio=acc["ratio"])
    return res


def _exact_rows(ctx, geo, kv, inp, rows, scales):
    """(rows, exact float64 attention) for up to 16 rows spread over the batch, the cache
    rows they name fetched from the pool (a multi-GB pool never comes to the host whole).
    An fp8 pool (uint8 e4m3 bytes) is read at its e4m3 values, times the scales."""
    import ml_dtypes

    np, jnp = ctx["np"], ctx["jax"].numpy
    from qsa_testing.exact import exact_attention_fetched, spread_rows

    def fetch(pages, slots):
        got = np.asarray(kv[jnp.asarray(pages), :, jnp.asarray(slots)])
        return got.view(ml_dtypes.float8_e4m3fn) if got.dtype == np.uint8 else got

    picked = spread_rows(rows)
    ex = exact_attention_fetched(
        np.asarray(inp.q), fetch, tuple(kv.shape), np.asarray(inp.idx[0]), np.asarray(inp.block_table),
        np.asarray(inp.token_to_req), np.asarray(inp.gate), rows=picked, **scales)
    return picked, ex


def run_sparse_geometry(ctx, geo, rows_list, flags_for, impls, seed, emit, *, kv_dtype="bf16"):
    np, qsa_jax, I = ctx["np"], ctx["qsa_jax"], ctx["I"]
    gpu, n_calls = ctx["gpu"], ctx["n_calls"]
    fp8 = kv_dtype == "fp8"
    if fp8:  # vLLM 0.30.0 has no fp8 path: 0.34.0 is the comparator there
        impls = [i for i in impls if i != "original"]
    if not impls:
        return
    torch = None
    if any(ctx[k] is not None for k in ("orig", "orig034", "shim")):
        import torch
    kv_t, kv = I.make_pool(geo, gpu=gpu and torch is not None, seed=seed + 17, fp8=fp8)
    scales = dict(k_scale=FP8_K_SCALE, v_scale=FP8_V_SCALE) if fp8 else {}
    where = f"{geo.name} fp8" if fp8 else geo.name
    ctx["progress"].write(f"{where}: pool {geo.pool_pages} pages x Hk {geo.num_kv_heads} x P {geo.page_size} "
                          f"x 2D {2 * geo.head_dim} {kv_dtype}; W = {geo.selection_width}")
    oracle_kv = None
    try:
        for rows in rows_list:
            inp = I.sparse_inputs(geo, rows, n_calls, seed + 1000 * rows + geo.num_query_heads)
            mean_valid = float(np.mean(inp.valid_entries))
            nbytes = I.sparse_bytes(geo, rows, mean_valid, kv_bytes=1 if fp8 else 2)
            tt = None
            if torch is not None:
                from qsa_testing.torch_interop import kv_views

                k_c, v_c = kv_views(kv_t, geo.head_dim)
                tt = dict(q=torch.from_dlpack(inp.q), gate=torch.from_dlpack(inp.gate),
                          bt=torch.from_dlpack(inp.block_table), t2r=torch.from_dlpack(inp.token_to_req),
                          idx=[torch.from_dlpack(x) for x in inp.idx], k=k_c, v=v_c,
                          scales=(FP8_K_SCALE, FP8_V_SCALE) if fp8 else ())
            for flag in flags_for(rows, geo.num_kv_heads):
                cfg = qsa_jax.select_config(rows, geo.num_kv_heads, flag, geo.selection_width,
                                            **({"is_fp8": True} if fp8 else {}))
                ref, ref_name = None, None
                if "original" not in impls and not gpu:
                    if oracle_kv is None:
                        kvn = np.asarray(kv).transpose(0, 2, 1, 3)
                        oracle_kv = (kvn[..., :geo.head_dim], kvn[..., geo.head_dim:])
                    from qsa_testing.oracle import sparse_attention_oracle

                    ref = sparse_attention_oracle(
                        np.asarray(inp.q), oracle_kv[0], oracle_kv[1], np.asarray(inp.idx[0]),
                        np.asarray(inp.block_table), np.asarray(inp.token_to_req), np.asarray(inp.gate),
                        block_n=cfg.block_n, num_tiles=cfg.num_tiles, num_splits=cfg.num_splits, **scales)
                    ref_name = "float64 oracle"
                t_pre = time.perf_counter()
                pre = _prepare_jax(ctx, impls, functools.partial(_sparse_jax_fns, ctx, kv, inp, flag, scales=scales))
                pre_s = time.perf_counter() - t_pre
                baseline = {}  # each original's (device_s, eager_s)
                exact = None
                for impl in impls:
                    rec = {"op": "sparse_attention", "geometry": where, "kv_dtype": kv_dtype, "rows": rows,
                           "use_prefill_config": flag, "impl": impl, "config": list(cfg),
                           "config_fields": list(cfg._fields), "bytes_per_call": nbytes,
                           "valid_entries_per_call": mean_valid}
                    t_rec = time.perf_counter()
                    try:
                        if impl in TORCH_IMPLS:
                            got = _sparse_torch(ctx, rec, impl, tt, flag)
                        else:
                            got = _jax_measure(ctx, rec, pre[impl], pre_s)
                        if impl in ORIGINAL_VERSIONS and ref is None:
                            ref, ref_name = got, impl
                            rec["check"] = {"ok": True, "reference": "itself"}
                        elif ref is None and gpu:
                            ref, ref_name = got, impl  # no original: first implementation is the reference
                            rec["check"] = {"ok": True, "reference": "itself (no original)"}
                        else:
                            if exact is None and ref is not None:
                                exact = _exact_rows(ctx, geo, kv, inp, rows, scales)
                            rec["check"] = _check(ctx, got, ref, ref_name, exact)
                        del got
                    except Exception as exc:
                        _record_error(rec, exc)
                    baseline = _close_record(ctx, rec, t_rec, baseline, emit,
                                             f"{geo.name} rows={rows}{' prefill' if flag else ''} {impl}")
            del inp, tt
    finally:
        del kv, kv_t
        if torch is not None:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def _rates(ctx, rec, orig_dev, orig_eager=None):
    if rec.get("eager_s") and orig_eager:
        rec["eager_ratio_to_original"] = rec["eager_s"] / orig_eager
    dev = rec.get("device_s")
    if dev:
        total = rec["bytes_per_call"]["total"]
        rec["gbps"] = total / dev / 1e9
        rec["pct_copy_bw"] = 100.0 * rec["gbps"] / ctx["copy_gbps"]
        if orig_dev:
            rec["ratio_to_original"] = dev / orig_dev


def _sparse_torch(ctx, rec, impl, tt, flag):
    import torch

    from qsa_testing.torch_interop import to_numpy

    module = {"original": ctx["orig"], "original034": ctx["orig034"], "shim": ctx["shim"]}[impl]
    fn = module.qsa_sparse_paged_attention
    out = torch.empty_like(tt["q"])
    calls = [functools.partial(fn, tt["q"], tt["k"], tt["v"], idx, tt["bt"], tt["t2r"], flag, out, *tt["scales"],
                               output_gate=tt["gate"]) for idx in tt["idx"]]
    got = _torch_measure(ctx, rec, impl, calls, to_numpy)
    # vLLM passes new q/gate activations every step (its metadata buffers persist): time
    # calls whose q, gate and indices are tensor objects never seen before (the shim's
    # import cache misses on them). Small shapes only (the clones are made up front).
    count = ctx["eager_calls"]
    if impl == "shim" and 2 * tt["q"].numel() * tt["q"].element_size() * count <= 2**30:
        fresh = [functools.partial(fn, tt["q"].clone(), tt["k"], tt["v"], tt["idx"][i % len(tt["idx"])].clone(),
                                   tt["bt"], tt["t2r"], flag, out, *tt["scales"], output_gate=tt["gate"].clone())
                 for i in range(count + 1)]
        torch.cuda.synchronize()
        timed = ctx["timing"].eager_latency_once_each(fresh, lambda _: torch.cuda.synchronize())
        rec["eager_new_tensors_s"] = timed["eager_s"]
    return got


def _sparse_jax_fns(ctx, kv, inp, flag, impl, *, scales):
    """(first call -> NumPy output, single-call closures for the eager timing, N-call jitted fn, its args,
    None or a callable giving the args at measurement time for a chained (donated) first argument)."""
    jax, qsa_jax, np = ctx["jax"], ctx["qsa_jax"], ctx["np"]

    def one(i):
        return qsa_jax.sparse_attention(inp.q, kv, inp.idx[i], inp.block_table, inp.token_to_req, inp.gate,
                                        use_prefill_config=flag, implementation=impl, **scales)

    calls = [functools.partial(one, i) for i in range(len(inp.idx))]
    many = jax.jit(functools.partial(_many_sparse, flag=flag, impl=impl, scales=scales))
    args = (inp.q, kv, tuple(inp.idx), inp.block_table, inp.token_to_req, inp.gate)
    return (lambda: np.asarray(jax.block_until_ready(one(0)))), calls, many, args, None


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


class _Prepared:
    def __init__(self, first, compiled, calls, args, live_args, n):
        self.first, self.compiled, self.calls, self.n = first, compiled, calls, n
        self.args, self.live_args = args, live_args


def _prepare_jax(ctx, impls, make):
    """Compile every JAX implementation of one case in parallel threads before anything is timed:
    its single call (run once: the output that is checked) and its N-call function.
    Returns {impl: _Prepared}; a failure surfaces when the implementation is measured."""
    from concurrent.futures import ThreadPoolExecutor

    timing = ctx["timing"]
    jax_impls = [i for i in impls if i not in TORCH_IMPLS]
    if not jax_impls:
        return {}
    out = {}
    with ThreadPoolExecutor(max_workers=2 * len(jax_impls)) as ex:
        for impl in jax_impls:
            try:
                first, calls, many, args, live_args = make(impl)
            except Exception as exc:  # noqa: BLE001 - reported with the record
                fut = ex.submit(_raise, exc)
                out[impl] = _Prepared(fut, fut, None, None, None, 0)
                continue
            out[impl] = _Prepared(ex.submit(_timed, first), ex.submit(timing.compile_jitted, many, args),
                                  calls, args, live_args, len(calls))
    return out  # the with-block waited for every compile


def _raise(exc):
    raise exc


def _jax_measure(ctx, rec, prep, pre_s):
    jax, timing = ctx["jax"], ctx["timing"]
    got, rec["first_call_s"] = prep.first.result()  # includes compiling the single call
    compiled, rec["compile_s"] = prep.compiled.result()
    rec["prepare_s"] = pre_s
    rec["compile_note"] = (f"compiled in parallel threads with the other JAX implementations of the case "
                           f"({pre_s:.1f} s for all, before anything was timed)")
    rec.update(timing.eager_latency(prep.calls, jax.block_until_ready, count=ctx["eager_calls"]))
    chain = prep.live_args is not None
    args = prep.live_args() if chain else prep.args
    dev, last = timing.jax_device_time(compiled, args, prep.n, chain=chain)
    rec.update(dev)
    if _traced(ctx, rec):
        current = (last, *args[1:]) if chain else args

        def run_once():
            nonlocal current
            out = compiled(*current)
            if chain:  # the donated cache: the next run takes this run's result
                current = (out, *current[1:])
            return out

        _record_busy(rec, run_once, prep.n, jax.block_until_ready)
    return got


# Runs of the timed unit under the profiler (``--trace-rows``).
TRACE_RUNS = 3


def _traced(ctx, rec) -> bool:
    return rec["impl"] in ("original", "original034", "pallas", "triton") and rec["rows"] <= ctx["trace_rows"]


def _record_busy(rec, run_once, calls_per_run, wait):
    from bench import kernel_trace

    summary = kernel_trace.trace_runs(run_once, runs=TRACE_RUNS, calls_per_run=calls_per_run, wait=wait)
    if summary is not None:
        rec["busy_s"] = summary.busy_us_per_call * 1e-6
        rec["busy_kernels_us"] = summary.mean_us_by_kernel
        rec["busy_median_gap_us"] = summary.median_gap_us


# --- indexer ops ---------------------------------------------------------------------


def _many_compress(sets, *, ratio, impl):
    import qsa_jax

    from bench.timing import sequential_calls

    return sequential_calls(lambda s: qsa_jax.compress_groups_with_ratio(
        *s[:8], ratio, s[8], implementation=impl), sets)


def _many_store(cache, sets, *, impl):
    import qsa_jax

    for slots, rows in sets:
        cache = qsa_jax.store_cache_rows(cache, slots, rows, implementation=impl)
    return cache


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
    import jax.numpy as jnp
    import numpy as np

    # JAX runs without x64: positions travel as int32 (they fit).
    return (jnp.asarray(case.raw_keys), jnp.asarray(case.raw_positions.astype(np.int32)),
            jnp.asarray(case.compressor_state_cache), jnp.asarray(case.compressor_state_block_table),
            jnp.asarray(case.token_to_req), jnp.asarray(case.query_start_loc),
            jnp.asarray(case.logical_positions), jnp.asarray(case.compressed_slots),
            jnp.asarray(case.rope_cache.astype(np.int32)))


def run_indexer_case(ctx, op, ring, n, impls, seed, emit):
    if not impls:
        return
    jax, I = ctx["jax"], ctx["I"]
    n_calls, gpu = ctx["n_calls"], ctx["gpu"]
    torch_needed = any(i in ("original", "shim") for i in impls)
    ratio = 4
    if op == "compress_groups_with_ratio":
        cases = I.compress_sets(seed + 7 * n + ring, n_calls, n, ring)
        nbytes = I.compress_bytes(n)
        jx = [_compress_jax_inputs(c) for c in cases]
        tx = [_compress_torch_inputs(c) for c in cases] if torch_needed else None
        ref = None
        if not gpu and "original" not in impls:
            from qsa_testing.oracle import compress_groups_oracle

            c0 = cases[0]
            ref = compress_groups_oracle(c0.raw_keys, c0.raw_positions, c0.compressor_state_cache,
                                         c0.compressor_state_block_table, c0.token_to_req,
                                         c0.query_start_loc, c0.logical_positions, c0.compressed_slots,
                                         ratio, c0.rope_cache)
            ref_name = "float64 oracle"
    else:
        cache_np, sets_np = I.store_sets(seed + 11 * n + ring, n_calls, n, ring)
        nbytes = I.store_bytes(n)
        ref = None
        if not gpu and "original" not in impls:
            from qsa_testing.oracle import store_cache_rows_oracle

            ref = store_cache_rows_oracle(cache_np, *sets_np[0])
            ref_name = "float64 oracle"
    t_pre = time.perf_counter()
    if op == "compress_groups_with_ratio":
        pre = _prepare_jax(ctx, impls, functools.partial(_compress_jax_fns, ctx, jx, ratio))
    else:
        sets_j = [(jax.numpy.asarray(a), jax.numpy.asarray(b)) for a, b in sets_np]
        pre = _prepare_jax(ctx, impls, functools.partial(_store_jax_fns, ctx, cache_np, sets_j))
    pre_s = time.perf_counter() - t_pre
    baseline = {}  # the original's (device_s, eager_s)
    for impl in impls:
        t_rec = time.perf_counter()
        rec = {"op": op, "ring": ring, "rows": n, "impl": impl, "bytes_per_call": nbytes, "geometry": f"ring{ring}"}
        try:
            if impl in TORCH_IMPLS and op == "compress_groups_with_ratio":
                got = _compress_torch(ctx, rec, impl, tx, ratio)
            elif impl in TORCH_IMPLS:
                got = _store_torch(ctx, rec, impl, cache_np, sets_np)
            else:
                got = _jax_measure(ctx, rec, pre[impl], pre_s)
                if op == "store_cache_rows":
                    rec["method"] += " (cache donated and chained through the N stores)"
            if impl == "original" or (ref is None and gpu):
                ref, ref_name = got, impl
                rec["check"] = {"ok": True, "reference": "itself"}
            else:
                rec["check"] = _check_exact(ctx, got, ref, ref_name)
        except Exception as exc:
            _record_error(rec, exc)
        baseline = _close_record(ctx, rec, t_rec, baseline, emit,
                                 f"{op.split('_')[0]} ring={ring} rows={n} {impl}")


def _check_exact(ctx, got, ref, ref_name):
    """Bit-exact comparison of (pooled, first_positions) or of the stored cache."""
    np = ctx["np"]
    if ref is None:
        return None
    got = got if isinstance(got, tuple) else (got,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    res = {"reference": ref_name}
    ok = True
    for k, (a, e) in enumerate(zip(got, ref)):
        a64, e64 = np.asarray(a, np.float64), np.asarray(e, np.float64)
        if a64.shape != e64.shape:
            a64 = a64.reshape(e64.shape) if a64.size == e64.size else a64
        same = a64.shape == e64.shape and bool(np.array_equal(a64, e64))
        res[f"exact_{k}"] = same
        if not same and a64.shape == e64.shape:
            res[f"mismatches_{k}"] = int((a64 != e64).sum())
            res[f"rel_err_{k}"] = ctx["agreement"].rel_frobenius(a64, e64)
        ok &= same
    res["ok"] = ok
    return res


def _torch_measure(ctx, rec, impl, calls, fetch):
    """First call (checked output), eager latency and device time of torch-side calls."""
    import warnings

    import torch

    timing = ctx["timing"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        got = fetch(calls[0]())
        rec["first_call_s"] = time.perf_counter() - t0
        rec.update(timing.eager_latency(calls, lambda _: torch.cuda.synchronize(), count=ctx["eager_calls"]))
        if impl in ORIGINAL_VERSIONS or ctx["shim_graph"]:
            try:
                rec.update(timing.torch_graph_time(calls))
                if _traced(ctx, rec):
                    graph = timing.torch_graph(calls)
                    _record_busy(rec, graph.replay, len(calls), lambda _: torch.cuda.synchronize())
                    del graph
            except Exception as exc:
                if impl in ORIGINAL_VERSIONS:
                    raise
                torch.cuda.synchronize()
                rec.update(timing.torch_loop_time(calls, reason=f"graph capture failed: {exc!r}"[:200]))
        else:
            rec.update(timing.torch_loop_time(
                calls, reason="the shim launches JAX work, which a torch CUDA graph cannot capture"))
    msgs = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))
    if msgs:
        rec["warnings"] = msgs[:5]
        key = (rec["op"], impl, tuple(msgs))
        if key not in ctx.setdefault("warned", set()):
            ctx["warned"].add(key)
            for m in msgs[:3]:
                ctx["progress"].write(f"    {impl} warned: {m}")
    return got


def _compress_torch(ctx, rec, impl, tx, ratio):
    from qsa_testing.torch_interop import to_numpy

    fn = ctx["orig"].qsa_compress_groups_with_ratio if impl == "original" \
        else ctx["shim"].qsa_compress_groups_with_ratio
    calls = [functools.partial(fn, *t[:8], ratio, t[8]) for t in tx]
    return _torch_measure(ctx, rec, impl, calls, lambda res: (to_numpy(res[0]), to_numpy(res[1])))


def _compress_jax_fns(ctx, jx, ratio, impl):
    jax, np, qsa_jax = ctx["jax"], ctx["np"], ctx["qsa_jax"]
    calls = [functools.partial(qsa_jax.compress_groups_with_ratio, *s[:8], ratio, s[8], implementation=impl)
             for s in jx]

    def first():
        pooled, fp = jax.block_until_ready(calls[0]())
        return np.asarray(pooled), np.asarray(fp)

    many = jax.jit(functools.partial(_many_compress, ratio=ratio, impl=impl))
    return first, calls, many, (tuple(jx),), None


def _store_torch(ctx, rec, impl, cache_np, sets_np):
    from qsa_testing.torch_interop import to_numpy, to_torch

    fn = ctx["orig"].qsa_store_cache_rows if impl == "original" else ctx["shim"].qsa_store_cache_rows
    cache = to_torch(cache_np)
    sets = [(to_torch(s), to_torch(r)) for s, r in sets_np]
    calls = [functools.partial(fn, cache, s, r) for s, r in sets]
    return _torch_measure(ctx, rec, impl, calls, lambda _: to_numpy(cache))


def _store_jax_fns(ctx, cache_np, sets, impl):
    jax, np, qsa_jax = ctx["jax"], ctx["np"], ctx["qsa_jax"]
    jnp = jax.numpy

    def first():
        return np.asarray(jax.block_until_ready(
            qsa_jax.store_cache_rows(jnp.asarray(cache_np), *sets[0], implementation=impl)))

    # Eager: the cache is donated and updated in place, as a serving loop would; the
    # timed N-call function then continues from (and donates) the eager loop's cache.
    box = [jnp.asarray(cache_np)]

    def step(i):
        box[0] = qsa_jax.store_cache_rows(box[0], *sets[i], donate=True, implementation=impl)
        return box[0]

    calls = [functools.partial(step, i) for i in range(len(sets))]
    many = jax.jit(functools.partial(_many_store, impl=impl), donate_argnums=0)
    return first, calls, many, (box[0], tuple(sets)), lambda: (box[0], tuple(sets))


if __name__ == "__main__":
    sys.exit(main())
