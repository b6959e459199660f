"""Eager per-call latency of a shim call, as the caller sees it from Python."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def _sync(device) -> None:
    import torch

    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def measure_eager_latency(fn: Callable[[], object], *, iters: int = 200, warmup: int = 20,
                          repeats: int = 5, device=None) -> dict:
    """Time ``fn()`` back-to-back from Python (no graph capture).

    Returns ``{"per_call_us": median over repeats of (wall time of iters calls
    + one final device sync) / iters, "host_us": median host time per call
    (the Python call returns before the GPU finishes), "samples": [...]}``.
    With small inputs the per-call number is the host overhead of the call
    path (validation, DLPack imports/exports, JAX dispatch).
    """
    for _ in range(warmup):
        fn()
    _sync(device)
    per_call, host = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        t1 = time.perf_counter()
        _sync(device)
        t2 = time.perf_counter()
        host.append((t1 - t0) / iters * 1e6)
        per_call.append((t2 - t0) / iters * 1e6)
    return {"per_call_us": statistics.median(per_call), "host_us": statistics.median(host),
            "samples": per_call}
