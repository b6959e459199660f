"""Process environment the shim needs before JAX initialises its backends.

JAX preallocates 75% of GPU memory on first use by default, which would starve
torch (vLLM sizes its KV cache from the memory it can still get). Unless the
user chose an allocator policy, turn preallocation off. This must run before
``jax`` creates its GPU client, so ``qsa_torch_shim/__init__.py`` imports this
module first.
"""

from __future__ import annotations

import os
import sys
import warnings

_ALLOCATOR_VARS = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                   "XLA_PYTHON_CLIENT_ALLOCATOR")


def _jax_backends_initialised() -> bool:
    if "jax" not in sys.modules:  # checked before the import below brings jax in
        return False
    from qsa_torch_shim._private_api import jax_backends_initialised

    return jax_backends_initialised()


def configure_allocator() -> None:
    if any(v in os.environ for v in _ALLOCATOR_VARS):
        return  # the user decided
    if _jax_backends_initialised():
        warnings.warn(
            "qsa_torch_shim was imported after JAX initialised its backends; JAX may already "
            "hold most of the GPU memory. Import qsa_torch_shim (or set "
            "XLA_PYTHON_CLIENT_PREALLOCATE=false) before JAX's first use.", RuntimeWarning,
            stacklevel=3)
        return
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"


configure_allocator()
