"""Shared pytest setup.

JAX must not grab 75% of GPU memory before torch (the originals) allocates:
set the allocator before anything imports jax.
"""

import os
import pathlib
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402


def _has_gpu() -> tuple[bool, str]:
    try:
        import jax

        if not any(d.platform == "gpu" for d in jax.devices()):
            return False, "JAX sees no GPU"
    except RuntimeError as exc:
        return False, f"JAX has no GPU backend ({exc})"
    try:
        import torch

        if not torch.cuda.is_available():
            return False, "torch sees no CUDA device"
    except ImportError:
        return False, "torch is not installed"
    return True, ""


def pytest_collection_modifyitems(config, items):
    has_gpu, why = _has_gpu()
    if has_gpu:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _sm_count_unknown_off_gpu_tests(request, monkeypatch):
    """Tests not marked gpu that pretend to be on a Hopper (``device_capability`` patched to
    (9, 0)) mean the card the measured table was measured on: the real SM count of whatever
    GPU runs them (an A100's 108, say) must not take the measured table away. Unknown (None)
    is what a CPU run has; tests of the SM gate patch ``device_sm_count`` themselves."""
    if "gpu" in request.keywords:
        return
    from qsa_jax import config

    monkeypatch.setattr(config, "device_sm_count", lambda: None)
