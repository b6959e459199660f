"""qsa_torch_shim: vLLM's QSA ops (``vllm/models/qwen4_exp/nvidia/ops/qsa.py``) on qsa_jax.

A drop-in replacement module: same names, signatures, checks and exception
types as vLLM 0.34.0's originals (bf16 and fp8 caches; every 0.30.0 call is
accepted too, and ``vllm_0_30`` has 0.30.0's exact surface), computing with
qsa_jax, zero-copy:

    import qsa_torch_shim as qsa          # instead of ...nvidia.ops.qsa
    qsa.qsa_sparse_paged_attention(q, k_cache, v_cache, indices, block_table,
                                   token_to_req, use_prefill_config, out,
                                   output_gate=gate)

Importing it turns off JAX's GPU memory preallocation unless the user chose an
allocator policy (``XLA_PYTHON_CLIENT_*``), so torch keeps its memory.
``install()`` swaps it in under the originals' module name, with the installed
vLLM's surface. See notes/shim.md. Layout: ``ops`` (public functions), ``_checks``
(the originals' checks), ``_call_cache`` (one lookup per repeated call), ``_eager``
(conversion, streams, in-place writes), ``_jax_side`` (the jitted calls), ``_interop`` (DLPack rules), ``_private_api``
(every private JAX/torch call), ``_torch_ops`` (torch.compile), ``_warmup``.

The sparse attention on CUDA tensors runs, by default, qsa_jax's Triton kernels launched
by Triton on torch's current stream ("triton-torch", ``_direct``): no JAX dispatch, and a
torch CUDA graph can capture it once each call signature has run once outside the capture
(as vLLM's warmup does). Everything else -- the other two ops, the sparse attention with
``implementation="jax"``/"pallas"/"triton"/"xla", layouts the direct launch cannot read --
runs JAX's executables on JAX's stream, which a torch CUDA graph cannot capture: run those
eagerly or under torch.compile without CUDA graphs.
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
from qsa_torch_shim._ffi_fence import FENCE as FENCE_PATHS
from qsa_torch_shim._private_api import PATHS as IMPORT_PATHS
from qsa_torch_shim.latency import measure_eager_latency

ORIGINAL_MODULE = "vllm.models.qwen4_exp.nvidia.ops.qsa"

__all__ = [
    "set_out_copy_max_bytes",
    "set_stream_fence",
    "set_sparse_implementation",
    "set_tiling_table",
    "ShimCopyWarning",
    "clear_import_cache",
    "FENCE_PATHS",
    "IMPORT_PATHS",
    "install",
    "installed_vllm_version",
    "measure_eager_latency",
    "qsa_compress_groups_with_ratio",
    "qsa_sparse_paged_attention",
    "qsa_store_cache_rows",
    "register_torch_ops",
    "surface_module",
    "warmup_qsa_sparse_paged_attention",
]


def register_torch_ops():
    """Register the torch.library custom ops (``qsa_shim::*``); returns their module.

    Done lazily (first torch.compile trace, or this call) to keep import cheap.
    """
    from qsa_torch_shim import _torch_ops

    return _torch_ops


def set_stream_fence(mode: str) -> None:
    """How each call is ordered after torch's current stream, from the next call on.

    "import" (the default, also ``QSA_SHIM_FENCE=import``): a fresh DLPack import per
    call (of the donated ``out``/cache, else of a one-element fence tensor).
    "ffi" (``QSA_SHIM_FENCE=ffi``): a wait on an event recorded on torch's stream,
    made by an XLA FFI custom call at the start of the jitted call; where it cannot
    be set up, the import is used and ``FENCE_PATHS.reason`` says why.
    "ffi-signal": "ffi", and calls with ``out=`` and the store end with a second
    custom call that makes torch's stream wait for XLA's, in place of the export.
    See notes/shim.md, "Session 6"."""
    from qsa_torch_shim import _ffi_fence

    _ffi_fence.set_mode(mode)


def set_out_copy_max_bytes(limit: int) -> None:
    """From the next call on, ``out=`` of at most ``limit`` bytes is written by a plain
    JAX call and a torch copy into ``out`` on the current stream; larger ones by
    donating ``out`` to the call. Either way ``out`` keeps its memory (same pointer)
    and is returned. Default 1 MiB (``QSA_SHIM_OUT_COPY_MAX_BYTES``); 0 or less: always
    donate (-1 donates empty outputs too). See notes/shim.md, "Session 7"."""
    from qsa_torch_shim import _eager

    _eager.OUT_COPY_MAX_BYTES[0] = int(limit)


def set_sparse_implementation(name: str | None) -> None:
    """The sparse attention's implementation for calls that name none, from the next call on.

    None (the default, also when ``QSA_SHIM_SPARSE_IMPLEMENTATION`` is unset): per device
    (``_eager.default_route``), "triton-torch" for CUDA tensors where Triton can launch it, else
    "jax". "triton-torch": qsa_jax's jax-triton kernels launched by Triton on torch's stream
    (``_direct``; CUDA tensors; on the H200 0.46-1.17x the originals' eager call against
    0.93-4.15x for the JAX route, bench/results/nvidia-h200_2026-12-04/session11/; capturable
    in a torch CUDA graph). "jax": the JAX route with qsa_jax's own choice of implementation;
    "pallas", "triton", "xla": that implementation through JAX. vLLM calls the installed module
    without ``implementation=``, so this (or the variable) is how it picks a route; a call's
    own ``implementation=`` still wins.
    """
    from qsa_torch_shim import _eager

    _eager.SPARSE_IMPLEMENTATION[0] = _eager.check_sparse_implementation(name, "name")


def set_tiling_table(table: str | None) -> None:
    """Which tiling table the shim's sparse attention uses from the next call on.

    None (the default): qsa_jax's choice for the device -- its measured table where one
    exists for the card (sm_90 with 132 SMs: H100 SXM, H200; faster than either vLLM
    version's), else vLLM 0.34.0's -- except that the default route, ``triton-torch``, runs a
    bf16 cache on vLLM 0.30.0's table (``_direct.BF16_DEFAULT_TABLE``: the measured bf16
    table was measured for Pallas, not for these kernels).
    "vllm-0.30" / "vllm-0.34": that version's table on any GPU, which reproduces its
    rounding (the fidelity contract) rather than only its accuracy.
    """
    from qsa_jax.config import TABLE_NAMES
    from qsa_torch_shim import _jax_side

    if table is not None and table not in TABLE_NAMES:
        raise ValueError(f"table must be None or one of {TABLE_NAMES}; got {table!r}")
    _jax_side.TILING_TABLE[0] = table


def installed_vllm_version() -> str | None:
    """The installed vLLM distribution's version, or None."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def surface_module(vllm_version: str | None):
    """The shim module whose signatures match ``vllm_version``'s ops module.

    Before 0.31 (the 0.30 line): ``qsa_torch_shim.vllm_0_30``. From 0.31 on, and
    when no vLLM is installed: this package (0.34.0's signatures; 0.31-0.32 changed
    the sparse attention too and are only known to be older than 0.34, whose
    signature accepts every call they could make).
    """
    import re

    numbers = re.match(r"(\d+)\.(\d+)", vllm_version or "")
    if numbers and (int(numbers[1]), int(numbers[2])) < (0, 31):
        from qsa_torch_shim import vllm_0_30

        return vllm_0_30
    import sys

    return sys.modules[__name__]


def install(module_name: str = ORIGINAL_MODULE, vllm_version: str | None = None):
    """Make every import of ``module_name`` (vLLM's qsa ops) yield the shim; returns the replaced
    module or None. vLLM code that imports the ops after this call runs on qsa_jax.

    The module put there has the installed vLLM's signatures and warmup summary
    (``surface_module``); ``vllm_version`` overrides the version looked up in the
    installed distributions. It goes into ``sys.modules`` and, where the parent package
    imports (vLLM installed), onto that package as its attribute: ``import a.b.qsa as m``,
    ``from a.b import qsa`` and ``a.b.qsa.f`` after ``import a.b.qsa`` read the attribute, and
    without it they fail or, once the original was imported, still give the original. Warns
    when the original had been imported already: what bound its functions before keeps them.
    If the parent package raises on import (other than ImportError), nothing is changed and the
    error propagates.
    """
    import importlib
    import sys
    import warnings

    version = vllm_version if vllm_version is not None else installed_vllm_version()
    previous = sys.modules.get(module_name)
    surface = surface_module(version)
    sys.modules[module_name] = surface
    parent_name, _, leaf = module_name.rpartition(".")
    if parent_name:
        try:  # the parent's own import sees the shim in sys.modules already
            parent = importlib.import_module(parent_name)
        except ImportError:
            parent = None  # no such package here (no vLLM): sys.modules is all there is
        except BaseException:  # the package itself fails to import: leave nothing half done
            if previous is None:
                sys.modules.pop(module_name, None)
            else:
                sys.modules[module_name] = previous
            raise
        if parent is not None:
            setattr(parent, leaf, surface)
    if previous is not None and previous is not surface and not getattr(previous, "__name__", "").startswith(
            "qsa_torch_shim"):
        warnings.warn(f"{module_name} was imported before qsa_torch_shim.install(): code that bound its "
                      "functions then keeps the originals; install before vLLM imports its ops",
                      RuntimeWarning, stacklevel=2)
    return previous
