"""One benchmark command: originals (torch + Triton) vs qsa_jax implementations vs the torch shim.

    python -m bench.run                     # full grid (GPU) or the reduced CPU mode
    python -m bench.run --quick             # a few minutes of device time
    python -m bench.run --op sparse --tp TP1 --rows 1,64 --n-calls 8

See bench/README.md for the method and the byte model. Writes results.json,
results.md and PNG plots to bench/results/<card-slug>_<date>/ (or --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import pathlib
import signal
import sys
import time

# No JAX in these two (main sets the JAX platform up before importing it).
from bench import records, report

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

METHOD = {
    "device_time": "torch: CUDA graph capturing N calls (each with its own fresh input set), replayed; "
                   "JAX: one jitted function making the N calls in sequence (optimization barriers "
                   "chain each call after the previous one), dispatched back to back, wall clock; "
                   "both divided by N. The shim (every route; its JAX route cannot be captured in a torch "
                   "graph): N eager calls launched back to back, CUDA events, divided by N; with "
                   "--shim-graph a CUDA graph where the capture succeeds",
    "busy": "GPU busy time per call from a profiler trace (CUPTI, via jax.profiler; bench.kernel_trace): "
            "the sum of the durations of every kernel the GPU ran during 3 runs of the timed unit "
            "(graph replays / executions / a shim's eager loop), divided by the calls; free of host "
            "launch gaps. Taken for the originals, pallas, triton, auto and the shims where rows <= "
            "--trace-rows; a shim's includes any kernel of its own route (a fill or copy), "
            "busy_kernels_us names each",
    "eager": "median wall time of one call from Python followed by a device synchronisation "
             "(torch.cuda.synchronize / block_until_ready), rotating through the input sets",
    "check": "first call of each case against the original (or, without one, the float64 oracle "
             "in CPU mode): relative Frobenius error <= 1e-3, no NaN, exact zeros where the "
             "reference is 0; integer outputs and caches exactly",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", help="comma list of ops: sparse, compress, store (default all)")
    p.add_argument("--tp", help="comma list of geometries: TP1,TP2,TP4 (default all)")
    p.add_argument("--rows", help="sparse-attention rows, comma list (default 1,2,4..4096; CPU 1,4,16,64)")
    p.add_argument("--indexer-rows", help="compress/store rows, comma list (default 1,4,16,64,256,512,1024,4096,8192)")
    p.add_argument("--ring", help="indexer ring sizes, comma list (default 4,8)")
    p.add_argument("--impl", help="comma list of original,original034,triton,pallas,xla,auto,shim,shim-tt,"
                                  "shim-jax (default: all that can run; on CPU: xla only, name pallas to time "
                                  "its interpreter; auto: implementation=None, the library's choice; shim: the "
                                  "shim as vLLM calls it (its default route); shim-tt / shim-jax: the shim's "
                                  "implementation='triton-torch' / 'jax', sparse attention only)")
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
    p.add_argument("--cold-l2", action="store_true",
                   help="sparse attention: give every input set of a timed unit rows of its own requests (their own "
                        "pages of the pool) and use as many sets as make the K/V one unit reads >= 4x the card's "
                        "L2 (at most 256), so that no call finds K/V an earlier call left in the L2, on later "
                        "passes of the unit either (default: N sets sharing one request per row)")
    p.add_argument("--shim-graph", action="store_true",
                   help="try to capture the shim in a CUDA graph (default: time it as an eager loop)")
    p.add_argument("--trace-rows", type=int,
                   help="also take a profiler trace (kernel busy time per call) of the originals, pallas, triton, "
                        "auto and shim cases with at most this many rows (default: 64 on a GPU, 0 = none on CPU, "
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


class Recorder:
    """Collects the results: after each, results.partial.json is rewritten (a killed run
    keeps what it measured) and a line is logged; ``finish`` writes the output files."""

    def __init__(self, run: records.RunResult, out_dir: pathlib.Path, progress: Progress):
        self.run, self.out_dir, self.progress = run, out_dir, progress
        self.partial = out_dir / "results.partial.json"
        self.results = []

    def add(self, result: records.CaseResult) -> None:
        self.results.append(result)
        self.run = dataclasses.replace(self.run, results=tuple(self.results))
        records.write_json(self.run, self.partial)
        self.progress.write(report.one_line(result))
        if result.error:
            self.progress.write("    " + result.error.strip().splitlines()[-1])
        self.progress.step(result.case.label)

    def finish(self, *, wall_s: float, interrupted: bool, plot: bool):
        self.progress.close()
        self.run = dataclasses.replace(self.run, interrupted=interrupted or None, wall_s=wall_s).with_summary()
        paths = report.write_all(self.run, self.out_dir, plot=plot)
        self.partial.unlink(missing_ok=True)
        return self.run, paths


def main(argv=None) -> int:
    args = parse_args(argv)
    _setup_jax(args)  # before JAX is imported
    from bench import inputs, machine, plan

    t_start = time.perf_counter()

    settings = plan.Settings.from_args(args, gpu=machine.jax_gpu() and not args.cpu)
    backends = plan.Backends.load(settings, machine.torch_cuda() if settings.gpu else (False, "CPU mode"))
    status = plan.implementation_status(settings, backends)
    geos = {tp: inputs.geometry(tp, cpu=not settings.gpu, pool_gb=settings.pool_gb) for tp in settings.tps}
    cases = plan.cases(settings, status, geos)
    run, out_dir = _start(args, settings, status, geos)
    progress = Progress(len(cases), not args.no_progress)
    recorder = Recorder(run, out_dir, progress)
    signal.signal(signal.SIGTERM, _interrupt)
    interrupted = False
    try:
        for result in measure_all(_context(settings, backends, geos, run, progress), cases):
            recorder.add(result)
    except KeyboardInterrupt:
        progress.write("interrupted: writing what was measured")
        interrupted = True
    finally:
        run, paths = recorder.finish(wall_s=time.perf_counter() - t_start, interrupted=interrupted,
                                     plot=not args.no_plot)
    print(f"done in {run.wall_s:.0f} s; wrote " + ", ".join(str(p) for p in paths), flush=True)
    if run.failures:
        print(f"{len(run.failures)} case(s) FAILED the check or raised: see the table", flush=True)
    # A failed check or an error is the run's verdict too (scripts and CI see it).
    return 1 if run.failures else 0


def measure_all(ctx, cases):
    """The results of ``cases`` (as ``plan.cases`` orders them), one at a time: each group of
    cases that shares inputs goes to its operator's measurement."""
    from bench import measure_indexer, measure_sparse

    def shared_inputs(c):  # sparse attention: one K/V pool; the indexer ops: one set of inputs
        return (c.op, c.kv_dtype, c.tp) if c.op == "sparse_attention" else (c.op, c.ring, c.rows)

    for _, same in itertools.groupby(cases, key=shared_inputs):
        group = list(same)
        c = group[0]
        if c.op == "sparse_attention":
            yield from measure_sparse.measure_geometry(ctx, c.tp, c.kv_dtype, group)
        else:
            yield from measure_indexer.measure_case(ctx, c.op, c.ring, c.rows, group)


def _setup_jax(args) -> None:
    if args.cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    repo = pathlib.Path(__file__).resolve().parents[1]
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _start(args, settings, status, geos):
    """The run's header record (machine, settings, method; no results yet) and the output
    folder, announced with what cannot run and why."""
    from bench import machine
    from bench.measure_sparse import FP8_K_SCALE, FP8_V_SCALE

    s = settings
    info = machine.describe(s.gpu)
    info["mode"] = s.mode
    if not s.gpu:
        info["warning"] = ("NOT a GPU measurement: CPU mode runs the JAX implementations on the host CPU "
                           "at reduced size (smaller page size, selection width, context and pool, fewer rows). "
                           "Its numbers say nothing about GPU speed.")
    repo = pathlib.Path(__file__).resolve().parents[1]
    out_dir = pathlib.Path(args.out) if args.out else report.default_out_dir(repo, info)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"qsa-jax benchmark on {info['card']} ({s.mode} mode), writing to {out_dir}", flush=True)
    if not s.gpu:
        print("*** " + info["warning"], flush=True)
    for op in s.ops:
        for name, st in status[op].items():
            if st != "available" and st != "not requested":
                print(f"  {op}: {name}: {st}", flush=True)
    copy_bw = machine.copy_bandwidth(s.gpu)
    print(f"device copy bandwidth: {copy_bw['gbps']:.0f} GB/s ({copy_bw['method']})", flush=True)
    run = records.RunResult(
        machine=info, mode=s.mode, not_a_gpu_measurement=not s.gpu, copy_bandwidth=copy_bw,
        settings={"ops": s.ops, "tps": s.tps, "kv_dtypes": s.kv_dtypes, "fp8_scales": [FP8_K_SCALE, FP8_V_SCALE],
                  "rows": s.rows, "indexer_rows": s.indexer_rows, "rings": s.rings, "n_calls": s.n_calls,
                  "eager_calls": s.eager_calls, "prefill": s.prefill, "pool_gb": s.pool_gb, "seed": s.seed,
                  "quick": s.quick, "cold_l2": s.cold_l2, "geometries": {tp: g.as_dict() for tp, g in geos.items()}},
        implementations=status, byte_model={op: BYTE_MODEL[op] for op in s.ops}, method=METHOD)
    return run, out_dir


def _context(settings, backends, geos, run, progress):
    from bench.measure import Context

    return Context(gpu=settings.gpu, n_calls=settings.n_calls, eager_calls=settings.eager_calls,
                   trace_rows=settings.trace_rows, shim_graph=settings.shim_graph, cold_l2=settings.cold_l2,
                   copy_gbps=run.copy_bandwidth["gbps"], seed=settings.seed, geometries=geos,
                   torch_modules=backends.modules, say=progress.write)


if __name__ == "__main__":
    sys.exit(main())
