"""Every private JAX and torch internal the shim uses, in this one module.

The shim's per-call path imports torch tensors into JAX. The public route,
``jax.dlpack.from_dlpack``, looks up the backend and device on every call,
builds a new torch stream and event per call inside ``Tensor.__dlpack__`` and
re-canonicalises the dtype; that costs more host time than the import itself
(measured on an H200: most of an import's ~37 µs). The fast route below does
the same steps once per device, through these private names (jax 0.11.2,
torch 2.11-2.14):

* ``jax._src.dlpack._DL_DEVICE_TO_PLATFORM`` and ``jax._src.xla_bridge``: the
  JAX device behind a DLPack device, and (import time only) whether JAX has
  already created its backends (``_env``);
* ``jax._src.lib._jax.dlpack_managed_tensor_to_buffer``: the import itself, and
  ``buffer_to_dlpack_managed_tensor``: the export (``to_torch``), without the
  Python of ``torch.from_dlpack`` and ``jax.Array.__dlpack__`` (device queries,
  a torch stream object per call, retries; measured on the H200: 12 µs per export);
* ``torch._C._from_dlpack``: the torch tensor of an exported capsule;
* ``torch._C._to_dlpack``: the capsule, without ``__dlpack__``'s stream work;
* ``torch._C._cuda_getCurrentRawStream``: the current stream's handle, to skip
  the stream handshake when torch and JAX already share a stream, and to record
  the FFI fence's event on it (``_ffi_fence``);
* ``Tensor._base``: the root of a view, whose lifetime bounds a cached import;
* ``torch._C._construct_storage_from_data_pointer``: a storage over memory it does
  not own (``unowned_view``), for the imports of per-step activations that must
  not keep the user's memory alive (``_interop.ActivationImports``).

If one of them moves, every import still works through the public route,
more slowly. ``PATHS`` counts which route each import and export took and keeps
the reason the fast one was refused; ``tests/test_shim_layout.py`` fails when the
public route runs on the tested stack, so an upgrade that breaks the fast
route is loud instead of a silent slowdown.
"""

from __future__ import annotations

import sys
import threading

import jax
import torch

# 64-bit dtypes keep JAX's canonicalisation (x64 off narrows them): the public route.
_WIDE = (torch.int64, torch.float64, torch.uint64, torch.complex128)
# What a changed private API raises at us.
_API_ERRORS = (ImportError, AttributeError, KeyError, TypeError)


class ImportPaths:
    """How many imports (``fast``/``public``) and exports (``export_fast``/``export_public``)
    took the fast and the public route, and why the last public one did."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.fast = self.public = 0
        self.export_fast = self.export_public = 0
        self.last_reason: str | None = None

    def _public(self, reason: str) -> None:
        self.public += 1
        self.last_reason = reason


PATHS = ImportPaths()

_IMPORTERS: dict[tuple[int, int], tuple] = {}


def _importer(t: torch.Tensor):
    """(JAX device, stream for external ready events, DLPack device type, JAX's import
    function) for ``t``'s device, looked up once per device."""
    dl_type, dev_id = t.__dlpack_device__()
    key = (int(dl_type), int(dev_id))
    found = _IMPORTERS.get(key)
    if found is None:
        from jax._src import dlpack as jax_dlpack
        from jax._src import xla_bridge
        from jax._src.lib import _jax

        platform = jax_dlpack._DL_DEVICE_TO_PLATFORM[dl_type]
        device = xla_bridge.get_backend(platform).device_from_local_hardware_id(dev_id)
        try:
            stream = device.get_stream_for_external_ready_events()
        except Exception:  # CPU: no streams
            stream = None
        found = _IMPORTERS[key] = (device, stream, int(dl_type),
                                   _jax.dlpack_managed_tensor_to_buffer)
    return found


def jax_device(t: torch.Tensor):
    """The JAX device that holds ``t``'s imports."""
    try:
        return _importer(t)[0]
    except _API_ERRORS:
        return None  # let JAX place it (its default device)


class _StreamHandshake(threading.local):
    """torch's half of the DLPack stream handshake, without ``Tensor.__dlpack__``'s
    per-call Python (device lookups, a new ExternalStream and Event each call).

    Same effect as ``t.__dlpack__(stream=jax_stream)``: an event recorded on the
    tensor's device's current torch stream, waited on by JAX's stream. The event
    object is reused (one per thread): ``cudaStreamWaitEvent`` captures the
    event's latest record at the time of the call, so a later record cannot
    change an earlier wait.
    """

    def __init__(self):
        self.events: dict[int, torch.cuda.Event] = {}
        self.external: dict[int, torch.cuda.ExternalStream] = {}
        self.streams: dict[tuple[int, int], torch.cuda.Stream] = {}

    def current_stream(self, index: int, raw: int | None = None) -> torch.cuda.Stream:
        """torch's current stream on device ``index`` (its handle ``raw`` if known), cached."""
        if raw is None:
            raw = torch._C._cuda_getCurrentRawStream(index)
        current = self.streams.get((index, raw))
        if current is None:
            current = torch.cuda.current_stream(index)
            if len(self.streams) > 64:
                self.streams.clear()
            self.streams[(index, raw)] = current
        return current

    def order_after_torch(self, t: torch.Tensor, jax_stream: int) -> None:
        index = t.get_device()
        raw = torch._C._cuda_getCurrentRawStream(index)
        if raw == jax_stream:
            return
        current = self.current_stream(index, raw)
        event = self.events.get(index)
        if event is None:
            event = self.events[index] = torch.cuda.Event()
        external = self.external.get(jax_stream)
        if external is None:
            external = self.external[jax_stream] = torch.cuda.ExternalStream(jax_stream, device=index)
        event.record(current)
        external.wait_event(event)


_HANDSHAKE = _StreamHandshake()


def to_jax(t: torch.Tensor, ordered: bool = True) -> jax.Array:
    """Zero-copy import of a compact, aligned tensor (stream handshake included).

    Same steps as ``jax.dlpack.from_dlpack`` (JAX's stream waits for torch's
    current stream), minus the per-call device lookups, the Python of
    ``Tensor.__dlpack__`` and the dtype canonicalisation, which would silently
    narrow int64 -- the shim never passes int64 here (it imports their int32
    words), so 64-bit tensors take the public route.

    ``ordered=False`` (CUDA): no handshake, and the import counts as ready at
    once. Only for a call that orders itself after torch's stream in another
    way (``_ffi_fence``: a wait inside the jitted call).
    """
    if t.dtype in _WIDE:
        PATHS._public(f"64-bit dtype {t.dtype}")
        return jax.dlpack.from_dlpack(t)
    try:
        device, stream, dl_type, to_buffer = _importer(t)
        if stream is not None and t.is_cuda and not t.requires_grad:
            if ordered:
                _HANDSHAKE.order_after_torch(t, stream)
            else:
                stream = None  # no definition event: the call's own wait orders it
            capsule = torch._C._to_dlpack(t)
        else:
            capsule = t.__dlpack__(stream=stream)
        array = to_buffer(capsule, device, stream, None, dl_type)
    except _API_ERRORS as exc:  # another jax/torch: the public route, counted
        PATHS._public(f"{type(exc).__name__}: {exc}")
        return jax.dlpack.from_dlpack(t)
    PATHS.fast += 1
    return array


def _exporter():
    """(JAX's export function, torch's capsule import), looked up once."""
    global _EXPORTER
    if _EXPORTER is None:
        from jax._src.lib import _jax

        _EXPORTER = (_jax.buffer_to_dlpack_managed_tensor, torch._C._from_dlpack,
                     torch._C._cuda_getCurrentRawStream if torch.cuda.is_available() else None)
    return _EXPORTER


_EXPORTER = None


def to_torch(a: jax.Array, cuda_index: int | None) -> torch.Tensor:
    """Zero-copy export of a single-device JAX array; on CUDA (``cuda_index``: the
    torch device index of the caller, None on CPU) torch's current stream waits for
    the array's producer.

    The same steps as ``torch.from_dlpack(a)``: JAX makes the stream handed to it wait
    for the array's definition event (the DLPack protocol's ``stream`` argument; 1
    names the legacy default stream, which torch's current stream is when its handle
    is 0), then torch wraps the capsule.
    """
    try:
        export, wrap, raw_stream = _exporter()
        stream = None
        if cuda_index is not None:
            stream = raw_stream(cuda_index) or 1
        tensor = wrap(export(a, stream=stream))
    except _API_ERRORS as exc:  # another jax/torch: the public route, counted
        PATHS.export_public += 1
        PATHS.last_reason = f"export: {type(exc).__name__}: {exc}"
        return torch.from_dlpack(a)
    PATHS.export_fast += 1
    return tensor


def current_stream(index: int) -> torch.cuda.Stream:
    """torch's current CUDA stream object on device ``index`` (cached per stream handle)."""
    try:
        return _HANDSHAKE.current_stream(index)
    except _API_ERRORS:  # another torch: the public (slower) route
        return torch.cuda.current_stream(index)


def current_raw_stream(index: int) -> int:
    """The handle of torch's current CUDA stream on device ``index``."""
    try:
        return torch._C._cuda_getCurrentRawStream(index)
    except _API_ERRORS:  # another torch: the public (slower) route
        return torch.cuda.current_stream(index).cuda_stream


def unowned_view(t: torch.Tensor, shape: tuple, stride: tuple) -> torch.Tensor | None:
    """A tensor with ``shape``/``stride`` starting at ``t``'s first element whose storage
    does not own the memory (freeing it is a no-op), or None when this torch lacks the
    internal (then the caller takes the owning route)."""
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    try:
        storage = torch._C._construct_storage_from_data_pointer(
            t.data_ptr(), t.device, span * t.element_size())
    except _API_ERRORS as exc:
        PATHS.last_reason = f"unowned view: {type(exc).__name__}: {exc}"
        return None
    return torch.empty((0,), dtype=t.dtype, device=t.device).set_(storage, 0, shape, stride)


def view_root(t: torch.Tensor) -> torch.Tensor:
    """The tensor object a view was made from (``t`` itself when it is not a view)."""
    base = t._base
    return t if base is None else base


def jax_backends_initialised() -> bool:
    """Whether JAX has created its backends (its allocator settings are then fixed)."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge

        return bool(getattr(xla_bridge, "_backends", None))
    except Exception:  # pragma: no cover - private API moved
        return False


# --- Triton's launch, for implementation="triton-torch" (qsa_torch_shim/_direct.py) --------
# ``kernel[grid](*args, **meta)`` (``JITFunction.run``) binds the arguments, computes their
# specialisation key (dtypes, pointer alignment, integer values), looks the compiled kernel
# up, then launches it as ``CompiledKernel.run(gx, gy, gz, stream, function, packed_metadata,
# launch_metadata, enter_hook, exit_hook, *every parameter's value)``. The triton-torch route
# makes the same launch for the same kernels every call of a signature, so ``TritonLaunch``
# does the first three steps once per (call signature, device, pointer alignment) and then
# only the last one. Checked against Triton 3.6 (``TRITON_FAST_VERSIONS``); any other
# version, or a launch hook set (a profiler such as Proton), takes ``kernel[grid](...)``.
TRITON_FAST_VERSIONS = ("3.6.",)


class TritonLaunches:
    """How many triton-torch launches went ``fast`` (cached compiled kernel) and how many
    through ``jit`` (``kernel[grid](...)``), and why the last jit one did."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.fast = self.jit = 0
        self.last_reason: str | None = None


TRITON_PATHS = TritonLaunches()


def _triton_fast_reason() -> str | None:
    """None when the cached launch may be used, else why not."""
    try:
        import triton
        from triton import knobs
        from triton.compiler.compiler import CompiledKernel  # noqa: F401 -- the class we launch
    except _API_ERRORS as exc:
        return f"triton internals: {type(exc).__name__}: {exc}"
    if not triton.__version__.startswith(TRITON_FAST_VERSIONS):
        return f"triton {triton.__version__} is not one the cached launch was checked against"
    _KNOBS[0] = knobs.runtime
    return _runtime_knobs_reason()


class TritonLaunch:
    """One kernel's launches for one call signature: ``launch(grid, tensors, device)``
    runs ``kernel[grid](*args, **meta)`` with the call's ``tensors`` in ``args``' None
    slots, through the cached compiled kernel once one exists for these pointers'
    alignment on this device.

    ``args``: the kernel's leading positional arguments, None where a tensor goes;
    ``meta``: its keyword constants and launch options (num_warps, num_stages)."""

    __slots__ = ("kernel", "args", "meta", "slots", "compiled")

    def __init__(self, kernel, args: tuple, meta: dict):
        self.kernel, self.args, self.meta = kernel, args, meta
        # Positional, so argument i is parameter i in the compiled launch's values too.
        self.slots = tuple(i for i, a in enumerate(args) if a is None)
        self.compiled: dict = {}  # (device index, alignment bits) -> (CompiledKernel, values)

    def launch(self, grid: tuple, tensors: tuple, device: int) -> None:
        # Triton specialises a pointer on 16-byte alignment: a kernel compiled for aligned
        # pointers must not get an unaligned one, so alignment is part of the key.
        key = (device, tuple(t.data_ptr() & 15 == 0 for t in tensors))
        cache = self.compiled  # None once this kernel's binding failed: always kernel[grid]
        found = None if cache is None else cache.get(key)
        if found is not None and _TRITON_FAST[0] is None and _runtime_knobs_reason() is None:
            compiled, values = found
            values = list(values)
            for slot, t in zip(self.slots, tensors):
                values[slot] = t
            compiled.run(grid[0], grid[1], grid[2], torch._C._cuda_getCurrentRawStream(device),
                         compiled.function, compiled.packed_metadata, None, None, None, *values)
            TRITON_PATHS.fast += 1
            return
        args = list(self.args)
        for slot, t in zip(self.slots, tensors):
            args[slot] = t
        compiled = self.kernel[grid](*args, **self.meta)
        TRITON_PATHS.jit += 1
        reason = _TRITON_FAST[0] = _triton_fast_reason()
        TRITON_PATHS.last_reason = reason
        if reason is None and found is None and cache is not None:
            try:
                cache[key] = (compiled, self._values(compiled, args))
            except _API_ERRORS as exc:  # this kernel or Triton is not what this expects
                self.compiled = None
                TRITON_PATHS.last_reason = f"binding: {type(exc).__name__}: {exc}"

    def _values(self, compiled, args: list) -> tuple:
        """Every parameter's value in the kernel's order, as ``JITFunction.run`` passes them
        to the compiled launch (launch options such as num_warps are not parameters)."""
        import inspect

        from triton.compiler.compiler import CompiledKernel

        signature = inspect.signature(self.kernel.fn)
        names = list(signature.parameters)
        bound = signature.bind(*args, **{k: v for k, v in self.meta.items() if k in names})
        bound.apply_defaults()
        if list(bound.arguments) != names:
            raise TypeError("bound arguments out of the kernel's parameter order")
        if len(self.kernel.params) != len(names):
            raise TypeError("the JITFunction's parameters differ from its function's")
        if not isinstance(compiled, CompiledKernel):  # e.g. Triton's interpreter: nothing compiled
            raise TypeError(f"kernel[grid](...) returned {type(compiled).__name__}, not a CompiledKernel")
        compiled.function, compiled.packed_metadata, compiled.run  # noqa: B018 -- what the launch reads
        values = list(bound.arguments.values())
        for slot in self.slots:
            values[slot] = None  # each call's tensors go here; the cache must not keep this call's alive
        return tuple(values)


def _hook_set(hook) -> bool:
    """Triton 3.6's hooks are ``HookChain`` objects, empty unless someone added a hook
    (older Tritons: None unless set)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _runtime_knobs_reason() -> str | None:
    """Why not, when a launch hook is set or Triton's runtime debug is on: ``JITFunction.run``
    reads both per call, which the cached launch skips. Per call on the fast path, so it
    reads the ``triton.knobs.runtime`` object ``_triton_fast_reason`` kept (no import)."""
    runtime = _KNOBS[0]
    if _hook_set(runtime.launch_enter_hook) or _hook_set(runtime.launch_exit_hook):
        return "a Triton launch hook is set"
    if runtime.debug:
        return "Triton's runtime debug is on"
    return None


# None: the cached launch may run; else the reason it may not (re-checked at each jit launch).
_TRITON_FAST: list = ["not checked yet"]
# ``triton.knobs.runtime``, set by ``_triton_fast_reason`` before any fast launch can happen.
_KNOBS: list = [None]
