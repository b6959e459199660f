"""Kernel-level device time from a profiler trace (CUPTI, through ``jax.profiler``).

Wall-clock timing of a jitted chain of N calls measures the device only while the
host launches faster than the kernels finish. At decode sizes a kernel runs for a
few µs, about what XLA's host side spends launching it, so the wall clock can
measure the launcher instead. The trace gives each kernel's own start and end on
the GPU: the sum of kernel durations per call is the device's busy time, free of
launch gaps, and the gaps themselves show what the launcher adds.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import statistics
import sys
import tempfile

import jax


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    start_ns: int
    duration_ns: int

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns


def gpu_kernels(run) -> list[Kernel]:
    """Every kernel the GPU ran during ``run()`` (which waits for its work), sorted by start.

    Empty without a GPU. The stream lines of the trace's GPU planes hold the
    kernels (and copies) of every library in the process, torch's included.
    """
    return sorted((k for ks in gpu_kernels_by_device(run).values() for k in ks), key=lambda k: k.start_ns)


def gpu_kernels_by_device(run) -> dict[str, list[Kernel]]:
    """``gpu_kernels`` per GPU: trace plane name (``/device:GPU:i``) -> its kernels, sorted by start."""
    with tempfile.TemporaryDirectory() as d:
        try:
            with jax.profiler.trace(d):
                run()
        except Exception as exc:  # noqa: BLE001 -- e.g. no CUPTI: report, leave the columns empty
            print(f"kernel trace failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return {}
        paths = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        if not paths:
            return {}
        data = jax.profiler.ProfileData.from_file(paths[0])
    by_device = {}
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        seen, kernels = set(), by_device.setdefault(plane.name, [])
        for line in plane.lines:
            if not line.name.startswith("Stream"):
                continue  # derived lines (XLA ops / modules) repeat the stream events
            for e in line.events:
                key = (e.name, int(e.start_ns), int(e.duration_ns))
                if key not in seen:
                    seen.add(key)
                    kernels.append(Kernel(*key))
    return {name: sorted(ks, key=lambda k: k.start_ns) for name, ks in by_device.items()}


@dataclasses.dataclass(frozen=True)
class TraceSummary:
    calls: int
    busy_us_per_call: float  # sum of kernel durations / calls
    median_gap_us: float  # between one kernel's end and the next one's start
    mean_us_by_kernel: dict  # kernel name -> mean duration (µs)

    def describe(self, top: int = 3) -> str:
        parts = sorted(self.mean_us_by_kernel.items(), key=lambda kv: -kv[1])[:top]
        return ", ".join(f"{name[:32]} {us:.1f}" for name, us in parts)


def summarize(kernels: list[Kernel], calls: int, *, only=None) -> TraceSummary | None:
    """Busy time per call of the kernels whose name contains one of ``only`` (all if None)."""
    if only is not None:
        kernels = [k for k in kernels if any(s in k.name for s in only)]
    if not kernels or not calls:
        return None
    gaps = [b.start_ns - a.end_ns for a, b in zip(kernels, kernels[1:])]
    by_name: dict[str, list[int]] = {}
    for k in kernels:
        by_name.setdefault(k.name, []).append(k.duration_ns)
    return TraceSummary(
        calls=calls,
        busy_us_per_call=sum(k.duration_ns for k in kernels) / calls / 1e3,
        median_gap_us=statistics.median(gaps) / 1e3 if gaps else 0.0,
        mean_us_by_kernel={n: statistics.fmean(d) / 1e3 for n, d in by_name.items()})


def trace_runs(run_once, *, runs: int, calls_per_run: int, wait) -> TraceSummary | None:
    """Summary of ``runs`` back-to-back ``run_once()`` (each making ``calls_per_run``
    calls) under the profiler; ``wait(last result)`` holds the trace open until the
    GPU is done. None without a GPU."""
    def run():
        out = None
        for _ in range(runs):
            out = run_once()
        wait(out)

    return summarize(gpu_kernels(run), runs * calls_per_run)
