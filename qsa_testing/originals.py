"""Load the Triton originals (vLLM's ``qsa.py``, 0.30.0 and 0.34.0) without vendoring them.

Each version's module is extracted from its PyPI wheel into a git-ignored cache
folder and imported under its own private name (``qsa_originals_vllm_0_30_0``,
``qsa_originals_vllm_0_34_0``), so both can be loaded side by side in one
process, with small stand-ins for its vLLM imports. Nothing from the files is
copied into this repository.

Resolution order for ``vllm-<version>/qsa.py``:
1. ``$QSA_ORIGINALS_DIR/vllm-<version>/qsa.py`` (used on the GPU machine, which
   has no network: carry ``.cache/originals`` and point the variable at it),
2. ``<repo>/.cache/originals/vllm-<version>/qsa.py``,
3. download the wheel with ``pip download --no-deps vllm==<version>`` and extract.

0.34.0 also asks ``vllm.platforms.current_platform`` for the device's compute
capability (its per-architecture config tables, and the fp8 dtype its warmup
compiles). The stand-in answers torch's CUDA capability, or on a machine
without CUDA ``CPU_CAPABILITY`` (None: the default, GB300-tuned table), which a
test can change with ``set_cpu_capability``.
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

VERSIONS = ("0.30.0", "0.34.0")
VLLM_VERSION = VERSIONS[0]  # the default: what the project reproduces (goldens, benchmark)
MODULE_PATH_IN_WHEEL = "vllm/models/qwen4_exp/nvidia/ops/qsa.py"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
CACHE_ROOT = REPO_ROOT / ".cache" / "originals"


class OriginalsUnavailable(RuntimeError):
    """The originals could not be obtained (no network, no triton, ...)."""


def _check_version(version: str) -> str:
    if version not in VERSIONS:
        raise ValueError(f"no originals for vLLM {version!r}; known: {', '.join(VERSIONS)}")
    return version


def module_name(version: str = VLLM_VERSION) -> str:
    return "qsa_originals_vllm_" + _check_version(version).replace(".", "_")


def originals_dir(version: str = VLLM_VERSION) -> pathlib.Path:
    """The folder that holds (or will hold) ``version``'s extracted ``qsa.py``."""
    env = os.environ.get("QSA_ORIGINALS_DIR")
    root = pathlib.Path(env) if env else CACHE_ROOT
    return root / f"vllm-{_check_version(version)}"


def ensure_extracted(version: str = VLLM_VERSION) -> pathlib.Path:
    """Return the path of ``version``'s extracted ``qsa.py``, downloading it if needed."""
    target = originals_dir(version) / "qsa.py"
    if target.exists():
        return target
    if os.environ.get("QSA_ORIGINALS_DIR"):
        raise OriginalsUnavailable(f"QSA_ORIGINALS_DIR is set but {target} does not exist")
    wheels = REPO_ROOT / ".cache" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               "-d", str(wheels), f"vllm=={version}"]
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=600)
        except (subprocess.SubprocessError, OSError) as exc:
            raise OriginalsUnavailable(
                f"could not download vllm=={version} ({exc}); set QSA_ORIGINALS_DIR to a "
                f"folder holding vllm-{version}/qsa.py") from exc
        found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
        if not found:
            raise OriginalsUnavailable("pip download produced no vllm wheel")
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[0]) as wheel:
        target.write_bytes(wheel.read(MODULE_PATH_IN_WHEEL))
    # The wheel is hundreds of MB and only one file of it is needed.
    found[0].unlink()
    return target


# --- stand-ins for the modules' vLLM imports ------------------------------------------

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


# Capability the platform stand-in reports where torch sees no CUDA device. None
# matches none of 0.34's architecture checks, so its default table answers.
CPU_CAPABILITY: tuple[int, int] | None = None


class _Platform:
    """Stand-in for ``vllm.platforms.current_platform``: the two methods 0.34 calls."""

    @staticmethod
    def get_device_capability(device_id: int = 0):
        import torch

        if torch.cuda.is_available():
            return tuple(torch.cuda.get_device_capability(device_id))
        return CPU_CAPABILITY

    def has_device_capability(self, capability, device_id: int = 0) -> bool:
        current = self.get_device_capability(device_id)
        if current is None:
            return False
        if isinstance(capability, int):  # vLLM's integer form: 89 means sm_89
            return current[0] * 10 + current[1] >= capability
        return tuple(current) >= tuple(capability)


PLATFORM = _Platform()


def set_cpu_capability(capability: tuple[int, int] | None) -> None:
    """Set what the platform stand-in reports without CUDA, and forget what every loaded
    originals module memoised from the old answer (0.34 caches its architecture checks)."""
    global CPU_CAPABILITY
    CPU_CAPABILITY = None if capability is None else tuple(capability)
    for version in VERSIONS:
        module = sys.modules.get(module_name(version))
        for value in vars(module).values() if module is not None else ():
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


def _install_stubs() -> dict[str, Any]:
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise OriginalsUnavailable(f"triton is not importable: {exc}") from exc
    saved = {}
    names = ["vllm", "vllm.triton_utils", "vllm.platforms", "vllm.model_executor",
             "vllm.model_executor.warmup",
             "vllm.model_executor.warmup.jit_warmup_triton_helper"]
    for name in names:
        saved[name] = sys.modules.get(name)
        sys.modules[name] = types.ModuleType(name)
    sys.modules["vllm.triton_utils"].triton = triton
    sys.modules["vllm.triton_utils"].tl = tl
    sys.modules["vllm.triton_utils"].HAS_TRITON = True
    sys.modules["vllm.platforms"].current_platform = PLATFORM
    helper = sys.modules["vllm.model_executor.warmup.jit_warmup_triton_helper"]
    helper.TritonWarmupTensor = _WarmupTensor
    helper.triton_scalar_specialization_rep = _scalar_specialization_rep
    return saved


def load(version: str = VLLM_VERSION) -> types.ModuleType:
    """Import ``version``'s originals module (cached). Raises ``OriginalsUnavailable``."""
    name = module_name(version)
    if name in sys.modules:
        return sys.modules[name]
    path = ensure_extracted(version)
    saved = _install_stubs()
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except OriginalsUnavailable:
        raise
    except Exception as exc:
        sys.modules.pop(name, None)
        raise OriginalsUnavailable(f"importing the vLLM {version} originals failed: {exc!r}") from exc
    finally:
        # Do not leave a fake ``vllm`` package visible to other imports (the module
        # keeps the objects it imported, e.g. the platform stand-in).
        for stub, module_before in saved.items():
            if module_before is None:
                sys.modules.pop(stub, None)
            else:
                sys.modules[stub] = module_before
    return module


def _unavailable(version: str, exc: Exception):
    """A skip that says why ``version``'s originals are missing; under CI (``CI`` set) a failure."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"vLLM {version} originals unavailable under CI: {exc}")
    pytest.skip(f"vLLM {version} originals unavailable: {exc}")


def extracted_or_skip(version: str = VLLM_VERSION) -> pathlib.Path:
    """For pytest: the path of ``version``'s extracted ``qsa.py`` (``ensure_extracted``), or
    ``load_or_skip``'s skip -- a failure under CI."""
    try:
        return ensure_extracted(version)
    except OriginalsUnavailable as exc:
        _unavailable(version, exc)


def load_or_skip(version: str = VLLM_VERSION):
    """For pytest: ``version``'s originals module, or a skip that says why not.

    Under CI (``CI`` set, as the CI runner does) a missing original is a failure, not a
    skip: the parity tests that need it (``select_config``, exception types, the
    interpreter runs) must not pass silently because a download failed."""
    try:
        return load(version)
    except OriginalsUnavailable as exc:
        _unavailable(version, exc)
