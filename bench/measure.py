"""The measurement steps every operator shares: timing a JAX implementation (compiled in
parallel with the others of the case first), timing a torch-side call (the originals, the
shim), the profiler's busy time, and turning one case's implementations into records.

Imported after ``bench.run`` has set up the JAX platform (it imports JAX).
"""

from __future__ import annotations

import dataclasses
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax

from bench import kernel_trace, timing
from bench.records import AUTO, ORIGINALS, SHIMS, Case, CaseResult, Check, Rates, Timing, Workload

# Implementations called with torch tensors (everything else is called through qsa_jax).
TORCH_IMPLS = (*ORIGINALS, *SHIMS)
# Implementations whose busy time a profiler trace takes (``--trace-rows``), and the runs
# of the timed unit it traces. The shims too (session 27): their busy time puts the same
# kernels under torch's launch beside JAX's, on the same fresh input sets.
TRACED_IMPLS = (*ORIGINALS, *SHIMS, "pallas", "triton", AUTO)
TRACE_RUNS = 3


@dataclasses.dataclass(frozen=True)
class Context:
    """What every measurement of a run needs: the run's settings and the torch-side modules."""

    gpu: bool
    n_calls: int  # calls per timed unit, each with a fresh input set
    eager_calls: int
    trace_rows: int  # trace cases with at most this many rows (0: none)
    shim_graph: bool  # try a CUDA graph for the shim too
    copy_gbps: float
    seed: int
    geometries: dict  # TP name -> bench.inputs.BenchGeometry
    torch_modules: dict  # impl -> module with the originals' functions (loaded ones only)
    say: Callable[[str], None]  # a line for the log, beside the progress bar
    warned: set = dataclasses.field(default_factory=set)  # warnings already shown
    cold_l2: bool = False  # sparse attention's --cold-l2 (measure_sparse.sets_per_unit)

    def traced(self, case: Case) -> bool:
        return case.impl in TRACED_IMPLS and case.rows <= self.trace_rows


@dataclasses.dataclass
class Draft:
    """A result while its case is measured: the Timing fields taken so far (kept when a
    later step raises) and the warnings the calls gave."""

    timing: dict = dataclasses.field(default_factory=dict)
    warnings: tuple[str, ...] | None = None


def measure_impls(ctx: Context, cases: Iterable[Case], workload: Workload,
                  measure_one: Callable[[Case, Draft], Check | None]) -> Iterator[CaseResult]:
    """One result per case (the implementations of one shape, the originals first, whose
    timings are the ratios' baselines). ``measure_one`` times the case into the draft and
    returns its check; what it raises is kept in the result as its error."""
    originals: dict[str, Timing] = {}
    for case in cases:
        draft, check, error, tb = Draft(), None, None, None
        t0 = time.perf_counter()
        try:
            check = measure_one(case, draft)
        except Exception as exc:  # noqa: BLE001 - a failing case is kept in the results, flagged
            error = "".join(traceback.format_exception_only(type(exc), exc))
            tb = traceback.format_exc(limit=8)
        t = Timing(**draft.timing, wall_s=time.perf_counter() - t0)
        if case.impl in ORIGINALS:
            originals[case.impl] = t
        yield CaseResult(case, workload, t, check, Rates.of(t, workload, ctx.copy_gbps, originals),
                         error, tb, draft.warnings)


# --- JAX implementations ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class JaxCalls:
    """How one JAX implementation of a case is called.

    ``first``: the single call whose output is checked (-> NumPy); ``calls``: one closure per
    input set for the eager timing; ``many``: the jitted N-call function and ``args`` its
    arguments; ``live_args``: None, or (for a donated first argument chained through the
    runs) a callable giving the arguments at measurement time.
    """

    first: Callable[[], Any]
    calls: list
    many: Any
    args: tuple
    live_args: Callable[[], tuple] | None = None


@dataclasses.dataclass(frozen=True)
class Prepared:
    """Futures of a JAX implementation's first call and compile (or of the error making them)."""

    first: Any
    compiled: Any
    calls: JaxCalls | None


def prepare_jax(impls: Iterable[str], make: Callable[[str], JaxCalls]) -> tuple[dict[str, Prepared], float]:
    """Compile every JAX implementation of one case in parallel threads before anything is
    timed: its single call (run once: the output that is checked) and its N-call function.
    Returns ({impl: Prepared}, seconds for all); a failure surfaces when the implementation
    is measured."""
    t0 = time.perf_counter()
    jax_impls = [i for i in impls if i not in TORCH_IMPLS]
    out = {}
    if jax_impls:
        with ThreadPoolExecutor(max_workers=2 * len(jax_impls)) as ex:
            for impl in jax_impls:
                try:
                    c = make(impl)
                except Exception as exc:  # noqa: BLE001 - reported with the record
                    fut = ex.submit(_raise, exc)
                    out[impl] = Prepared(fut, fut, None)
                    continue
                out[impl] = Prepared(ex.submit(_timed, c.first), ex.submit(timing.compile_jitted, c.many, c.args), c)
        # the with-block waited for every compile
    return out, time.perf_counter() - t0


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _raise(exc):
    raise exc


def jax_measure(ctx: Context, case: Case, draft: Draft, prep: Prepared, pre_s: float):
    """First call (its output returned for the check), eager latency and device time (and
    busy time where traced) of a prepared JAX implementation."""
    t = draft.timing
    got, t["first_call_s"] = prep.first.result()  # includes compiling the single call
    compiled, t["compile_s"] = prep.compiled.result()
    t["prepare_s"] = pre_s
    t["compile_note"] = (f"compiled in parallel threads with the other JAX implementations of the case "
                         f"({pre_s:.1f} s for all, before anything was timed)")
    c = prep.calls
    t.update(timing.eager_latency(c.calls, jax.block_until_ready, count=ctx.eager_calls))
    chain = c.live_args is not None
    args = c.live_args() if chain else c.args
    dev, last = timing.jax_device_time(compiled, args, len(c.calls), chain=chain)
    t.update(dev)
    if ctx.traced(case):
        current = (last, *args[1:]) if chain else args

        def run_once():
            nonlocal current
            out = compiled(*current)
            if chain:  # the donated cache: the next run takes this run's result
                current = (out, *current[1:])
            return out

        record_busy(draft, run_once, len(c.calls), jax.block_until_ready)
    return got


def record_busy(draft: Draft, run_once, calls_per_run: int, wait) -> None:
    """GPU busy time per call from a profiler trace of TRACE_RUNS runs (nothing on CPU)."""
    summary = kernel_trace.trace_runs(run_once, runs=TRACE_RUNS, calls_per_run=calls_per_run, wait=wait)
    if summary is not None:
        draft.timing.update(busy_s=summary.busy_us_per_call * 1e-6, busy_kernels_us=summary.mean_us_by_kernel,
                            busy_median_gap_us=summary.median_gap_us)


# --- torch-side calls (the originals, the shim) -----------------------------------------


def torch_measure(ctx: Context, case: Case, draft: Draft, calls: list, fetch):
    """First call (``fetch`` of its result is returned for the check), eager latency and
    device time of torch-side calls: a CUDA graph for the originals (and the shim with
    ``--shim-graph``, falling back to an eager loop), otherwise an eager loop."""
    import torch

    t = draft.timing
    impl = case.impl

    def sync(_):
        torch.cuda.synchronize()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        got = fetch(calls[0]())
        t["first_call_s"] = time.perf_counter() - t0
        t.update(timing.eager_latency(calls, sync, count=ctx.eager_calls))
        graphed = False
        if impl in ORIGINALS or ctx.shim_graph:
            try:
                t.update(timing.torch_graph_time(calls))
                graphed = True
            except Exception as exc:
                if impl in ORIGINALS:
                    raise
                torch.cuda.synchronize()
                t.update(timing.torch_loop_time(calls, reason=f"graph capture failed: {exc!r}"[:200]))
            if graphed and ctx.traced(case):
                # Its own step: a failed trace must not turn a good graph time into a loop's.
                graph = timing.torch_graph(calls)
                record_busy(draft, graph.replay, len(calls), sync)
                del graph
        else:
            t.update(timing.torch_loop_time(
                calls, reason="the shim is timed eagerly: its JAX route cannot be captured in a torch CUDA "
                              "graph (its default CUDA route, triton-torch, could: --shim-graph tries)"))
        if impl in SHIMS and not graphed and ctx.traced(case):
            # A shim timed as an eager loop: busy time leaves the loop's launch gaps out.

            def run_once():
                for call in calls:
                    call()

            record_busy(draft, run_once, len(calls), sync)
    msgs = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))
    if msgs:
        draft.warnings = tuple(msgs[:5])
        key = (case.op, impl, tuple(msgs))
        if key not in ctx.warned:  # each distinct set of warnings once in the log
            ctx.warned.add(key)
            for m in msgs[:3]:
                ctx.say(f"    {impl} warned: {m}")
    return got
