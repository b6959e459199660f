"""torch -> XLA stream order through an XLA FFI custom call, with no compiled extension.

The per-call alternative to the fence import (``_interop.stream_fence`` and the
fresh import of a donated ``out``/cache): each jitted call of the shim starts
with a custom call (``TARGET``) whose handler makes XLA's stream wait on a CUDA
event that the shim recorded on torch's current stream just before the call.

* No compiler: the handler is a ``ctypes.CFUNCTYPE`` function implementing the
  C signature of an XLA FFI handler, ``XLA_FFI_Error* (XLA_FFI_CallFrame*)``,
  registered with ``jax.ffi.register_ffi_target`` (typed FFI, api_version=1).
  The structures below follow jaxlib's shipped header
  (``jax.ffi.include_dir()/xla/ffi/api/c_api.h``, FFI API 0.4 in jaxlib 0.11.2).
  XLA's stream comes from the call frame (``XLA_FFI_Stream_Get``); the wait is
  ``cudaStreamWaitEvent`` from the CUDA runtime torch has loaded.
* Which event: one per call, handed over through a FIFO per device. The shim
  records an event and appends it under a lock that also covers the dispatch
  of the jitted call; the handler pops from the left. This relies on PJRT
  launching one device's executions in dispatch order (one compute stream per
  device), so that call N's handler pops call N's event whether it runs inside
  the dispatch or later on a launch thread. A single
  reused event would be wrong with an asynchronous launch: a later record
  (made for call N+1, after torch was told to wait for call N's result) seen
  by call N's handler would make XLA wait for torch and torch for XLA.
  A dispatch that raises removes its own event again (nothing ran); an empty
  FIFO in the handler is an XLA error, not a silent skip.
* The handler runs Python, so it takes the GIL on XLA's thread. jaxlib drops
  the GIL around the execution in the dispatch and while the export of the
  result waits for the launch (``torch.from_dlpack`` ->
  ``BufferToDLPackManagedTensor``); the shim exports right after the dispatch,
  so a handler on a launch thread is neither deadlocked nor left waiting long.
* Command buffers: the target is registered without the command-buffer
  trait, so XLA runs it as a plain thunk on its stream, never inside a CUDA
  graph it captures. The shim refuses calls while torch's current stream is
  capturing a CUDA graph (the recorded event would pull XLA's stream into
  torch's capture).
* CPU: the same target is registered for the host platform; its handler only
  pops the FIFO and counts, so CPU tests run the whole path (the custom call,
  the barrier, the bookkeeping) without a GPU.

The other direction (mode "ffi-signal", ``out=`` and the store only): the call
ends with a second custom call (``SIGNAL_TARGET``) whose output aliases the
result, so it runs after the kernel's write; its handler records an event on
XLA's stream and makes the call's torch stream wait on it. The caller returns
once that handler has run (at once when PJRT launches inside the dispatch), and
skips the export (``torch.from_dlpack``) that otherwise makes torch wait.

Selection: ``QSA_SHIM_FENCE=ffi`` / ``ffi-signal`` (or
``qsa_torch_shim.set_stream_fence(...)``); the default is ``"import"``, today's
fence, until the GPU race tests have passed with the FFI modes. When the FFI fence cannot be set up (no CUDA runtime found,
registration refused by another jaxlib) the shim uses the fence import and
``FENCE.reason`` says why; ``FENCE`` counts which fence each call used.
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import os
import threading

import jax
import torch

from qsa_torch_shim import _private_api

TARGET = "qsa_shim_wait_for_torch"
# Mode "ffi-signal" only (``out=`` and the store): the call ends with a second custom call
# whose handler makes torch's stream wait for XLA's, instead of the export's handshake.
SIGNAL_TARGET = "qsa_shim_signal_torch"
MODES = ("import", "ffi", "ffi-signal")
# The FFI API version whose structure layouts this module follows (jaxlib 0.11.2's c_api.h);
# it is what the handler reports when XLA asks for its metadata at registration.
FFI_API_VERSION = (0, 4)

_METADATA_EXTENSION = 1   # XLA_FFI_Extension_Metadata
_STAGE_EXECUTE = 3        # XLA_FFI_ExecutionStage_EXECUTE
_ERROR_INTERNAL = 13      # XLA_FFI_Error_Code_INTERNAL
_EVENT_DISABLE_TIMING = 2  # cudaEventDisableTiming: a pure ordering event is cheaper to record


# --- the C structures (layouts from c_api.h) ----------------------------------------------

class _Extension(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int),
                ("next", ctypes.c_void_p)]


class _ApiVersion(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("major_version", ctypes.c_int), ("minor_version", ctypes.c_int)]


class _Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", _ApiVersion),
                ("traits", ctypes.c_uint32)]


class _MetadataExtension(ctypes.Structure):
    _fields_ = [("extension_base", _Extension), ("metadata", ctypes.POINTER(_Metadata))]


_API_FUNCTIONS = (
    "Error_Create", "Error_GetDetails", "Error_Destroy", "Handler_Register", "Stream_Get",
    "Type_Register", "InvokeContext_Get", "State_Set", "State_Get", "DeviceMemory_Allocate",
    "DeviceMemory_Free", "ThreadPool_Schedule", "ThreadPool_NumThreads", "Future_Create",
    "Future_SetAvailable", "Future_SetError", "RunId_Get", "DeviceOrdinal_Get",
    "InvokeContext_FindExtension")


class _Api(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("api_version", _ApiVersion), ("internal_api", ctypes.c_void_p)] + [
                    (name, ctypes.c_void_p) for name in _API_FUNCTIONS]


class _CallFrame(ctypes.Structure):
    # Only the head of XLA_FFI_CallFrame: the handler takes no arguments or attributes.
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", ctypes.POINTER(_Extension)),
                ("api", ctypes.POINTER(_Api)), ("ctx", ctypes.c_void_p), ("stage", ctypes.c_int)]


class _StreamGetArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("ctx", ctypes.c_void_p), ("stream", ctypes.c_void_p)]


class _DeviceOrdinalGetArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("ctx", ctypes.c_void_p), ("device_ordinal", ctypes.c_int32)]


class _ErrorCreateArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("message", ctypes.c_char_p), ("errc", ctypes.c_int)]


def _struct_size(struct, last_field: str) -> int:
    """XLA_FFI_STRUCT_SIZE: offset of the last field plus its size (no tail padding)."""
    field = getattr(struct, last_field)
    return field.offset + field.size


_HANDLER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_CallFrame))
_ERROR_CREATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_ErrorCreateArgs))
_STREAM_GET = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_StreamGetArgs))
_ORDINAL_GET = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_DeviceOrdinalGetArgs))
# XLA's API table has the size it was built with: the handler reads a function
# pointer only when the table reaches past it.
_API_NEEDS = {name: getattr(_Api, name).offset + ctypes.sizeof(ctypes.c_void_p)
              for name in ("Error_Create", "Stream_Get", "DeviceOrdinal_Get")}


# --- bookkeeping -------------------------------------------------------------------------

class FencePaths:
    """Which per-call fence ran, how often the handler ran, and why the FFI fence is off."""

    def __init__(self):
        self.ffi = 0          # calls ordered by the FFI wait
        self.imported = 0     # calls ordered by the fence import (or a donated fresh import)
        self.handled = 0      # handler executions (pops), CPU and GPU
        self.signalled = 0    # calls whose FFI signal made torch wait (mode "ffi-signal")
        self.reason: str | None = None  # why the FFI fence is unavailable, once tried
        # The thread that ran the last handler: the caller's when PJRT launches inside
        # the dispatch, another one when it launches asynchronously (tools/profile_shim.py).
        self.handler_thread: int | None = None

    def reset(self) -> None:
        self.ffi = self.imported = self.handled = self.signalled = 0


FENCE = FencePaths()


def mode_from_env(environ) -> str:
    """The fence ``QSA_SHIM_FENCE`` selects; "import" when unset."""
    chosen = environ.get("QSA_SHIM_FENCE", "").strip().lower() or "import"
    if chosen not in MODES:
        raise ValueError(f"QSA_SHIM_FENCE must be one of {MODES}; got {chosen!r}")
    return chosen


_MODE = [mode_from_env(os.environ)]

# Pending events per (platform, device ordinal), popped by the handler in dispatch order.
_PENDING: dict[tuple[str, int], collections.deque] = collections.defaultdict(collections.deque)
# Recycled events per CUDA device: an event may be re-recorded once its wait was enqueued
# (cudaStreamWaitEvent captures the record current at the time of the call).
_SPARE: dict[int, list] = collections.defaultdict(list)
# Pending end-of-call signals per (platform, device ordinal), in dispatch order.
_SIGNALS: dict[tuple[str, int], collections.deque] = collections.defaultdict(collections.deque)
_LOCK = threading.Lock()
# Entries are (serial, event): unique even when an event handle is recycled, so that
# taking an entry back (``_forget``) can never remove another call's.
_SERIALS = itertools.count(1)
# Test hooks (the GPU negative controls): the handlers keep the bookkeeping in step but
# skip the wait (SKIP_WAIT) or the signal's record and wait (SKIP_SIGNAL).
SKIP_WAIT = [False]
SKIP_SIGNAL = [False]
_STATE: dict = {}  # "registered": {platform: bool}, "cudart": ctypes library, "handlers": keep-alive


def set_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"stream fence must be one of {MODES}; got {mode!r}")
    _MODE[0] = mode


def mode() -> str:
    return _MODE[0]


# --- the handler ---------------------------------------------------------------------------

def _answer_metadata(frame) -> bool:
    """XLA asks each handler for its FFI version at registration (a metadata extension)."""
    ext = frame.extension_start
    if not ext or ext.contents.type != _METADATA_EXTENSION:
        return False
    metadata = ctypes.cast(ext, ctypes.POINTER(_MetadataExtension)).contents.metadata.contents
    metadata.api_version.major_version, metadata.api_version.minor_version = FFI_API_VERSION
    metadata.traits = 0  # not command-buffer compatible: never captured into XLA's CUDA graphs
    return True


class _Bound:
    """XLA's API functions the handler calls, bound once per API table (one per process)."""

    def __init__(self, api):
        size = api.struct_size

        def bind(name, prototype):
            address = getattr(api, name)
            return prototype(address) if size >= _API_NEEDS[name] and address else None

        self.error_create = bind("Error_Create", _ERROR_CREATE)
        self.stream_get = bind("Stream_Get", _STREAM_GET)
        self.ordinal_get = bind("DeviceOrdinal_Get", _ORDINAL_GET)


_BOUND: dict[int, _Bound] = {}


def _bound(frame) -> _Bound:
    address = ctypes.cast(frame.api, ctypes.c_void_p).value
    found = _BOUND.get(address)
    if found is None:
        found = _BOUND[address] = _Bound(frame.api.contents)
    return found


class _Scratch(threading.local):
    """Argument structures reused per thread (a handler call fills them and is done)."""

    def __init__(self):
        self.stream = _StreamGetArgs(_struct_size(_StreamGetArgs, "stream"), None, None, None)
        self.ordinal = _DeviceOrdinalGetArgs(
            _struct_size(_DeviceOrdinalGetArgs, "device_ordinal"), None, None, -1)
        self.stream_ref = ctypes.byref(self.stream)
        self.ordinal_ref = ctypes.byref(self.ordinal)


_SCRATCH = _Scratch()


def _error(frame, message: str) -> int | None:
    create = _bound(frame).error_create
    if create is None:
        return None  # cannot report; the count of handled calls stays short
    text = _STATE.setdefault("messages", {}).setdefault(message, message.encode())
    args = _ErrorCreateArgs(_struct_size(_ErrorCreateArgs, "errc"), None, text, _ERROR_INTERNAL)
    return create(ctypes.byref(args))


def _pop(key):
    try:
        entry = _PENDING[key].popleft()
    except IndexError:
        return None
    FENCE.handled += 1
    FENCE.handler_thread = threading.get_ident()
    return entry


def _cpu_handler(frame_ptr):
    frame = frame_ptr.contents
    try:
        if _answer_metadata(frame) or frame.stage != _STAGE_EXECUTE:
            return None
        if _pop(("cpu", 0)) is None:
            return _error(frame, f"{TARGET}: no pending entry (the shim's fence bookkeeping "
                                 "is out of step)")
        return None
    except Exception as exc:  # an exception must not escape into XLA's thread
        return _error(frame, f"{TARGET}: {type(exc).__name__}: {exc}")


def _device_and_stream(frame):
    """(device ordinal, XLA's stream) of this execution, or an error pointer."""
    api = _bound(frame)
    if api.stream_get is None or api.ordinal_get is None:
        return None, _error(frame, f"{TARGET}: XLA's FFI API lacks Stream_Get/DeviceOrdinal_Get")
    scratch = _SCRATCH
    scratch.ordinal.ctx = scratch.stream.ctx = frame.ctx
    if api.ordinal_get(scratch.ordinal_ref) or api.stream_get(scratch.stream_ref):
        return None, _error(frame, f"{TARGET}: DeviceOrdinal_Get or Stream_Get failed")
    return (scratch.ordinal.device_ordinal, scratch.stream.stream), None


def _gpu_handler(frame_ptr):
    frame = frame_ptr.contents
    try:
        if _answer_metadata(frame) or frame.stage != _STAGE_EXECUTE:
            return None
        found, error = _device_and_stream(frame)
        if found is None:
            return error
        ordinal, stream = found
        entry = _pop(("gpu", ordinal))
        if entry is None:
            return _error(frame, f"{TARGET}: no pending torch event for device {ordinal} (the "
                                 "shim's fence bookkeeping is out of step)")
        event = entry[1]
        if not SKIP_WAIT[0]:
            rc = _STATE["cudart"].cudaStreamWaitEvent(stream, event, 0)
            if rc:
                return _error(frame, f"{TARGET}: cudaStreamWaitEvent returned {rc}")
        _SPARE[ordinal].append(event)
        return None
    except Exception as exc:  # an exception must not escape into XLA's thread
        return _error(frame, f"{TARGET}: {type(exc).__name__}: {exc}")


class _Signal:
    """One call's end-of-call signal: torch's stream and an event (CUDA), and whether
    the handler has made torch's stream wait (``done``), with an optional waiter."""

    __slots__ = ("serial", "stream", "event", "done", "waiter")

    def __init__(self, stream, event):
        self.serial = next(_SERIALS)
        self.stream, self.event = stream, event
        self.done = False
        self.waiter = None

    def finish(self) -> None:
        # Set, then look: with the caller's look-then-wait (``await_signal``) under
        # the GIL, one of the two sides always sees the other.
        self.done = True
        waiter = self.waiter
        if waiter is not None:
            waiter.set()


def _signal_handler(platform: str):
    def handler(frame_ptr):
        frame = frame_ptr.contents
        try:
            if _answer_metadata(frame) or frame.stage != _STAGE_EXECUTE:
                return None
            if platform == "cpu":
                ordinal, stream = 0, None
            else:
                found, error = _device_and_stream(frame)
                if found is None:
                    return error
                ordinal, stream = found
            try:
                entry = _SIGNALS[(platform, ordinal)].popleft()
            except IndexError:
                return _error(frame, f"{SIGNAL_TARGET}: no pending signal (the shim's fence "
                                     "bookkeeping is out of step)")
            if stream is not None and not SKIP_SIGNAL[0]:
                cudart = _STATE["cudart"]
                rc = cudart.cudaEventRecord(entry.event, stream) or cudart.cudaStreamWaitEvent(
                    entry.stream, entry.event, 0)
                if rc:
                    return _error(frame, f"{SIGNAL_TARGET}: CUDA runtime returned {rc}")
            if stream is not None:
                _SPARE[ordinal].append(entry.event)
            entry.finish()
            return None
        except Exception as exc:  # an exception must not escape into XLA's thread
            return _error(frame, f"{SIGNAL_TARGET}: {type(exc).__name__}: {exc}")
    return handler


# --- set-up ---------------------------------------------------------------------------------

def _load_cudart():
    """The CUDA runtime library torch loaded (found in the process map), else by name."""
    candidates = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                if "libcudart.so" in os.path.basename(path) and path not in candidates:
                    candidates.append(path)
    except OSError:
        pass
    version = (torch.version.cuda or "").split(".")[0]
    candidates += [f"libcudart.so.{version}"] if version else []
    candidates.append("libcudart.so")
    errors = []
    for name in candidates:
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
            continue
        vp, ui = ctypes.c_void_p, ctypes.c_uint
        lib.cudaEventCreateWithFlags.argtypes = [ctypes.POINTER(vp), ui]
        lib.cudaEventRecord.argtypes = [vp, vp]
        lib.cudaStreamWaitEvent.argtypes = [vp, vp, ui]
        for fn in (lib.cudaEventCreateWithFlags, lib.cudaEventRecord, lib.cudaStreamWaitEvent):
            fn.restype = ctypes.c_int
        return lib
    raise OSError("no CUDA runtime library found: " + "; ".join(errors))


def _register(platform: str) -> bool:
    """Register the handler for ``platform`` ("cpu" or "gpu") once; False (with
    ``FENCE.reason``) when that is not possible here."""
    registered = _STATE.setdefault("registered", {})
    if platform in registered:
        return registered[platform]
    registered[platform] = False
    try:
        # Backends first: a registration made before they exist is applied when they are
        # created, where an error would break JAX's backend start instead of raising here.
        jax.devices(platform)
        if platform == "gpu":
            _STATE["cudart"] = _load_cudart()
        wait = _cpu_handler if platform == "cpu" else _gpu_handler
        for name, fn in ((TARGET, wait), (SIGNAL_TARGET, _signal_handler(platform))):
            handler = _HANDLER(fn)
            _STATE.setdefault("handlers", []).append(handler)  # keeps the C pointer alive
            capsule = jax.ffi.pycapsule(ctypes.cast(handler, ctypes.c_void_p).value)
            jax.ffi.register_ffi_target(name, capsule, platform=platform, api_version=1)
    except Exception as exc:  # noqa: BLE001 - any failure means: use the fence import
        FENCE.reason = f"{platform}: {type(exc).__name__}: {exc}"
        return False
    registered[platform] = True
    return True


def active(device: torch.device) -> bool:
    """Whether this call is ordered by the FFI wait (mode "ffi" or "ffi-signal", and the
    handlers registered)."""
    if _MODE[0] == "import":
        return False
    return _register("gpu" if device.type == "cuda" else "cpu")


def signals(device: torch.device) -> bool:
    """Whether an ``out=``/store call ends with the FFI signal instead of the export."""
    return _MODE[0] == "ffi-signal" and active(device)


def _new_event(index: int):
    event = ctypes.c_void_p()
    with torch.cuda.device(index):
        rc = _STATE["cudart"].cudaEventCreateWithFlags(ctypes.byref(event), _EVENT_DISABLE_TIMING)
    if rc:
        raise RuntimeError(f"qsa_torch_shim: cudaEventCreateWithFlags returned {rc}")
    return event.value


def _push(device: torch.device, signal: bool):
    """Record this call's event on torch's current stream and queue it for the wait
    handler (and, with ``signal``, queue the end-of-call signal); returns the ticket
    (FIFO key, wait entry, signal or None)."""
    if device.type != "cuda":
        key, stream, event, spare = ("cpu", 0), None, None, None
    else:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("qsa_torch_shim: JAX calls cannot be captured in a CUDA graph; "
                               "call the shim outside graph capture")
        key, stream, spare = ("gpu", index), _private_api.current_raw_stream(index), _SPARE[index]
        event = spare.pop() if spare else _new_event(index)
        rc = _STATE["cudart"].cudaEventRecord(event, stream)
        if rc:
            spare.append(event)
            raise RuntimeError(f"qsa_torch_shim: cudaEventRecord returned {rc}")
    entry = (next(_SERIALS), event)
    _PENDING[key].append(entry)
    sig = None
    if signal:
        sig = _Signal(stream, None if spare is None else
                      (spare.pop() if spare else _new_event(key[1])))
        _SIGNALS[key].append(sig)
    return key, entry, sig


class _Last(threading.local):
    ticket = None  # (FIFO key, entry, signal) of this thread's last dispatch


_LAST = _Last()


def _forget(ticket) -> None:
    """Take back a call's queue entries that no handler took (its execution never ran
    them); their unused events go back to the pool."""
    key, entry, sig = ticket
    try:
        _PENDING[key].remove(entry)
    except ValueError:
        pass  # the handler took it (it ran) and recycled the event itself
    else:
        if entry[1] is not None:
            _SPARE[key[1]].append(entry[1])
    if sig is not None:
        try:
            _SIGNALS[key].remove(sig)
        except ValueError:
            return
        if sig.event is not None:
            _SPARE[key[1]].append(sig.event)


def dispatch(device: torch.device, signal: bool, call, *args, **kwargs):
    """``call(*args, **kwargs)``: the dispatch of one jitted call that contains the FFI
    wait (and, with ``signal``, ends with the FFI signal).

    Records and queues this call's event, and holds the lock until the dispatch
    returns, so that the FIFO order is the dispatch order across threads. Only
    the dispatch belongs here (not the export of its result): a dispatch that
    raises ran nothing, so its entries are taken back.
    """
    with _LOCK:
        ticket = _push(device, signal)
        try:
            result = call(*args, **kwargs)
        except BaseException:
            _forget(ticket)
            raise
        _LAST.ticket = ticket
    FENCE.ffi += 1
    return result


def await_signal(result) -> bool:
    """After a dispatch with ``signal``: True once its signal handler has made torch's
    current stream wait for XLA's (the caller may then skip the export); False when the
    execution finished or failed without it (its entries are taken back; the caller
    exports, which raises the execution's error if there was one).

    The handler runs at launch, inside the dispatch or soon after on PJRT's launch
    thread; meanwhile this waits with the GIL released, so the handler can take it.
    """
    sig = _LAST.ticket[2]
    if not sig.done:
        waiter = sig.waiter = threading.Event()
        while not sig.done and not waiter.wait(0.002):
            if result.is_ready() and not sig.done:
                _forget(_LAST.ticket)
                return False
    FENCE.signalled += 1
    return True


def settle_failed_call(result) -> None:
    """After the export of this thread's last dispatched call raised: if that execution
    failed, take its entries back (its handlers may never have run, and a stale entry
    would hand the next call an older event). Waits for the execution first, so an
    entry whose handler is still to run (an interrupted export) stays queued."""
    ticket, _LAST.ticket = _LAST.ticket, None
    if ticket is None:
        return
    try:
        jax.block_until_ready(result)
    except Exception:  # noqa: BLE001 - the execution failed: its handler may not have run
        _forget(ticket)


def pending() -> int:
    """Entries queued but not yet taken by a handler (0 between calls once launched)."""
    return sum(len(q) for q in _PENDING.values()) + sum(len(q) for q in _SIGNALS.values())
