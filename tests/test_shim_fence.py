"""The shim's per-call stream fence: the FFI wait (``_ffi_fence``) and the fence import.

On CPU the FFI handler only counts and keeps the bookkeeping in step, but the
whole path runs: the custom call inside each jitted call, the barrier in front
of every input, the FIFO between the dispatch and the handler, the fallback.
The ordering itself is proved on the GPU by the race tests in test_shim.py
(``test_gpu_stream_race[...-ffi]`` and its negative control).
"""

from __future__ import annotations

import re
import warnings

import jax
import numpy as np
import pytest
import torch

import qsa_torch_shim as S
from qsa_testing import cases as C
from qsa_testing import golden
from qsa_testing.torch_interop import kv_views, to_torch
from qsa_torch_shim import _ffi_fence as F
from qsa_torch_shim import _interop as I
from qsa_torch_shim import _jax_side as J


@pytest.fixture
def fence_mode():
    """Set the fence for one test and put the previous one back."""
    previous = F.mode()

    def use(mode):
        S.set_stream_fence(mode)
        F.FENCE.reset()

    yield use
    F.set_mode(previous)


def _every_op(seed: int):
    """One call of each operator through the shim (random inputs from ``seed``); returns
    the results."""
    rng = np.random.default_rng(seed)
    case = C.sparse_attention_case(rng, rows=3, num_query_heads=4, num_kv_heads=2, head_dim=16,
                                   page_size=8, selection_blocks=4, context_tokens=32)
    t = lambda x: to_torch(x, "cpu")  # noqa: E731
    kv = t(case.kv_cache)
    k, v = kv_views(kv, case.head_dim)
    args = (t(case.q), k, v, t(case.logical_indices), t(case.block_table), t(case.token_to_req),
            False)
    gate = t(case.output_gate)
    store = C.store_case(rng, n=12, pages=3, page_size=8, width=140)
    cache = t(store.cache)
    comp = C.compress_case(rng, chunk_lens=[5, 1, 3], with_rope=True, ring=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", S.ShimCopyWarning)  # CPU ignores donation
        new = S.qsa_sparse_paged_attention(*args, output_gate=gate)
        out = S.qsa_sparse_paged_attention(*args, torch.full_like(args[0], float("nan")),
                                           output_gate=gate)
        S.qsa_store_cache_rows(cache, t(store.slot_mapping.astype(np.int64)), t(store.rows))
        pooled, first = S.qsa_compress_groups_with_ratio(
            t(comp.raw_keys), t(comp.raw_positions.astype(np.int64)),
            t(comp.compressor_state_cache), t(comp.compressor_state_block_table),
            t(comp.token_to_req), t(comp.query_start_loc), t(comp.logical_positions),
            t(comp.compressed_slots), comp.compress_ratio, t(comp.rope_cache.astype(np.int64)))
    return new, out, cache, pooled, first


def _fresh_seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


CALLS = 4  # sparse (new), sparse (out=), store, compress


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


@pytest.mark.parametrize("mode,signalled", [("ffi", 0), ("ffi-signal", 2)])
def test_ffi_modes_run_their_handlers_and_change_no_result(fence_mode, mode, signalled):
    """With the FFI fence each call's wait handler runs once inside the jitted call (CPU:
    it counts), no fence import is made, nothing stays queued, and the results are the
    fence import's, bit for bit (same fresh random inputs). Mode "ffi-signal" also ends
    the calls that write into the caller's memory (``out=``, the store) with the signal
    (on CPU donation is never honoured, so the shim still exports and copies back)."""
    seed = _fresh_seed()
    fence_mode(mode)
    got = _every_op(seed)
    assert F.FENCE.reason is None, F.FENCE.reason
    assert (F.FENCE.ffi, F.FENCE.handled, F.FENCE.imported, F.FENCE.signalled) == (
        CALLS, CALLS, 0, signalled), vars(F.FENCE)
    assert F.pending() == 0
    fence_mode("import")
    want = _every_op(seed)
    assert (F.FENCE.ffi, F.FENCE.handled, F.FENCE.imported) == (0, 0, CALLS), vars(F.FENCE)
    for x, y in zip(got, want):
        assert torch.equal(_bits(x), _bits(y))


def test_import_fence_is_the_default():
    """Until the FFI fence has passed the GPU race test, the default is the import."""
    assert F.mode_from_env({}) == "import"
    assert F.mode_from_env({"QSA_SHIM_FENCE": " FFI "}) == "ffi"
    with pytest.raises(ValueError, match="QSA_SHIM_FENCE"):
        F.mode_from_env({"QSA_SHIM_FENCE": "event"})
    with pytest.raises(ValueError, match="stream fence"):
        S.set_stream_fence("event")


def test_every_input_waits_behind_the_ffi_call():
    """In the lowered program each argument's only use is the optimization barrier that
    also takes the FFI call's token: nothing reads an input before the wait."""
    case = C.sparse_attention_case(np.random.default_rng(), rows=2, num_query_heads=4,
                                   num_kv_heads=2, head_dim=16, page_size=8, selection_blocks=4,
                                   context_tokens=32)
    arrays = [jax.numpy.asarray(x) for x in (case.q, case.kv_cache, case.logical_indices,
                                             case.block_table, case.token_to_req, case.output_gate)]
    q, kv, li, bt, ttr, gate = arrays
    for fn, lead in ((J.sparse_new, None), (J.sparse_into, jax.numpy.zeros_like(q))):
        text = fn.lower(lead, q, (kv,), li, bt, ttr, gate, use_prefill_config=False,
                        implementation=None, ffi_fence=True).as_text()
        main = text[text.index("func.func public @main"):]
        main = main[:main.index("\n  }")]
        assert f'stablehlo.custom_call @{F.TARGET}' in main, main
        barrier = next(line for line in main.splitlines() if "optimization_barrier" in line)
        params = re.findall(r"%arg\d+", main.splitlines()[0])
        for p in params[1:]:  # params[0]: the fence / the donated out, never read
            users = [line for line in main.splitlines()[1:] if re.search(rf"{p}\b", line)]
            assert users == [barrier], (p, users)


def test_fallback_to_the_import_when_the_ffi_target_cannot_register(fence_mode, monkeypatch):
    """Says which path ran and why: a refused registration leaves the fence import."""
    def refused(*args, **kwargs):
        raise RuntimeError("simulated: no FFI here")

    monkeypatch.setattr(jax.ffi, "register_ffi_target", refused)
    monkeypatch.setitem(F._STATE, "registered", {})
    monkeypatch.setattr(F.FENCE, "reason", None)
    seed = _fresh_seed()
    fence_mode("ffi")
    got = _every_op(seed)
    assert (F.FENCE.ffi, F.FENCE.handled, F.FENCE.imported) == (0, 0, CALLS), vars(F.FENCE)
    assert "simulated" in F.FENCE.reason
    fence_mode("import")
    want = _every_op(seed)
    for a, b in zip(got, want):
        assert torch.equal(_bits(a), _bits(b))


def test_a_failed_dispatch_takes_its_event_back(fence_mode, monkeypatch):
    """A dispatch that raises ran nothing: its queued entry is removed, and the next
    call's handler takes the next call's entry (not a stale one)."""
    fence_mode("ffi")
    real = J.sparse_new

    def broken(*args, **kwargs):
        raise RuntimeError("simulated dispatch failure")

    monkeypatch.setattr(J, "sparse_new", broken)
    case = next(c for c, _ in golden.sparse_attention_cases() if c.name == "tp1_r3_s64_full")
    t = lambda x: to_torch(x, "cpu")  # noqa: E731
    k, v = kv_views(t(case.kv_cache), case.head_dim)
    args = (t(case.q), k, v, t(case.logical_indices), t(case.block_table), t(case.token_to_req),
            False)
    with pytest.raises(RuntimeError, match="simulated"):
        S.qsa_sparse_paged_attention(*args, output_gate=t(case.output_gate))
    assert F.pending() == 0
    monkeypatch.setattr(J, "sparse_new", real)
    S.qsa_sparse_paged_attention(*args, output_gate=t(case.output_gate))
    assert F.FENCE.reason is None, F.FENCE.reason
    assert F.pending() == 0 and F.FENCE.handled == 1
    I.clear_import_cache()


def test_handler_refuses_an_out_of_step_fifo(fence_mode):
    """A jitted call with the wait but no queued entry fails loudly (an XLA error from the
    handler), instead of running unordered."""
    fence_mode("ffi")
    assert F.active(torch.device("cpu"))
    assert F.pending() == 0
    jnp = jax.numpy
    with pytest.raises(Exception, match="out of step"):
        jax.block_until_ready(J.store_into(
            jnp.zeros((2, 4, 1, 16), jnp.bfloat16), jnp.arange(3, dtype=jnp.int32),
            jnp.ones((3, 16), jnp.bfloat16), slots_are_words=False, implementation=None,
            ffi_fence=True))
    assert F.FENCE.handled == 0


def test_gpu_handler_logic_with_a_fake_xla_api(monkeypatch):
    """The CUDA handler's steps, on CPU, through a fake XLA API table and a fake CUDA
    runtime: it answers XLA's metadata query, asks for the device and stream, waits on
    the events in the order they were queued (per device), recycles them, honours the
    negative-control switch, and reports an empty queue as an XLA error."""
    import ctypes

    waits, errors = [], []
    ordinal, stream = 5, 0x5151

    def ordinal_get(args):
        args.contents.device_ordinal = ordinal
        return None

    def stream_get(args):
        assert args.contents.ctx == 0xC0FFEE
        args.contents.stream = stream
        return None

    def error_create(args):
        errors.append(args.contents.message.decode())
        return 1234

    keep = [F._ORDINAL_GET(ordinal_get), F._STREAM_GET(stream_get), F._ERROR_CREATE(error_create)]
    api = F._Api()
    api.struct_size = ctypes.sizeof(F._Api)
    api.DeviceOrdinal_Get, api.Stream_Get, api.Error_Create = (
        ctypes.cast(f, ctypes.c_void_p).value for f in keep)

    class FakeRuntime:
        @staticmethod
        def cudaStreamWaitEvent(s, event, flags):
            waits.append((s, event, flags))
            return 0

    monkeypatch.setitem(F._STATE, "cudart", FakeRuntime)
    monkeypatch.setitem(F._PENDING, ("gpu", ordinal),
                        __import__("collections").deque([(1, 111), (2, 222)]))
    monkeypatch.setitem(F._SPARE, ordinal, [])
    frame = F._CallFrame(ctypes.sizeof(F._CallFrame), None, ctypes.pointer(api), 0xC0FFEE,
                         F._STAGE_EXECUTE)
    call = lambda: F._gpu_handler(ctypes.pointer(frame))  # noqa: E731
    assert call() is None and call() is None
    assert waits == [(stream, 111, 0), (stream, 222, 0)]
    assert F._SPARE[ordinal] == [111, 222] and not F._PENDING[("gpu", ordinal)]
    F._PENDING[("gpu", ordinal)].append((3, 333))
    monkeypatch.setattr(F, "SKIP_WAIT", [True])
    assert call() is None and len(waits) == 2 and F._SPARE[ordinal][-1] == 333
    assert call() == 1234 and "out of step" in errors[-1]
    # XLA's metadata query at registration: the version this module's layouts follow.
    metadata = F._Metadata(ctypes.sizeof(F._Metadata))
    metadata.api_version.struct_size = ctypes.sizeof(F._ApiVersion)
    ext = F._MetadataExtension(F._Extension(ctypes.sizeof(F._MetadataExtension),
                                            F._METADATA_EXTENSION, None), ctypes.pointer(metadata))
    frame.extension_start = ctypes.cast(ctypes.pointer(ext), ctypes.POINTER(F._Extension))
    assert call() is None and len(waits) == 2
    assert (metadata.api_version.major_version, metadata.api_version.minor_version) == \
        F.FFI_API_VERSION and metadata.traits == 0


def test_an_execution_that_fails_after_its_dispatch_gives_its_entry_back(monkeypatch):
    """An execution can fail after its dispatch returned, before its wait ran (then only
    the export raises). Its entry must go, or every later call would take the previous
    call's event; an entry whose execution did not fail (an interrupted export) stays."""
    def failed(_):
        raise RuntimeError("simulated execution failure")

    key = ("cpu", 0)
    for execution_failed in (True, False):
        ticket = F._push(torch.device("cpu"), False)
        monkeypatch.setattr(F._LAST, "ticket", ticket)
        monkeypatch.setattr(jax, "block_until_ready", failed if execution_failed else lambda x: x)
        F.settle_failed_call(object())
        assert (ticket[1] in F._PENDING[key]) is not execution_failed
        assert F._LAST.ticket is None
        F._PENDING[key].clear()


def test_the_signal_is_the_last_producer_of_the_result():
    """In the lowered ``out=`` call the signal takes the kernel's result and its output,
    aliased to that operand, is what the call returns: nothing writes the result after
    torch was told to wait for it."""
    case = C.sparse_attention_case(np.random.default_rng(), rows=2, num_query_heads=4,
                                   num_kv_heads=2, head_dim=16, page_size=8, selection_blocks=4,
                                   context_tokens=32)
    q, kv, li, bt, ttr, gate = (jax.numpy.asarray(x) for x in (
        case.q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req,
        case.output_gate))
    text = J.sparse_into.lower(jax.numpy.zeros_like(q), q, (kv,), li, bt, ttr, gate,
                               use_prefill_config=False, implementation=None, ffi_fence=True,
                               ffi_signal=True).as_text()
    main = text[text.index("func.func public @main"):]
    main = main[:main.index("\n  }")]
    line = next(x for x in main.splitlines() if f"@{F.SIGNAL_TARGET}" in x)
    name = line.split("=")[0].strip()
    assert "output_operand_aliases" in line, line
    returned = next(x for x in main.splitlines() if x.strip().startswith("return"))
    assert returned.split()[1].rstrip(",") == name, (returned, name)


def test_signal_handler_logic_with_a_fake_xla_api(monkeypatch):
    """The CUDA signal handler through a fake XLA API and runtime: records the call's
    event on XLA's stream, makes the call's torch stream wait on it, recycles the
    event and wakes the caller; a call that finished without its signal is taken back."""
    import collections
    import ctypes

    calls = []

    def ordinal_get(args):
        args.contents.device_ordinal = 3
        return None

    def stream_get(args):
        args.contents.stream = 0x7A7A
        return None

    keep = [F._ORDINAL_GET(ordinal_get), F._STREAM_GET(stream_get)]
    api = F._Api()
    api.struct_size = ctypes.sizeof(F._Api)
    api.DeviceOrdinal_Get, api.Stream_Get = (ctypes.cast(f, ctypes.c_void_p).value for f in keep)

    class FakeRuntime:
        @staticmethod
        def cudaEventRecord(event, stream):
            calls.append(("record", event, stream))
            return 0

        @staticmethod
        def cudaStreamWaitEvent(stream, event, flags):
            calls.append(("wait", stream, event))
            return 0

    monkeypatch.setitem(F._STATE, "cudart", FakeRuntime)
    sig = F._Signal(stream=0x70C4, event=555)
    monkeypatch.setitem(F._SIGNALS, ("gpu", 3), collections.deque([sig]))
    monkeypatch.setitem(F._SPARE, 3, [])
    frame = F._CallFrame(ctypes.sizeof(F._CallFrame), None, ctypes.pointer(api), 0xC0FFEE,
                         F._STAGE_EXECUTE)
    assert F._signal_handler("gpu")(ctypes.pointer(frame)) is None
    assert calls == [("record", 555, 0x7A7A), ("wait", 0x70C4, 555)]
    assert sig.done and F._SPARE[3] == [555] and not F._SIGNALS[("gpu", 3)]
    # A call whose execution ended without its signal: the caller gets False, the entries go.
    ticket = F._push(torch.device("cpu"), True)
    monkeypatch.setattr(F._LAST, "ticket", ticket)

    class Finished:
        @staticmethod
        def is_ready():
            return True

    assert F.await_signal(Finished) is False
    assert F.pending() == 0


def test_a_taken_back_gpu_entry_returns_its_event_to_the_pool(monkeypatch):
    """A CUDA call whose wait never ran (failed dispatch or execution) gives its event back
    to the device's pool, so failures do not leak CUDA events; an entry the handler took
    is left to the handler (it recycles the event itself)."""
    key = ("gpu", 5)
    monkeypatch.setitem(F._PENDING, key, __import__("collections").deque([(7, 777), (8, 888)]))
    monkeypatch.setitem(F._SPARE, 5, [])
    F._forget((key, (7, 777), None))
    assert F._SPARE[5] == [777] and list(F._PENDING[key]) == [(8, 888)]
    F._PENDING[key].clear()  # as if the handler had taken (8, 888)
    F._forget((key, (8, 888), None))
    assert F._SPARE[5] == [777]
