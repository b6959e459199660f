"""Load the Triton originals (vLLM 0.30.0 ``qsa.py``) without vendoring them.

The module is extracted from the PyPI wheel into a git-ignored cache folder and
imported under a private name, with three tiny stand-ins for its vLLM imports.
Nothing from the file is copied into this repository.

Resolution order for the extracted file:
1. ``$QSA_ORIGINALS_DIR/qsa.py`` (used on the GPU machine, which has no network:
   the folder is carried there),
2. ``<repo>/.cache/originals/vllm-0.30.0/qsa.py``,
3. download the wheel with ``pip download --no-deps vllm==0.30.0`` and extract.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import subprocess
import sys
import types
import zipfile
from typing import Any

VLLM_VERSION = "0.30.0"
MODULE_PATH_IN_WHEEL = "vllm/models/qwen4_exp/nvidia/ops/qsa.py"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO_ROOT / ".cache" / "originals" / f"vllm-{VLLM_VERSION}"
_MODULE_NAME = "qsa_originals_vllm_0_30_0"


class OriginalsUnavailable(RuntimeError):
    """The originals could not be obtained (no network, no triton, ...)."""


def originals_dir() -> pathlib.Path:
    env = os.environ.get("QSA_ORIGINALS_DIR")
    return pathlib.Path(env) if env else DEFAULT_DIR


def ensure_extracted() -> pathlib.Path:
    """Return the path of the extracted ``qsa.py``, downloading it if needed."""
    target = originals_dir() / "qsa.py"
    if target.exists():
        return target
    if os.environ.get("QSA_ORIGINALS_DIR"):
        raise OriginalsUnavailable(f"QSA_ORIGINALS_DIR is set but {target} does not exist")
    wheels = REPO_ROOT / ".cache" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"vllm-{VLLM_VERSION}-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               "-d", str(wheels), f"vllm=={VLLM_VERSION}"]
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=600)
        except (subprocess.SubprocessError, OSError) as exc:
            raise OriginalsUnavailable(
                f"could not download vllm=={VLLM_VERSION} ({exc}); "
                "set QSA_ORIGINALS_DIR to a folder holding its qsa.py") from exc
        found = sorted(wheels.glob(f"vllm-{VLLM_VERSION}-*.whl"))
        if not found:
            raise OriginalsUnavailable("pip download produced no vllm wheel")
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[0]) as wheel:
        target.write_bytes(wheel.read(MODULE_PATH_IN_WHEEL))
    # The wheel is 315 MB and only one file of it is needed.
    found[0].unlink()
    return target


# --- stand-ins for the module's three vLLM imports ---------------------------------

@dataclasses.dataclass(frozen=True)
class _WarmupTensor:
    """Compile-only tensor description accepted by ``JITFunction.warmup``.

    Triton specialises pointer arguments on dtype and 16-byte alignment only,
    so a fake ``data_ptr`` is enough to drive compilation.
    """

    dtype: Any
    aligned: bool = True
    shape: tuple = (1,)
    strides: tuple | None = None
    init: Any = 0

    def data_ptr(self) -> int:
        return 16 if self.aligned else 2


def _scalar_specialization_rep(value: int) -> int:
    # Triton specialises integers as ==1, divisible by 16, or neither.
    if value == 1:
        return 1
    return 16 if value % 16 == 0 else 17


def _install_stubs() -> dict[str, Any]:
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise OriginalsUnavailable(f"triton is not importable: {exc}") from exc
    saved = {}
    names = ["vllm", "vllm.triton_utils", "vllm.model_executor",
             "vllm.model_executor.warmup",
             "vllm.model_executor.warmup.jit_warmup_triton_helper"]
    for name in names:
        saved[name] = sys.modules.get(name)
        sys.modules[name] = types.ModuleType(name)
    sys.modules["vllm.triton_utils"].triton = triton
    sys.modules["vllm.triton_utils"].tl = tl
    sys.modules["vllm.triton_utils"].HAS_TRITON = True
    helper = sys.modules["vllm.model_executor.warmup.jit_warmup_triton_helper"]
    helper.TritonWarmupTensor = _WarmupTensor
    helper.triton_scalar_specialization_rep = _scalar_specialization_rep
    return saved


def load() -> types.ModuleType:
    """Import the originals' module (cached). Raises ``OriginalsUnavailable``."""
    if _MODULE_NAME in sys.modules:
        return sys.modules[_MODULE_NAME]
    path = ensure_extracted()
    saved = _install_stubs()
    try:
        spec = importlib.util.spec_from_file_location(_MODULE_NAME, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[_MODULE_NAME] = module
        spec.loader.exec_module(module)
    except OriginalsUnavailable:
        raise
    except Exception as exc:
        sys.modules.pop(_MODULE_NAME, None)
        raise OriginalsUnavailable(f"importing the originals failed: {exc!r}") from exc
    finally:
        # Do not leave a fake ``vllm`` package visible to other imports.
        for name, module_before in saved.items():
            if module_before is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module_before
    return module


def load_or_skip():
    """For pytest: the originals' module, or a skip that says why not."""
    import pytest

    try:
        return load()
    except OriginalsUnavailable as exc:
        pytest.skip(f"vLLM {VLLM_VERSION} originals unavailable: {exc}")
