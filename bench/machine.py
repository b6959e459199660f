"""What the benchmark runs on: card, driver, versions, and the card's device-copy bandwidth."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import pathlib
import platform
import re
import subprocess
import sys
import time

import jax
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def torch_cuda() -> tuple[bool, str]:
    """(torch can use a CUDA device, why not)."""
    try:
        import torch
    except ImportError as exc:
        return False, f"torch is not importable ({exc})"
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device"
    return True, ""


def jax_gpu() -> bool:
    return jax.default_backend() in ("gpu", "cuda")


def describe(gpu: bool) -> dict:
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "datetime_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "versions": {k: _version(k) for k in (
            "jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "torch", "triton",
            "jax-triton", "numpy", "ml-dtypes")},
        # The lent GPU machine gets the working tree with a stale .git (the session's first
        # commit, so "dirty"): QSA_GIT_COMMIT, when set, names the commit that was sent.
        "git_commit": os.environ.get("QSA_GIT_COMMIT") or _git("rev-parse", "HEAD"),
        "git_dirty": (False if os.environ.get("QSA_GIT_COMMIT")
                      else bool(_git("status", "--porcelain", "--untracked-files=no"))),
        "jax_backend": jax.default_backend(),
        "jax_devices": [str(d) for d in jax.devices()],
        "env": {k: os.environ.get(k) for k in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_FLAGS",
                                             "CUDA_VISIBLE_DEVICES") if os.environ.get(k)},
    }
    if gpu:
        dev = jax.devices()[0]
        info["card"] = getattr(dev, "device_kind", str(dev))
        from qsa_jax import config
        from qsa_jax.ops import _triton_images

        info["jax_triton_assembler"] = _triton_images.assembler_in_use()
        info["default_tiling_tables"] = config.default_table_names()
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,"
                                "clocks.max.mem", "--format=csv,noheader", "-i", "0"],
                               capture_output=True, text=True, timeout=20)
            name, driver, mem, sm, memclk = [s.strip() for s in q.stdout.strip().split(",")]
            info.update(card=name, driver=driver, memory_total=mem, max_sm_clock=sm, max_mem_clock=memclk)
        except (OSError, subprocess.SubprocessError, ValueError):
            info["driver"] = None
        ok, _ = torch_cuda()
        if ok:
            import torch

            info["torch_cuda"] = torch.version.cuda
            p = torch.cuda.get_device_properties(0)
            info["sm_count"] = p.multi_processor_count
            info["compute_capability"] = f"{p.major}.{p.minor}"
    else:
        info["card"] = f"CPU ({platform.machine()}, {os.cpu_count()} threads)"
        info["driver"] = None
    return info


def slug(card: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", card.lower()).strip("-") or "unknown"


def copy_bandwidth(gpu: bool, *, nbytes: int | None = None, reps: int = 10) -> dict:
    """Measured device-to-device copy bandwidth: (bytes read + bytes written) / time, best of ``reps``."""
    if gpu and torch_cuda()[0]:
        import torch

        nbytes = nbytes or 4 * 2**30
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
        dst = torch.empty_like(src)
        dst.copy_(src)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        del src, dst
        torch.cuda.empty_cache()
        how = f"torch copy_ of a {nbytes / 2**30:.0f} GiB buffer on the device, CUDA events, best of {reps}"
    elif gpu:
        nbytes = nbytes or 4 * 2**30
        x = jax.numpy.ones(nbytes // 4, jax.numpy.uint32)
        f = jax.jit(lambda v: v ^ 1)
        f(x).block_until_ready()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f(x).block_until_ready()
            times.append(time.perf_counter() - t0)
        del x
        how = f"jitted XOR of a {nbytes / 2**30:.0f} GiB buffer (read + write), wall clock, best of {reps}"
    else:
        nbytes = nbytes or 256 * 2**20
        src = np.ones(nbytes, np.uint8)
        dst = np.empty_like(src)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            times.append(time.perf_counter() - t0)
        how = f"NumPy copy of {nbytes / 2**20:.0f} MiB in host memory (CPU mode), best of {reps}"
    best = min(times)
    return {"bytes_per_copy": 2 * nbytes, "seconds": best, "gbps": 2 * nbytes / best / 1e9, "method": how}
