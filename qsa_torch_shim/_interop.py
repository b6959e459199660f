"""Moving torch tensors into JAX and results back, without copying large data.

Public APIs only: the private internals of the fast import (``to_jax``) live in
``_private_api``. Facts this relies on (jax 0.11.2, torch 2.11; docs/spec.md §8):

* ``jax.dlpack.from_dlpack`` calls ``tensor.__dlpack__(stream=<JAX's stream>)``;
  torch then records an event on its *current* stream and makes JAX's stream
  wait on it. So JAX's reads are ordered after everything torch queued on the
  current stream before the import, with no host sync.
* ``torch.from_dlpack(jax_array)`` passes torch's current stream to JAX, which
  makes that stream wait for the array's producer. Every result therefore goes
  back through ``torch.from_dlpack`` (also when the caller's own ``out`` tensor
  was written in place: the returned alias is the handshake).
* JAX imports compact tensors only. vLLM's K and V are strided views of one
  fused ``[NB, Hk, P, 2D]`` buffer: the shim recognises that exact pattern and
  imports the fused buffer whole (``fused_kv_base``).
* With x64 off, an int64 import is silently narrowed to int32. The shim never
  lets that happen: int64 tensors travel as their int32 words (``t.view(int32)``,
  zero-copy, little-endian: low word first) and are narrowed inside the jitted
  call with explicit range rules (``jax_side``).
* fp8 caches travel as they are: DLPack carries ``float8_e4m3fn`` both ways
  (checked on CPU with torch 2.11 and 2.14, jax 0.11.2) and ``uint8`` (e4m3
  bytes) is a plain byte type.
* JAX's CPU import needs 64-byte aligned data (it copies otherwise); its GPU
  import accepts anything, but XLA/Triton kernels assume aligned parameters.
  Misaligned tensors are copied (with ``ShimCopyWarning``) only in that case.
"""

from __future__ import annotations

import threading
import warnings
import weakref

import jax
import torch

from qsa_jax import StridedQuery
from qsa_torch_shim import _private_api
from qsa_torch_shim._private_api import to_jax, view_root


class ShimCopyWarning(UserWarning):
    """A large tensor had to be copied (non-compact or misaligned view, or an
    in-place write that did not land in the caller's memory)."""


def _alignment(t: torch.Tensor) -> int:
    return 16 if t.is_cuda else 64


def is_aligned(t: torch.Tensor) -> bool:
    return t.numel() == 0 or t.data_ptr() % _alignment(t) == 0


def is_importable(t: torch.Tensor) -> bool:
    """True when JAX can alias ``t`` directly (compact and aligned)."""
    return t.is_contiguous() and is_aligned(t)


def warn_copy(name: str, why: str, stacklevel: int = 4) -> None:
    warnings.warn(f"qsa_torch_shim: {name} {why}; it is copied for this call", ShimCopyWarning,
                  stacklevel=stacklevel)


def importable(t: torch.Tensor, name: str, *, large: bool = True) -> torch.Tensor:
    """``t`` itself when JAX can alias it, else a compact aligned copy.

    Copies of small metadata are silent; copies of large tensors warn.
    """
    if is_importable(t):
        return t
    if large:
        why = "is not compact" if not t.is_contiguous() else (
            f"is not {_alignment(t)}-byte aligned (data_ptr % {_alignment(t)} = "
            f"{t.data_ptr() % _alignment(t)})")
        warn_copy(name, why)
    return t.contiguous().clone() if t.is_contiguous() else t.contiguous()


def to_torch(a: jax.Array, like: torch.Tensor | None = None) -> torch.Tensor:
    """Zero-copy export; torch's current stream waits for JAX's producer.

    ``like``: a torch tensor on the array's device (the call's inputs): the export then
    takes ``_private_api``'s fast route; without it, the public ``torch.from_dlpack``."""
    if like is None:
        return torch.from_dlpack(a)
    index = like.get_device()
    return _private_api.to_torch(a, index if index >= 0 else None)


# --- int64 metadata --------------------------------------------------------------------

def int_words(t: torch.Tensor, name: str) -> tuple[jax.Array, bool]:
    """(array, is_words): int32 as is; int64 as its int32 words [..., 2*last].

    Other integer dtypes are widened to int32 (small metadata only).
    """
    if t.dtype == torch.int64:
        t = importable(t, name, large=False)
        if t.ndim == 0:
            t = t.reshape(1)
        return import_arg(t.view(torch.int32), name, large=False), True
    if t.dtype != torch.int32:
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise TypeError(f"qsa_torch_shim: {name} must be an integer tensor; got {t.dtype}")
        t = t.to(torch.int32)
    return import_arg(t, name, large=False), False


def words_to_int64_tensor(a: jax.Array, like: torch.Tensor | None = None) -> torch.Tensor:
    """JAX int32 words [..., n, 2] -> torch int64 [..., n] aliasing the same memory."""
    t = to_torch(a, like)
    return t.view(torch.int64).squeeze(-1)


# --- vLLM's fused K/V buffer -----------------------------------------------------------

def fused_kv_shape(k: torch.Tensor, v: torch.Tensor) -> tuple[tuple, tuple] | None:
    """(shape, strides) of the ``[NB, Hk, P, 2D]`` buffer that ``k, v`` are the split
    views of, or None.

    Accepted only when ``k, v == base.transpose(1, 2).split(D, -1)`` exactly:
    same storage, V starting D elements after K, the fused strides, and the
    whole fused extent inside the storage. Attribute reads only (cheap enough
    for every call); ``fused_kv_base`` builds the buffer.
    """
    if k.ndim != 4 or k.shape != v.shape or k.dtype != v.dtype or k.device != v.device:
        return None
    nb, p, hk, d = k.shape
    expected = (hk * p * 2 * d, 2 * d, p * 2 * d, 1)
    if k.stride() != expected or v.stride() != expected:
        # Size-1 dims may carry any stride; compare only where it matters.
        if not all(s == e or n == 1 for s, e, n in zip(k.stride(), expected, k.shape)):
            return None
        if not all(s == e or n == 1 for s, e, n in zip(v.stride(), expected, v.shape)):
            return None
    if v.storage_offset() != k.storage_offset() + d:
        return None
    storage = k.untyped_storage()
    if storage.data_ptr() != v.untyped_storage().data_ptr():
        return None
    if (k.storage_offset() + nb * hk * p * 2 * d) * k.element_size() > storage.nbytes():
        return None
    return (nb, hk, p, 2 * d), (hk * p * 2 * d, p * 2 * d, 2 * d, 1)


def fused_kv_base(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """The ``[NB, Hk, P, 2D]`` buffer that ``k, v`` are the split views of (a storage
    alias, see ``alias``), or None."""
    layout = fused_kv_shape(k, v)
    return None if layout is None else alias(k, *layout)


def alias(t: torch.Tensor, shape=None, stride=None) -> torch.Tensor:
    """A tensor on ``t``'s storage (same offset) that is *not* an autograd view of it.

    A view keeps a C++ reference to its ``_base``, and torch preserves the
    Python object of a referenced tensor, so caching an import of a view would
    keep the user's base tensor alive forever. This alias holds the storage only.
    """
    shape = tuple(t.shape) if shape is None else shape
    stride = t.stride() if stride is None else stride
    return torch.empty((0,), dtype=t.dtype, device=t.device).set_(
        t.untyped_storage(), t.storage_offset(), shape, stride)


# --- imports of long-lived buffers, and the per-call stream fence ------------------------

def _view_key(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device)


class BoundedEntries:
    """A lock-guarded dict of at most ``max_entries`` entries (the oldest goes first), with
    hit/miss counters: the storage of the shim's caches (this module's imports and
    ``_call_cache``'s calls), whose own classes say what an entry is and when it is valid."""

    def __init__(self, max_entries: int):
        self._entries: dict[tuple, tuple] = {}
        self._lock = threading.Lock()
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0

    def _store(self, key: tuple, entry: tuple) -> None:
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.pop(next(iter(self._entries)), None)
            self._entries[key] = entry

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class PersistentImports(BoundedEntries):
    """Cache of JAX imports of torch tensors, valid for as long as the tensor object lives.

    An import costs 20-90 µs of host time on a GPU (docs/spec.md §8), and most
    tensors a serving loop passes are the same objects every step: the KV
    cache, and the metadata buffers (or fixed slices of them). Correctness:

    * The key is the exact memory view of every tensor the import depends on
      (data pointer, shape, strides, dtype, device) plus the identity of the
      user's root tensor object (the ``_base`` of a view), so another view,
      buffer or object is a miss.
    * The cached JAX array aliases the torch memory (it imports a storage
      alias made by ``alias``, never an autograd view, which would pin the
      user's Python object forever), so torch's in-place writes are seen.
    * The entry is dropped, releasing the storage reference, when the user's
      root tensor object is garbage collected (weakref callback), or by
      ``clear()``. It never keeps memory alive longer than the user's object.
    * Stream order: a cached array's definition event is old, so it orders
      nothing. Each call therefore imports one tensor *fresh* (the donated
      ``out``/cache, or ``stream_fence``): that import makes JAX's stream wait
      for everything torch queued on its current stream, including writes into
      the cached buffers, and the jitted call waits for that import.
    """

    def __init__(self, max_entries: int = 1024):
        super().__init__(max_entries)  # entries: key -> (weakref to the root, JAX array)

    def get(self, key_tensors: tuple, owner: torch.Tensor, make) -> jax.Array:
        """The cached import of ``make()`` (an importable tensor), keyed on ``key_tensors``'
        memory views and cached for as long as ``owner``'s root tensor object lives."""
        root = view_root(owner)
        key = tuple(_view_key(t) for t in key_tensors) + (id(root),)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is root:
            self.hits += 1
            return entry[1]
        self.misses += 1
        # Without the stream handshake (8.5 µs against 20.5 µs per import on the H200):
        # a cached array's definition event orders nothing on later calls anyway, and on
        # this call the fresh fence import (or the FFI wait) that every shim call makes
        # after its argument imports covers the writes torch queued before the call.
        # ``make()`` only builds an alias: it queues no torch work the fence could miss.
        array = to_jax(make(), ordered=False)

        def _drop(_ref, key=key, entries=self._entries):
            entries.pop(key, None)

        self._store(key, (weakref.ref(root, _drop), array))
        return array


PERSISTENT = PersistentImports()


class ActivationImports(BoundedEntries):
    """Imports of per-step activations (q, the gate), keyed on the memory view alone.

    vLLM's q and gate are new tensor objects every step, usually at the same
    addresses (torch's caching allocator). ``PersistentImports`` ties an entry to
    the tensor object, so each step missed: two imports, two alias tensors, a new
    entry, the previous step's entry dropped (its arrays deleted) and a call-cache
    miss with the originals' checks -- measured on CPU about +160 µs per call, on
    the H200 +320 µs (notes/shim.md, Session 7). Here the import does not own the
    memory (``_private_api.unowned_view``), so an entry can outlive the tensor it
    was made for without pinning anything, and it is served to any tensor with the
    exact same view (data pointer, shape, strides, dtype, device). Why that is safe:

    * Not stale: the array is the memory at that address, read when a call runs;
      an entry is only used for a call whose argument covers exactly that memory and
      keeps it alive until the call returns.
    * Nothing pinned: freeing the user's tensor frees the memory at once; an evicted
      entry's deletion frees nothing.
    * Stream order: JAX's reads are ordered after torch's writes by the per-call
      fence (fresh import or FFI wait), as for every cached import; torch's later
      reuse of the memory on the current stream is ordered after JAX's reads by the
      result's export (or the FFI signal), which every call makes before it returns.
      As for torch's own kernels, a tensor used on another stream than the one it was
      allocated on needs ``record_stream`` before it is freed.
    """

    def __init__(self, max_entries: int = 64):
        super().__init__(max_entries)

    def get(self, t: torch.Tensor, shape: tuple | None = None,
            stride: tuple | None = None) -> jax.Array | None:
        """The import of the view (``shape``, ``stride``; default ``t``'s) starting at
        ``t``'s first element; None when unowned imports are unavailable."""
        shape = tuple(t.shape) if shape is None else shape
        stride = t.stride() if stride is None else stride
        key = (t.data_ptr(), shape, stride, t.dtype, t.device)
        array = self._entries.get(key)
        if array is not None:
            self.hits += 1
            return array
        view = _private_api.unowned_view(t, shape, stride)
        if view is None:
            return None
        self.misses += 1
        array = to_jax(view, ordered=False)  # ordered by the call's fence, as in PersistentImports
        self._store(key, array)
        return array


ACTIVATIONS = ActivationImports()


# Caches holding imports made here (``_call_cache``), cleared with this one.
DEPENDENT_CACHES: list = []


def clear_import_cache() -> None:
    """Forget every cached import (releases the storage references they hold)."""
    PERSISTENT.clear()
    ACTIVATIONS.clear()
    for cache in DEPENDENT_CACHES:
        cache.clear()


def import_arg(t: torch.Tensor, name: str, *, large: bool = True) -> jax.Array:
    """JAX view of ``t`` for one call: the cached import when ``t`` can be aliased,
    else a fresh import of a compact copy (with ``ShimCopyWarning`` if ``large``)."""
    if is_importable(t):
        return PERSISTENT.get((t,), t, lambda: alias(t))
    return to_jax(importable(t, name, large=large))


def strided_query_geometry(q: torch.Tensor) -> tuple[int, int, int] | None:
    """(table rows, row stride, head stride), in D-wide rows, when the [R, H, D] view
    ``q`` sits on a grid of D-wide rows of its storage; else None.

    That is vLLM's q (a column slice of the fused qkv projection, row stride
    (H + 2 Hk) * D) and any view with unit stride in D and row/head strides
    that are multiples of D. Its rows are then rows of the compact ``[N, D]``
    storage alias starting at q's first element, which JAX imports zero-copy
    and the kernels address with ``qsa_jax.StridedQuery``.
    """
    if q.ndim != 3 or not q.numel():
        return None
    rows, heads, d = q.shape
    row_stride, head_stride, unit = q.stride()
    # A size-1 dim's stride is never used: treat it as 0.
    row_stride = 0 if rows == 1 else row_stride
    head_stride = 0 if heads == 1 else head_stride
    if (unit != 1 and d > 1) or row_stride % d or head_stride % d:
        return None
    row_stride, head_stride = row_stride // d, head_stride // d
    n = (rows - 1) * row_stride + (heads - 1) * head_stride + 1
    if (q.storage_offset() + n * d) * q.element_size() > q.untyped_storage().nbytes():
        return None
    return n, row_stride, head_stride


def import_activation(t: torch.Tensor, name: str):
    """(JAX array, how) for a per-step activation: how is "unowned" (``ACTIVATIONS``:
    valid for any tensor with this memory view), "owned" (``PERSISTENT``: valid while
    ``t``'s root lives) or "copied" (a fresh compact copy: valid for this call only)."""
    if not is_importable(t):
        return import_arg(t, name), "copied"
    array = ACTIVATIONS.get(t)
    if array is not None:
        return array, "unowned"
    return import_arg(t, name), "owned"


def import_query(q: torch.Tensor):
    """(q for ``qsa_jax.sparse_attention``, how: see ``import_activation``): the import of
    a compact q, or of the storage rows a strided q lives in, as a ``StridedQuery`` (no
    copy). Anything else is copied with ``ShimCopyWarning``."""
    if is_importable(q):
        return import_activation(q, "q")
    geometry = strided_query_geometry(q)
    if geometry is None or not is_aligned(q):
        return import_arg(q, "q"), "copied"  # copies, and says why
    n, row_stride, head_stride = geometry
    d = q.shape[2]
    table = ACTIVATIONS.get(q, (n, d), (d, 1))
    how = "unowned"
    if table is None:
        table, how = PERSISTENT.get((q,), q, lambda: alias(q, (n, d), (d, 1))), "owned"
    return StridedQuery(table, q.shape[0], q.shape[1], row_stride, head_stride), how


_FENCES: dict[torch.device, torch.Tensor] = {}


def stream_fence(device: torch.device) -> jax.Array | None:
    """A fresh import of a one-element tensor: the per-call stream fence.

    Pass it to the jitted call as an argument the call keeps
    (``keep_unused=True``): PJRT starts a computation only after every
    argument's definition event, and a fresh import's definition event follows
    a wait on torch's current stream. None on CPU, where torch's writes are
    finished when the call is made.
    """
    if device.type != "cuda":
        return None
    fence = _FENCES.get(device)
    if fence is None:
        fence = _FENCES[device] = torch.zeros((1,), dtype=torch.int32, device=device)
    return to_jax(fence)
