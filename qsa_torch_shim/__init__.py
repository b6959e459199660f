"""qsa_torch_shim: vLLM's QSA ops (``vllm/models/qwen4_exp/nvidia/ops/qsa.py``) on qsa_jax.

A drop-in replacement module: same names, signatures, checks and exception
types as vLLM 0.30.0's originals, computing with qsa_jax, zero-copy:

    import qsa_torch_shim as qsa          # instead of ...nvidia.ops.qsa
    qsa.qsa_sparse_paged_attention(q, k_cache, v_cache, indices, block_table,
                                   token_to_req, use_prefill_config, out,
                                   output_gate=gate)

Importing it turns off JAX's GPU memory preallocation unless the user chose an
allocator policy (``XLA_PYTHON_CLIENT_*``), so torch keeps its memory.
``install()`` swaps it in under the originals' module name. See notes/shim.md.

JAX's kernels cannot be captured in a torch CUDA graph: run these ops eagerly
or under torch.compile without CUDA graphs.
"""

from qsa_torch_shim import _env  # noqa: F401  (must run before jax initialises)
from qsa_torch_shim._interop import ShimCopyWarning, clear_import_cache
from qsa_torch_shim.ops import (
    _select_config,
    qsa_compress_groups_with_ratio,
    qsa_sparse_paged_attention,
    qsa_store_cache_rows,
    warmup_qsa_sparse_paged_attention,
    warmup_rows,
)
from qsa_torch_shim._private_api import PATHS as IMPORT_PATHS
from qsa_torch_shim.latency import measure_eager_latency

ORIGINAL_MODULE = "vllm.models.qwen4_exp.nvidia.ops.qsa"

__all__ = [
    "ShimCopyWarning",
    "clear_import_cache",
    "install",
    "measure_eager_latency",
    "qsa_compress_groups_with_ratio",
    "qsa_sparse_paged_attention",
    "qsa_store_cache_rows",
    "register_torch_ops",
    "warmup_qsa_sparse_paged_attention",
]


def register_torch_ops():
    """Register the torch.library custom ops (``qsa_shim::*``); returns their module.

    Done lazily (first torch.compile trace, or this call) to keep import cheap.
    """
    from qsa_torch_shim import _torch_ops

    return _torch_ops


def install(module_name: str = ORIGINAL_MODULE):
    """Make ``import <module_name>`` (vLLM's qsa ops) yield this shim; returns the replaced
    module or None. vLLM code that imports the ops after this call runs on qsa_jax."""
    import sys

    previous = sys.modules.get(module_name)
    sys.modules[module_name] = sys.modules[__name__]
    return previous
