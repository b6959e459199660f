"""What every Pallas implementation module shares: the import guard and launch mode."""

from __future__ import annotations

from qsa_jax.config import next_pow2  # noqa: F401 -- re-exported for the Pallas modules

try:  # Pallas is part of jax, but keep the package importable if it moves.
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    IMPORT_ERROR: Exception | None = None
except ImportError as exc:  # pragma: no cover
    pl = plgpu = None
    IMPORT_ERROR = exc


def interpret() -> bool:
    """Interpret mode everywhere but a CUDA GPU (where Pallas lowers to Triton)."""
    from qsa_jax._implementations import backend

    return backend() != "gpu"


def why_not() -> str | None:
    if IMPORT_ERROR is not None:
        return f"jax.experimental.pallas is not importable ({IMPORT_ERROR})"
    return None  # Triton lowering on GPU, the interpreter elsewhere
