"""What every jax-triton implementation module shares: a safe import and the GPU check."""

from __future__ import annotations

import functools
import os

import jax


def import_jax_triton():
    """``import jax_triton``, keeping the caller's ``TRITON_CACHE_DIR``.

    jax-triton 0.3.1 sets ``TRITON_CACHE_DIR=""`` at import, after which every
    torch/Triton kernel launched in the same process (vLLM, the originals)
    fails with "Could not create or locate cache dir". jax-triton compiles
    through its own path and does not read that variable, so it is restored.
    """
    saved = os.environ.get("TRITON_CACHE_DIR")
    try:
        import jax_triton
    finally:
        if saved is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = saved
    return jax_triton


def triton_lib_functions(source: str | None = None):
    """The module-level functions of ``jax_triton/triton_lib.py`` (name -> ``ast.FunctionDef``)
    and its syntax tree, from ``source`` (default: the installed file); None when jax-triton is
    not installed. Read without importing jax-triton, which refuses to import without a GPU: the
    hooks into its private API (``_gluon_support``, ``_triton_images``) check it from this."""
    import ast
    import importlib.util

    if source is None:
        spec = importlib.util.find_spec("jax_triton")
        if spec is None or not spec.submodule_search_locations:
            return None
        with open(os.path.join(list(spec.submodule_search_locations)[0], "triton_lib.py")) as f:
            source = f.read()
    tree = ast.parse(source)
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}, tree


@functools.lru_cache(maxsize=None)
def cuda_gpu_reason() -> str | None:
    """None when JAX's default backend is an NVIDIA GPU of compute capability >= 8.0."""
    try:
        backend = jax.default_backend()
    except RuntimeError as exc:  # pragma: no cover - no backend at all
        return f"JAX has no backend ({exc})"
    if backend not in ("gpu", "cuda"):
        return f"JAX's default backend is {backend!r}, not a CUDA GPU"
    device = jax.devices()[0]
    version = str(getattr(device.client, "platform_version", "")).lower()
    if "rocm" in version or "hip" in version:
        return "JAX's GPU backend is ROCm; these kernels are built for CUDA"
    cc = getattr(device, "compute_capability", None)
    try:
        major = int(str(cc).split(".")[0])
    except ValueError:
        major = 0
    if cc is not None and major < 8:
        return f"the GPU has compute capability {cc}; bf16 tensor-core dots need >= 8.0"
    return None


def why_not(import_error: Exception | None) -> str | None:
    """None when a jax-triton module whose import raised ``import_error`` can run here."""
    if import_error is not None:
        return f"jax-triton/triton is not importable ({type(import_error).__name__}: {import_error})"
    return cuda_gpu_reason()


def load_kernels(module: str):
    """``(jax_triton, kernels module, None)``, or ``(None, None, error)`` when either cannot load.

    jax-triton is optional: the package must import without it (or without a
    working triton), and the implementation then reports why it cannot run.
    """
    try:
        import importlib

        jax_triton = import_jax_triton()
        kernels = importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken triton install
        return None, None, exc
    from qsa_jax.ops import _triton_images

    _triton_images.install()  # JAX's launches then run Triton's own machine code (that module says why)
    return jax_triton, kernels, None
