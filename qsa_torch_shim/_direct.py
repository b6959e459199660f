"""``implementation="triton-torch"``: qsa_jax's jax-triton sparse-attention kernels launched by
Triton itself on the torch tensors, on torch's current stream.

Why: the eager shim call pays JAX's dispatch (~50 µs) plus a stream-fence import (~47 µs),
together what the originals' whole call costs (H200, notes/shim.md, session 8). The same
kernels launched the way the originals launch theirs need neither: no DLPack, no fence
(the launch is on torch's stream), ``out`` written in place by the kernel.

Conversion and launch only: the problem (checks, tiling, launch knobs) is qsa_jax's
(``check_sparse_attention_args``, ``triton.launch_plan``), the score scale its
``score_scale``; both are cached per call signature. Layouts it takes: q compact or a
strided view on D-wide rows (vLLM's q), the fused cache's views or two compact caches,
compact int32 metadata and gate; a non-compact ``out`` gets the result by a torch copy
(``ShimCopyWarning``). Anything else goes to the JAX route (``None`` from ``sparse``; see
``_eager.sparse_paged_attention_impl``), which handles every layout. The launches go to
``q``'s device and its current stream. The tiling
is chosen as qsa_jax chooses it for JAX's default device (``config``), which is the torch
tensors' device in a one-GPU process, except that a bf16 cache on the default table takes
vLLM 0.30.0's (``BF16_DEFAULT_TABLE``). From the second call of a signature the kernels are
launched through their cached compiled form (``_private_api.TritonLaunch``).
"""

from __future__ import annotations

import contextlib
import functools
import os

import jax
import jax.numpy as jnp
import torch

from qsa_jax.config import FP8_MIN_CAPABILITY
from qsa_torch_shim import _interop as I
from qsa_torch_shim import _private_api as P

NAME = "triton-torch"

# The dtypes the direct launch takes (others take the JAX route); fp16 and fp32 for the gate,
# which the kernels read as fp32 whatever its dtype (the checks before keep q and K/V to theirs).
_JNP = {torch.bfloat16: jnp.bfloat16, torch.float8_e4m3fn: jnp.float8_e4m3fn, torch.uint8: jnp.uint8,
        torch.int32: jnp.int32, torch.float16: jnp.float16, torch.float32: jnp.float32}
_TORCH = {"bfloat16": torch.bfloat16, "float32": torch.float32}


class Routes:
    """How many "triton-torch" calls launched directly and how many fell back (tests)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.direct = self.fallback = 0


ROUTES = Routes()


def why_not(device: torch.device) -> str | None:
    """None when the kernels can be launched on ``device``'s tensors, else the reason."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"implementation='{NAME}' launches Triton kernels: it needs CUDA tensors (got {device})"
    try:
        _kernels()
    except ImportError as exc:
        return f"implementation='{NAME}' needs triton: {exc}"
    return None


@functools.cache
def _kernels():
    from qsa_jax.ops.sparse_attention import triton_kernels

    return triton_kernels


def default_reason(device: torch.device) -> str | None:
    """None when a call that names no implementation should launch here (``_eager.default_route``):
    ``why_not``, and an NVIDIA GPU of compute capability >= 8.0 (bf16 tensor-core dots; the
    kernels are built for CUDA, not ROCm, whose torch also calls its devices "cuda")."""
    reason = why_not(device)
    if reason is None and device.type == "cuda":
        if getattr(torch.version, "hip", None):
            reason = "torch runs on ROCm; these kernels are built for CUDA"
        elif (capability := torch.cuda.get_device_capability(device)) < (8, 0):
            reason = f"compute capability {capability} < (8, 0)"
    return reason


@functools.cache
def _reads_fp8_on(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= FP8_MIN_CAPABILITY


def reads_fp8(device: torch.device) -> bool:
    """Whether the kernels can read an fp8 cache on ``device``: Triton's e4m3 type needs
    sm_89 (vLLM 0.34.0 decodes the uint8 bytes itself below that; these kernels do not).
    Per call on the eager path: a cached answer per device index."""
    if device.type != "cuda":
        return True
    return _reads_fp8_on(torch.cuda.current_device() if device.index is None else device.index)


def _spec(t: torch.Tensor):
    return jax.ShapeDtypeStruct(tuple(t.shape), _JNP[t.dtype])


def _layout(q, k_cache, v_cache, logical_indices, block_table, token_to_req, output_gate):
    """(q spec, kv spec, K/V tensors) when the kernels can read these tensors as they lie,
    else None."""
    from qsa_jax import StridedQuery

    # Compact is enough: Triton takes any element-aligned pointer (JAX's import alignment,
    # _interop.is_aligned, does not apply here).
    meta = (logical_indices, block_table, token_to_req, output_gate)
    if any(t.dtype not in _JNP or not t.is_contiguous() for t in meta) or q.dtype not in _JNP:
        return None
    if q.is_contiguous():
        q_spec = _spec(q)
    else:
        geometry = I.strided_query_geometry(q)
        if geometry is None:
            return None
        n, row_stride, head_stride = geometry
        q_spec = StridedQuery(jax.ShapeDtypeStruct((n, q.shape[2]), _JNP[q.dtype]), q.shape[0], q.shape[1],
                              row_stride, head_stride)
    if k_cache.dtype not in _JNP:
        return None
    fused = I.fused_kv_shape(k_cache, v_cache)
    if fused is not None:
        # K's view starts at the fused buffer's first element; V is read at V_OFFSET from it.
        return q_spec, jax.ShapeDtypeStruct(fused[0], _JNP[k_cache.dtype]), (k_cache, k_cache)
    if k_cache.is_contiguous() and v_cache.is_contiguous():
        return q_spec, (_spec(k_cache), _spec(v_cache)), (k_cache, v_cache)
    return None


def _problem(q_spec, kv_spec, li, bt, tr, gate, use_prefill_config: bool, scaled: bool, table):
    from qsa_jax.ops.sparse_attention.base import check_sparse_attention_args
    from qsa_jax.ops.sparse_attention.triton import launch_plan

    problem = check_sparse_attention_args(q_spec, kv_spec, li, bt, tr, gate, use_prefill_config=use_prefill_config,
                                          config=table, scales_given=(scaled, scaled))
    return problem, (launch_plan(problem) if problem.num_rows else None)


# (problem, plan, fused) or False (the JAX route) per call signature: the tensors' shapes,
# strides and dtypes and the static arguments. Strides decide every layout question but one,
# whether K and V are views of one buffer, which each hit re-checks (attribute reads).
_SIGNATURES: dict = {}


def _signature(q, k, v, logical_indices, block_table, token_to_req, gate, prefill: bool, scaled: bool, table):
    return (prefill, scaled, table) + tuple(
        (t.shape, t.stride(), t.dtype) for t in (q, k, v, logical_indices, block_table, token_to_req, gate))


def _plan(q, k_cache, v_cache, logical_indices, block_table, token_to_req, gate, key, keep=True):
    """The signature's entry, built (and kept for the signature unless ``keep`` is False)."""
    found = _layout(q, k_cache, v_cache, logical_indices, block_table, token_to_req, gate)
    if found is None:
        entry = False
    else:
        q_spec, kv_spec, _ = found
        problem, plan = _problem(q_spec, kv_spec, _spec(logical_indices), _spec(block_table),
                                 _spec(token_to_req), _spec(gate), *key[:3])
        entry = (problem, plan, isinstance(kv_spec, jax.ShapeDtypeStruct), _launches(problem, plan))
    if keep:
        if len(_SIGNATURES) > 4096:  # shapes per batch size and layer kind, not per call
            _SIGNATURES.clear()
        _SIGNATURES[key] = entry
    return entry


_SCALES: dict = {}


def _scale_pair(head_dim: int, scales, device: torch.device) -> torch.Tensor:
    """qsa_jax's fp32 ``[score scale, output scale]`` on ``device``, cached per value (a
    model has one pair per layer). Entries are never dropped: a kernel still queued on
    some stream may read one."""
    from qsa_jax.ops.sparse_attention.base import score_scale

    key = (head_dim, scales, device)
    found = _SCALES.get(key)
    if found is None:
        values = (score_scale(head_dim, scales[0]), scales[1])
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # A host-to-device copy cannot be captured in a CUDA graph; two fills can (they
            # run again at each replay). Not cached: the fills only run when the graph does.
            pair = torch.empty((2,), dtype=torch.float32, device=device)
            pair[:1].fill_(values[0])
            pair[1:].fill_(values[1])
            return pair
        found = _SCALES[key] = torch.tensor(values, dtype=torch.float32, device=device)
    return found


# The tiling table of a bf16 cache when the shim's is the library's default (None): vLLM
# 0.30.0's. The library's measured H200 bf16 table was tuned for the Pallas kernel; the
# jax-triton kernels ran it 1.03-1.47x the faster original's kernel time at 64-2048 rows against
# 0.95-1.03x for 0.30.0's table (exceptions: TP1 8 rows and TP4 512 rows; H200, session 11,
# bench/results/nvidia-h200_2026-12-04/session11/). fp8 keeps the library's default: on a
# 132-SM Hopper its measured table, whose entries from 5 programs up were measured with these
# kernels; on a Hopper of another SM count 0.34.0's table (config.MEASURED_SM_COUNTS), where
# these kernels are 0.34.0's own launch.
BF16_DEFAULT_TABLE = "vllm-0.30"


def effective_table(table, kv_dtype):
    """The tiling table triton-torch launches for the shim's ``table`` and the cache dtype."""
    return BF16_DEFAULT_TABLE if table is None and kv_dtype == torch.bfloat16 else table


def sparse(q, k_cache, v_cache, logical_indices, block_table, token_to_req, use_prefill_config, out,
           output_gate, scales, table):
    """The call on the torch tensors (validated by the caller), or None when their layout
    needs the default route. ``scales``: the (k, v) host floats of an fp8 cache, else None."""
    reason = why_not(q.device)
    if reason is not None:
        raise NotImplementedError(reason)
    gate = output_gate.view_as(q) if output_gate.is_contiguous() else output_gate
    table = effective_table(table, k_cache.dtype)
    key = _signature(q, k_cache, v_cache, logical_indices, block_table, token_to_req, gate,
                     bool(use_prefill_config), scales is not None, table)
    entry = _SIGNATURES.get(key)
    if entry and entry[2] and I.fused_kv_shape(k_cache, v_cache) is None:
        # The same strides, but not the two halves of one buffer this time: this call only.
        entry = _plan(q, k_cache, v_cache, logical_indices, block_table, token_to_req, gate, key, keep=False)
    elif entry is None:
        entry = _plan(q, k_cache, v_cache, logical_indices, block_table, token_to_req, gate, key)
    if entry is False:
        ROUTES.fallback += 1
        return None
    problem, plan, fused, launches = entry
    k_arg, v_arg = (k_cache, k_cache) if fused else (k_cache, v_cache)
    ROUTES.direct += 1
    rows = problem.num_rows
    in_place = out is not None and out.is_contiguous()
    result = out if in_place else torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    if rows:
        # The launches go to the current device's context: q's device, entered only when it
        # is not current already (the context switch costs more than the check).
        other = q.is_cuda and q.device.index != torch.cuda.current_device()
        with torch.cuda.device(q.device) if other else _NO_DEVICE:
            _launch(plan, problem, launches, q, k_arg, v_arg, logical_indices, block_table, token_to_req, gate,
                    scales, result)
    if out is None or in_place:
        return result
    I.warn_copy("out", "is not compact, so the kernel cannot write into it", stacklevel=5)
    out.copy_(result)  # on the same stream as the launches
    return out


_NO_DEVICE = contextlib.nullcontext()


def _launches(problem, plan):
    """The (split, merge) kernels' launches for a signature (``_private_api.TritonLaunch``:
    the compiled kernel looked up once, not per call); None for an empty batch."""
    if plan is None:
        return None
    from qsa_jax.ops.sparse_attention.triton import split_kernel

    k = _kernels()
    t = None  # a tensor slot
    split = P.TritonLaunch(split_kernel(plan),
                           (t,) * 8 + plan.split_scalars + (t, t),
                           dict(plan.split_meta))
    merge = None if plan.merge_grid is None else P.TritonLaunch(
        k.sparse_attention_merge_kernel, (t, t, t, problem.num_rows, t), dict(plan.merge_meta))
    return split, merge


def _launch(plan, problem, launches, q, k_arg, v_arg, logical_indices, block_table, token_to_req, gate, scales,
            result):
    # Without scales the kernel never reads the scale slot: any tensor fills it.
    scale = _scale_pair(problem.head_dim, scales, q.device) if problem.scaled else token_to_req
    if plan.merge_grid is None:
        outputs = (result, _dummy(q.device))
    else:
        outputs = tuple(torch.empty(shape, dtype=_TORCH[dtype], device=q.device) for shape, dtype in plan.out_shapes)
    split, merge = launches
    device = q.device.index
    split.launch(plan.split_grid, (q, k_arg, v_arg, logical_indices, block_table, token_to_req, gate, scale)
                 + outputs, device)
    if merge is not None:
        merge.launch(plan.merge_grid, (outputs[0], outputs[1], gate, result), device)


_DUMMIES: dict = {}


def _dummy(device: torch.device) -> torch.Tensor:
    """The one-split launch's unused lse slot."""
    found = _DUMMIES.get(device)
    if found is None:
        found = _DUMMIES[device] = torch.empty((1,), dtype=torch.float32, device=device)
    return found
