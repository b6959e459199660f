"""Timers: device time of N calls (CUDA graph replay / one jitted function) and eager latency."""

from __future__ import annotations

import statistics
import time

import jax

# A measurement repeats the N-call unit until it has run this long (at least
# MIN_REPS and at most MAX_REPS times), after one untimed warm-up run.
TARGET_S = 0.1
MIN_REPS = 3
MAX_REPS = 100


def _reps(t_one: float, target_s: float) -> int:
    if t_one <= 0:
        return MAX_REPS
    return int(min(MAX_REPS, max(MIN_REPS, round(target_s / t_one))))


def sequential_calls(fn, sets):
    """Inside a jitted function: ``fn(set_i)`` for each set, call i ordered after call i-1.

    The optimization barrier ties set i to the result of call i-1, so XLA can neither
    fuse nor overlap consecutive calls. Every result is returned: XLA removes a call
    whose result is used only by a barrier (checked on CPU: of N chained calls
    returning the last result, only the last one is compiled), so returning fewer
    would time fewer calls than it divides by.
    """
    outs, prev = [], None
    for s in sets:
        if prev is not None:
            s, prev = jax.lax.optimization_barrier((s, prev))
        prev = fn(s)
        outs.append(prev)
    return tuple(outs)


def compile_jitted(fn, args):
    """(compiled executable, seconds) of a jitted function for ``args``."""
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    return compiled, time.perf_counter() - t0


def jax_device_time(compiled, args, n_calls: int, *, chain: bool = False, target_s: float = TARGET_S):
    """Seconds per call of ``compiled(*args)``, a compiled jitted function running ``n_calls`` calls.

    Run once untimed, once timed (to size the measurement), then dispatched ``reps``
    times back to back and waited for once: the wall clock of the reps divided by
    reps * n_calls. Back-to-back dispatch hides the host's dispatch cost behind the
    device work of the previous rep. With ``chain`` the first argument is replaced
    by the result of the previous rep (a donated cache). Returns (dict, last result
    when chained).
    """
    out = compiled(*args)
    jax.block_until_ready(out)
    if chain:
        args = (out, *args[1:])
    t0 = time.perf_counter()
    out = compiled(*args)
    jax.block_until_ready(out)
    t_one = time.perf_counter() - t0
    reps = _reps(t_one, target_s)
    if chain:
        args = (out, *args[1:])
    del out
    t0 = time.perf_counter()
    for _ in range(reps):
        out = compiled(*args)
        if chain:
            args = (out, *args[1:])
    jax.block_until_ready(out)
    elapsed = time.perf_counter() - t0
    return {"device_s": elapsed / (reps * n_calls), "reps": reps,
            "method": f"one jitted function of {n_calls} calls, {reps} reps dispatched back to back, "
                      "wall clock"}, (args[0] if chain else None)


def torch_graph(calls):
    """A CUDA graph capturing ``calls`` (callables) in order, after one warm-up of each."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:  # warm-up (compiles / autotunes outside the capture)
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # "thread_local": a CUDA call another thread makes meanwhile (JAX's runtime threads live in
    # this process) does not invalidate this capture. With the default "global" mode one
    # capture of vLLM 0.34.0's calls failed with cudaErrorStreamCaptureInvalidated in an
    # H200 run whose other 44 cases captured (session 13, call g; not reproduced on purpose).
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def torch_graph_time(calls, *, target_s: float = TARGET_S) -> dict:
    """Seconds per call of a CUDA graph capturing ``calls`` (callables), replayed."""
    import torch

    n = len(calls)
    graph = torch_graph(calls)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    reps = _reps(start.elapsed_time(end) / 1e3, target_s)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    elapsed = start.elapsed_time(end) / 1e3
    del graph
    return {"device_s": elapsed / (reps * n), "reps": reps,
            "method": f"CUDA graph of {n} calls, {reps} replays, CUDA events"}


def torch_loop_time(calls, *, reason: str, target_s: float = TARGET_S) -> dict:
    """Fallback when a call cannot be captured: N calls launched back to back from Python,
    timed with CUDA events on torch's stream (includes host launch cost when it dominates)."""
    import torch

    n = len(calls)
    for c in calls:
        c()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for c in calls:
        c()
    end.record()
    torch.cuda.synchronize()
    reps = _reps(start.elapsed_time(end) / 1e3, target_s)
    start.record()
    for _ in range(reps):
        for c in calls:
            c()
    end.record()
    torch.cuda.synchronize()
    elapsed = start.elapsed_time(end) / 1e3
    return {"device_s": elapsed / (reps * n), "reps": reps,
            "method": f"eager loop of {n} calls x {reps}, CUDA events (not a graph: {reason})"}


def _call_times(calls, sync, count: int, first: int) -> list[float]:
    """Wall time of each of ``count`` calls + sync, rotating through ``calls`` from ``first``."""
    times = []
    for i in range(count):
        t0 = time.perf_counter()
        sync(calls[(first + i) % len(calls)]())
        times.append(time.perf_counter() - t0)
    return times


def eager_latency(calls, sync, *, count: int) -> dict:
    """Median wall time of one call from Python, synchronising after each (``calls`` rotate).

    Every call is made once before timing: compilation of a first use (e.g. the
    donating variant), and the steady state of caches keyed on the argument
    objects (the shim's imports), as in a serving loop that reuses its buffers.
    """
    for call in calls:
        sync(call())
    times = _call_times(calls, sync, count, first=1)
    return {"eager_s": statistics.median(times), "eager_min_s": min(times), "eager_calls": count}


def eager_latency_paired(baseline, calls, sync, *, count: int, rounds: int = 7) -> dict:
    """Eager latency of ``calls`` and of ``baseline`` (another implementation of the same case),
    timed in alternating blocks: ``rounds`` rounds, each a block of ``count`` calls + sync of one
    and then of the other (the order alternates round to round). Returns per side the median
    over the rounds of each block's median, and ``eager_paired_ratio``: the median over the
    rounds of calls / baseline within the round (the statistic a drift moves least).

    Why: separate medians taken minutes apart moved an original's 1-row eager call by up to 1.5x
    between runs (vLLM 0.30.0 at TP4: 254 against 170 us, H200, session 13 calls f and g), more
    than the difference being measured; blocks taken in turns see the same machine state.
    """
    for call in (*baseline, *calls):
        sync(call())
    medians: dict[str, list] = {"baseline": [], "calls": []}
    for r in range(rounds):
        order = (("baseline", baseline), ("calls", calls))
        for side, fns in (order if r % 2 == 0 else order[::-1]):
            medians[side].append(statistics.median(_call_times(fns, sync, count, first=0)))
    return {"eager_paired_s": statistics.median(medians["calls"]),
            "eager_paired_original_s": statistics.median(medians["baseline"]),
            "eager_paired_ratio": statistics.median(c / b for c, b in zip(medians["calls"], medians["baseline"]))}


def eager_latency_once_each(calls, sync) -> dict:
    """Median wall time of ``calls[1:]``, each made exactly once (``calls[0]`` warms up)."""
    sync(calls[0]())
    times = []
    for call in calls[1:]:
        t0 = time.perf_counter()
        sync(call())
        times.append(time.perf_counter() - t0)
    return {"eager_s": statistics.median(times), "eager_calls": len(times)}
