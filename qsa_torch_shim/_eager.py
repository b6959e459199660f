"""The shim's eager path: torch tensors in, JAX's jitted call (or, for the sparse attention's
"triton-torch" route, ``_direct``'s Triton launch), torch tensors out.

Conversion, stream order and in-place writes only -- the math is qsa_jax's
(``_jax_side``). Callers have validated the arguments (``_checks``); these
functions are also the bodies of the torch custom ops (``_torch_ops``).
"""

from __future__ import annotations

import collections
import os
import threading

import torch

from qsa_jax._implementations import IMPLEMENTATIONS
from qsa_jax.ops.sparse_attention import triton as _jax_triton_route
from qsa_torch_shim import _direct
from qsa_torch_shim import _ffi_fence as F
from qsa_torch_shim import _interop as I
from qsa_torch_shim import _jax_side as J
from qsa_torch_shim import _private_api as P


# --- Which route a sparse call takes -------------------------------------------------------
# The names a call (or the process default) may give: qsa_jax's implementations through JAX,
# "triton-torch" (``_direct``) and "jax" (the JAX route with qsa_jax's own choice).
JAX_ROUTE = "jax"
SPARSE_IMPLEMENTATIONS = (*IMPLEMENTATIONS, _direct.NAME, JAX_ROUTE)


def check_sparse_implementation(name, what: str = "implementation"):
    if name is not None and name not in SPARSE_IMPLEMENTATIONS:
        raise ValueError(f"{what} must be None or one of {SPARSE_IMPLEMENTATIONS}; got {name!r}")
    return name


# The process default for calls that name none (``qsa_torch_shim.set_sparse_implementation``;
# QSA_SHIM_SPARSE_IMPLEMENTATION, read at import): None = ``default_route``'s choice per device.
SPARSE_IMPLEMENTATION = [check_sparse_implementation(
    os.environ.get("QSA_SHIM_SPARSE_IMPLEMENTATION", "").strip() or None, "QSA_SHIM_SPARSE_IMPLEMENTATION")]

_DEFAULT_ROUTES: dict = {}


def default_route(device: torch.device) -> str:
    """The route of a call that names no implementation, with no process default, on
    ``device``'s tensors: "triton-torch" on CUDA where Triton can launch its kernels -- less
    host cost per call (H200, session 11: 0.46-1.17x the originals' eager call against
    0.93-4.15x for the JAX route, bench/results/nvidia-h200_2026-12-04/session11/) and a
    launch on torch's stream, which a torch CUDA graph can capture (JAX's cannot) --, else
    "jax". Decided once per device."""
    found = _DEFAULT_ROUTES.get(device)
    if found is None:
        direct = device.type == "cuda" and _direct.default_reason(device) is None
        found = _DEFAULT_ROUTES[device] = _direct.NAME if direct else JAX_ROUTE
    return found


def sparse_route(implementation, device: torch.device):
    """What ``sparse_paged_attention_impl`` takes for a call's ``implementation``: the call's
    own name, else the process default, else ``default_route``'s; "jax" becomes None (qsa_jax's
    choice)."""
    if implementation is None:
        implementation = SPARSE_IMPLEMENTATION[0] or default_route(device)
    return None if implementation == JAX_ROUTE else implementation


def _dispatch(ffi: bool, device: torch.device, call, *args, **kwargs):
    """``call(*args, **kwargs)``, a jitted call: inside the FFI wait's bookkeeping when
    that fence is active (``_ffi_fence.dispatch``), else plainly (its arguments hold
    the fresh import that orders it)."""
    if ffi:
        return F.dispatch(device, kwargs.get("ffi_signal", False), call, *args, **kwargs)
    F.FENCE.imported += 1
    return call(*args, **kwargs)


def _landed(signal: bool, result, dest: torch.Tensor) -> bool:
    """With the FFI signal: whether torch's stream already waits for the call and its
    result is ``dest``'s memory, so the export (the handshake) can be skipped."""
    return signal and F.await_signal(result) and result.unsafe_buffer_pointer() == dest.data_ptr()


def _exported(ffi: bool, result, export, *args):
    """``export(*args)`` (the torch side of ``result``); if it raises, let the FFI fence
    drop the entry of an execution that failed before its wait ran."""
    try:
        return export(*args)
    except BaseException:
        if ffi:
            F.settle_failed_call(result)
        raise


def _kv_arrays(k_cache: torch.Tensor, v_cache: torch.Tensor):
    """(JAX arrays for qsa_jax's ``kv``): the fused buffer when k/v are its views.

    Both are cached imports (``_interop.PersistentImports``): the KV cache is
    the same buffer on every call.
    """
    if I.fused_kv_shape(k_cache, v_cache) is not None and I.is_aligned(k_cache):
        return (I.PERSISTENT.get((k_cache, v_cache), k_cache,
                                 lambda: I.fused_kv_base(k_cache, v_cache)),)
    return (I.import_arg(k_cache, "k_cache"), I.import_arg(v_cache, "v_cache"))


def _write_back(result, dest: torch.Tensor, what: str) -> torch.Tensor:
    """Order torch after JAX's write into ``dest``; copy if it did not land in place."""
    alias = I.to_torch(result, dest)  # stream handshake: torch's current stream waits for JAX
    if alias.data_ptr() != dest.data_ptr():
        # JAX's CPU backend ignores donation (measured, jax 0.11.2): copy back, and say so
        # once per process there; on a GPU it would be a bug worth hearing about each time.
        global _CPU_COPY_WARNED
        if dest.is_cuda or not _CPU_COPY_WARNED:
            _CPU_COPY_WARNED = _CPU_COPY_WARNED or not dest.is_cuda
            I.warn_copy(what, "was not updated in place by JAX (buffer donation not honoured; "
                        "JAX's CPU backend never honours it)", stacklevel=4)
        dest.copy_(alias.view(dest.shape))
        COPY_SOURCES.hold(alias)  # JAX's memory, read by the copy queued on torch's stream
    return dest


_CPU_COPY_WARNED = False


# ``out=`` of at most this many bytes is written by the plain call (the route without
# ``out``) and a torch copy on the caller's stream; larger ones by donating ``out`` to
# the call (XLA writes the result into its memory). Donation costs host time on every
# call (measured on the H200, TP1 1 row: donated call 98.6 µs against 80.0 µs for the
# plain call with its fence import), a copy costs a torch launch and a device copy of
# the output (~1 µs per MiB at HBM speed). 1 MiB: TP1 up to 85 rows (12 KiB per row).
# Set with ``qsa_torch_shim.set_out_copy_max_bytes`` or QSA_SHIM_OUT_COPY_MAX_BYTES.
OUT_COPY_MAX_BYTES = [int(os.environ.get("QSA_SHIM_OUT_COPY_MAX_BYTES", 1 << 20))]


class OutRoutes:
    """How many ``out=`` calls took each route (the tests assert which one ran)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.copied = self.donated = self.signalled = 0


OUT_ROUTES = OutRoutes()


class CopySources:
    """Results of the copy route, kept alive until torch's copy out of them has run.

    A result is JAX's memory, exported to torch. Dropping it returns the memory to
    JAX's allocator, which orders its reuse only after JAX's own streams: a later JAX
    computation (from another torch stream, or not from the shim at all) could write
    there while torch's copy, queued on the caller's stream, still reads it. So each
    result is held with an event recorded after the copy on that stream, and released
    once the event has completed (polled on later copies; at most ``limit`` held, the
    oldest waited for beyond that). CPU copies are done when ``copy_`` returns.
    """

    def __init__(self, limit: int = 64):
        self.limit = limit
        self._held: collections.deque = collections.deque()
        self._spare: list = []
        self._lock = threading.Lock()

    def hold(self, source: torch.Tensor) -> None:
        if not source.is_cuda:
            return
        with self._lock:
            event = self._spare.pop() if self._spare else torch.cuda.Event()
            event.record(P.current_stream(source.get_device()))
            held = self._held
            held.append((event, source))
            while held and (len(held) > self.limit or held[0][0].query()):
                done, _ = held.popleft()
                done.synchronize()  # at once unless over the limit
                self._spare.append(done)

    def __len__(self) -> int:
        return len(self._held)


COPY_SOURCES = CopySources()


def sparse_inputs(q, k_cache, v_cache, logical_indices, block_table, token_to_req,
                  output_gate, scales):
    """The JAX arguments of the sparse call after ``out``/the fence: q, kv, the metadata,
    the gate, the scales; all cached imports (``_interop``). Also which of the tensors
    (in the order q, k, v, the three metadata, the gate) bound the validity of
    these arguments (their root objects must stay the same), or None when one was
    copied for this call (then the arguments are valid for this call only)."""
    query, q_how = I.import_query(q)
    gate, gate_how = I.import_activation(output_gate.view_as(q), "output_gate")
    args = (query, _kv_arrays(k_cache, v_cache),
            I.import_arg(logical_indices, "logical_indices", large=False),
            I.import_arg(block_table, "block_table", large=False),
            I.import_arg(token_to_req, "token_to_req", large=False),
            gate, None if scales is None else J.scale_arrays(scales, q, q.shape[-1]))
    copied = "copied" in (q_how, gate_how) or not all(
        map(I.is_importable, (logical_indices, block_table, token_to_req))) or not (
        I.is_importable(k_cache) and I.is_importable(v_cache)
        or I.fused_kv_shape(k_cache, v_cache) is not None and I.is_aligned(k_cache))
    if copied:
        return args, None
    return args, ((0,) if q_how == "owned" else ()) + (1, 2, 3, 4, 5) + (
        (6,) if gate_how == "owned" else ())


def sparse_run(args, q, use_prefill_config, out, implementation=None, table=None):
    """The sparse call on ``sparse_inputs``' arguments. The stream order comes from one
    fresh import per call (the donated ``out``, or the fence: see
    ``_interop.PersistentImports``), or from the FFI wait inside the jitted call.
    ``table``: the tiling table (None: the shim's, ``set_tiling_table``)."""
    device = q.device
    ffi = F.active(device)
    static = dict(use_prefill_config=bool(use_prefill_config), implementation=implementation,
                  table=J.TILING_TABLE[0] if table is None else table, ffi_fence=ffi)
    if out is not None and I.is_importable(out):
        signal = F.signals(device)
        # The FFI signal replaces the export only for a donated ``out``: keep that route.
        if signal or out.nbytes > OUT_COPY_MAX_BYTES[0]:
            OUT_ROUTES.donated += 1
            dest = I.to_jax(out, ordered=not ffi)
            result, _ = _dispatch(ffi, device, J.sparse_into, dest, *args, ffi_signal=signal,
                                  **static)
            if _landed(signal, result, out):
                OUT_ROUTES.signalled += 1
                return out
            return _exported(ffi, result, _write_back, result, out, "out")
        OUT_ROUTES.copied += 1
        copy_in = True
    else:
        copy_in = False
    fence = None if ffi else I.stream_fence(device)
    result, _ = _dispatch(ffi, device, J.sparse_new, fence, *args, **static)
    result = _exported(ffi, result, I.to_torch, result, q)
    if out is None:
        return result
    if not copy_in:
        I.warn_copy("out", "is not compact/aligned, so JAX cannot write into it")
    # On torch's current stream, which the export made wait for JAX's write.
    out.copy_(result)
    COPY_SOURCES.hold(result)
    return out


def capturing(device: torch.device) -> bool:
    """Whether torch's current stream on ``device`` is capturing a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def sparse_paged_attention_impl(q, k_cache, v_cache, logical_indices, block_table, token_to_req,
                                use_prefill_config, out, output_gate, implementation=None,
                                scales=None):
    """The eager sparse attention; ``scales``: (k_scale, v_scale) floats for an fp8
    cache (validated), None for bf16. ``implementation="triton-torch"``: the kernels
    launched by Triton on these tensors (``_direct``); layouts they cannot read as they lie
    take the same kernels through JAX ("triton", at the tiling table the direct launch
    uses, so both round alike), or qsa_jax's own choice where jax-triton is not installed.
    An fp8 cache below sm_89 (no e4m3 type in Triton there) takes qsa_jax's choice: XLA."""
    table = None
    if implementation == JAX_ROUTE:  # e.g. the custom op called with it directly
        implementation = None
    elif implementation == _direct.NAME:
        fp8_unreadable = scales is not None and not _direct.reads_fp8(q.device)
        result = None if fp8_unreadable else _direct.sparse(
            q, k_cache, v_cache, logical_indices, block_table, token_to_req, use_prefill_config, out,
            output_gate, scales, J.TILING_TABLE[0])
        if result is not None:
            return result
        if capturing(q.device):
            raise RuntimeError(
                "qsa_sparse_paged_attention: an fp8 cache below compute capability 8.9 needs the JAX "
                "route (XLA), and JAX's work cannot be captured in a CUDA graph" if fp8_unreadable else
                "qsa_sparse_paged_attention: these tensors' layout needs the JAX route (the Triton "
                "launch cannot read it in place), and JAX's work cannot be captured in a CUDA graph; "
                "pass the fused cache's views or compact K/V caches, compact metadata and gate, "
                "and q compact or a view on D-wide rows")
        if fp8_unreadable:
            implementation = None  # qsa_jax.config.sparse_attention_order leaves XLA there
        else:
            implementation = "triton" if _jax_triton_route.why_not() is None else None
        if implementation is not None:
            table = _direct.effective_table(J.TILING_TABLE[0], k_cache.dtype)
    gate = output_gate.view_as(q)
    if not q.shape[0]:
        return torch.empty_like(q) if out is None else out
    args, _ = sparse_inputs(q, k_cache, v_cache, logical_indices, block_table, token_to_req, gate,
                            scales)
    return sparse_run(args, q, use_prefill_config, out, implementation, table)


def store_cache_rows_impl(cache, slot_mapping, rows, implementation=None) -> None:
    if not rows.shape[0]:
        return
    slots, slot_words = I.int_words(slot_mapping.reshape(-1), "slot_mapping")
    rows_j = I.import_arg(rows, "rows")  # cached; ordered by the cache's fresh import or the FFI wait
    ffi = F.active(cache.device)
    in_place = I.is_importable(cache)
    if not in_place:
        I.warn_copy("cache", "is not compact/aligned, so JAX cannot update it in place")
    dest = cache if in_place else cache.contiguous().clone()
    dest_j = I.to_jax(dest, ordered=not ffi)
    signal = in_place and F.signals(cache.device)
    result, _ = _dispatch(ffi, cache.device, J.store_into, dest_j, slots, rows_j,
                          slots_are_words=slot_words, implementation=implementation, ffi_fence=ffi,
                          ffi_signal=signal)
    if _landed(signal, result, cache):
        return
    if in_place:
        _exported(ffi, result, _write_back, result, cache, "cache")
    else:
        source = _exported(ffi, result, I.to_torch, result, cache)
        cache.copy_(source)
        COPY_SOURCES.hold(source)  # JAX's memory, read by the copy queued on torch's stream



def _packed_ring(cache: torch.Tensor, rope: torch.Tensor):
    """(storage rows [Bs,S,1,width], rope element offset) when ``cache`` and ``rope``
    are views of one packed ring (keys then 3 int64 positions per row), else None."""
    if cache.stride(3) != 1 or rope.stride(3) != 1:
        return None
    if cache.untyped_storage().data_ptr() != rope.untyped_storage().data_ptr():
        return None
    es = cache.element_size()
    bs, s, _, dk = cache.shape
    width = cache.stride(1)
    if es not in (1, 2, 4) or width < dk or (bs > 1 and cache.stride(0) != s * width):
        return None
    if rope.stride(1) * 8 != width * es or (bs > 1 and rope.stride(0) * 8 != s * width * es):
        return None
    offset_bytes = rope.storage_offset() * 8 - cache.storage_offset() * es
    if offset_bytes < dk * es or offset_bytes % es or offset_bytes + 24 > width * es:
        return None
    try:
        base = I.alias(cache, (bs, s, 1, width), (s * width, width, width, 1))
    except RuntimeError:
        return None
    return base, offset_bytes // es


def compress_groups_impl(raw_keys, raw_positions, compressor_state_cache,
                         compressor_state_block_table, token_to_req, query_start_loc,
                         logical_positions, compressed_slots, compress_ratio, rope_cache=None,
                         implementation=None):
    rows = token_to_req.numel()
    if not rows:
        return (torch.empty((0, 1, raw_keys.shape[2]), dtype=raw_keys.dtype, device=raw_keys.device),
                torch.empty((0, 3), dtype=torch.int64, device=raw_keys.device))
    ring_layout = None
    rope_words = None
    packed = None if rope_cache is None else _packed_ring(compressor_state_cache, rope_cache)
    if packed is not None and I.is_importable(packed[0]):
        base, offset = packed
        ring = I.PERSISTENT.get((base,), compressor_state_cache, lambda: base)
        ring_layout, rope_mode = (compressor_state_cache.shape[3], offset), "packed"
    else:
        cs = compressor_state_cache
        ring = I.import_arg(cs, "compressor_state_cache")
        rope_mode = "none"
        if rope_cache is not None:
            rope_words, _ = I.int_words(rope_cache, "rope_cache")
            rope_mode = "separate"
    positions, _ = I.int_words(raw_positions, "raw_positions")
    bt, bt_w = I.int_words(compressor_state_block_table, "compressor_state_block_table")
    ttr, ttr_w = I.int_words(token_to_req.reshape(-1), "token_to_req")
    qsl, qsl_w = I.int_words(query_start_loc, "query_start_loc")
    lp, lp_w = I.int_words(logical_positions, "logical_positions")
    slots, cs_w = I.int_words(compressed_slots, "compressed_slots")
    ffi = F.active(raw_keys.device)
    fence = None if ffi else I.stream_fence(raw_keys.device)
    keys = I.import_arg(raw_keys, "raw_keys")
    (pooled, first), _ = _dispatch(
        ffi, raw_keys.device, J.compress, fence, keys, positions, ring, rope_words, bt, ttr, qsl,
        lp, slots, ring_layout=ring_layout, rope_mode=rope_mode,
        words=(bt_w, ttr_w, qsl_w, lp_w, cs_w), compress_ratio=int(compress_ratio),
        implementation=implementation, ffi_fence=ffi)
    return _exported(ffi, (pooled, first), lambda: (I.to_torch(pooled, raw_keys),
                                                   I.words_to_int64_tensor(first, raw_keys)))

