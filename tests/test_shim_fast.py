"""The shim's per-call host shortcuts (notes/shim.md, "Session 7"), on CPU.

* ``out=`` routes: an output of at most ``OUT_COPY_MAX_BYTES`` is written by the plain
  call plus a torch copy, a larger one by donation; both keep ``out``'s memory and
  return ``out``; the switch is at the documented threshold.
* The call cache (``_call_cache``): a repeated call skips the checks and the import
  lookups; anything the checks read, or another root tensor at the same memory,
  misses; a scale that is not a plain number is never cached.
"""

from __future__ import annotations

import gc
import sys
import warnings

import pytest
import torch

import qsa_torch_shim as S
from qsa_torch_shim import _call_cache, _checks, _eager
from qsa_torch_shim import _interop as I
from qsa_testing import golden
from qsa_testing.torch_interop import kv_views, to_torch


@pytest.fixture
def case():
    c = next(c for c, _ in golden.sparse_attention_cases() if c.name == "tp1_r3_s64_full")
    t = lambda x: to_torch(x, "cpu")  # noqa: E731
    k, v = kv_views(t(c.kv_cache), c.head_dim)
    args = [t(c.q), k, v, t(c.logical_indices), t(c.block_table), t(c.token_to_req), False]
    I.clear_import_cache()
    previous = _eager.OUT_COPY_MAX_BYTES[0]
    with warnings.catch_warnings():
        # JAX's CPU backend ignores donation: the donated route copies back (and warns).
        warnings.filterwarnings("ignore", message=".*not updated in place.*",
                                category=S.ShimCopyWarning)
        yield args, t(c.output_gate)
    _eager.OUT_COPY_MAX_BYTES[0] = previous
    I.clear_import_cache()


def _bits(t):
    return t.view(torch.int16)


def _poisoned_out(q):
    return torch.full_like(q, float("nan"))


def test_out_routes_switch_at_the_threshold_and_write_out_in_place(case):
    args, gate = case
    want = S.qsa_sparse_paged_attention(*args, output_gate=gate).clone()
    out = _poisoned_out(args[0])
    ptr = out.data_ptr()
    for limit, route in ((out.nbytes, "copied"), (out.nbytes - 1, "donated"),
                         (-1, "donated"), (1 << 40, "copied")):
        S.set_out_copy_max_bytes(limit)
        _eager.OUT_ROUTES.reset()
        out.fill_(float("nan"))
        got = S.qsa_sparse_paged_attention(*args, out, output_gate=gate)
        assert got is out and out.data_ptr() == ptr, route
        assert vars(_eager.OUT_ROUTES) == {"copied": int(route == "copied"),
                                           "donated": int(route == "donated"), "signalled": 0}
        assert torch.equal(_bits(out), _bits(want)), f"{route} route wrote other values"


def test_copy_route_is_silent(case):
    """The copy route is the plan for small outputs, not a fallback: no ShimCopyWarning."""
    args, gate = case
    S.set_out_copy_max_bytes(1 << 20)
    out = _poisoned_out(args[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", S.ShimCopyWarning)
        S.qsa_sparse_paged_attention(*args, out, output_gate=gate)


def test_repeated_call_skips_checks_and_imports(case, monkeypatch):
    args, gate = case
    out = _poisoned_out(args[0])
    first = S.qsa_sparse_paged_attention(*args, out, output_gate=gate).clone()
    imports = len(I.PERSISTENT)

    def no_checks(*a, **k):
        raise AssertionError("checks ran on a cached call")

    monkeypatch.setattr(_checks, "check_sparse", no_checks)
    monkeypatch.setattr(I, "import_arg", no_checks)
    hits = _call_cache.SPARSE_CALLS.hits
    out.fill_(float("nan"))
    got = S.qsa_sparse_paged_attention(*args, out, output_gate=gate)
    assert _call_cache.SPARSE_CALLS.hits == hits + 1 and len(I.PERSISTENT) == imports
    assert torch.equal(_bits(got), _bits(first))


def _twin(t):
    """A new tensor object (its own root) on ``t``'s memory: a fresh activation."""
    return torch.empty((0,), dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(),
                                                 t.shape, t.stride())


def test_fresh_activations_reuse_the_call_and_its_imports(case, monkeypatch):
    """vLLM's q and gate are new tensor objects each step, at the same addresses: such a
    call is a call-cache hit that imports nothing, checks nothing and hands jit the same
    arrays (no retrace: the jitted call's cache size stays); it reads the new tensors'
    data; q's and the gate's imports never pin memory."""
    args, gate = case
    q = args[0]
    out = _poisoned_out(q)
    first = S.qsa_sparse_paged_attention(_twin(q), *args[1:], out, output_gate=_twin(gate)).clone()
    gc.collect()
    assert len(I.PERSISTENT) == 4  # fused KV, 3 metadata buffers: q and the gate are not pinned
    assert len(I.ACTIVATIONS) == 2
    imports = I.ACTIVATIONS.misses + I.PERSISTENT.misses
    from qsa_torch_shim import _jax_side as J
    traces = J.sparse_new._cache_size()
    hits = _call_cache.SPARSE_CALLS.hits

    def refuse(*a, **k):
        raise AssertionError("a fresh activation's call checked or imported again")

    monkeypatch.setattr(_checks, "check_sparse", refuse)
    monkeypatch.setattr(I, "to_jax", refuse)
    monkeypatch.setattr(I, "import_arg", refuse)
    for _ in range(3):
        out.fill_(float("nan"))
        got = S.qsa_sparse_paged_attention(_twin(q), *args[1:], out, output_gate=_twin(gate))
        assert torch.equal(_bits(got), _bits(first))
    assert _call_cache.SPARSE_CALLS.hits == hits + 3
    assert I.ACTIVATIONS.misses + I.PERSISTENT.misses == imports
    assert J.sparse_new._cache_size() == traces
    monkeypatch.undo()
    # A new q at the same address with other data: the hit reads the new data.
    q2 = _twin(q).copy_(torch.randn(q.shape, generator=torch.Generator().manual_seed(5)))
    got = S.qsa_sparse_paged_attention(q2, *args[1:], output_gate=_twin(gate)).clone()
    I.clear_import_cache()
    want = S.qsa_sparse_paged_attention(q2.clone(), *args[1:], output_gate=gate.clone())
    assert torch.equal(_bits(got), _bits(want)) and not torch.equal(_bits(got), _bits(first))


def test_activation_imports_own_no_memory():
    """Freeing a tensor whose import is cached frees its memory: the import holds no
    reference to it, while the entry stays (it is keyed on the view)."""
    I.clear_import_cache()
    memory = bytearray(1 << 16)  # torch's storage over it holds a reference to it
    unreferenced = sys.getrefcount(memory)
    q = torch.frombuffer(memory, dtype=torch.float32)
    q = q[(-q.data_ptr() % 64) // 4:][:1024]  # JAX's CPU import aliases 64-byte aligned data
    q.copy_(torch.randn(q.shape))
    array = I.ACTIVATIONS.get(q)
    assert array.unsafe_buffer_pointer() == q.data_ptr()
    assert (array == q.numpy()).all()
    del q, array
    gc.collect()
    assert sys.getrefcount(memory) == unreferenced, "the cached import keeps the memory alive"
    assert len(I.ACTIVATIONS) == 1
    I.clear_import_cache()


def test_copied_arguments_are_not_cached(case):
    """An argument JAX cannot alias (here a misaligned q) is copied for the call; the copy
    is that call's data, so a repeated call with the same tensor, written in place since,
    must copy again rather than reuse the old copy."""
    args, gate = case
    q = args[0]
    buf = torch.empty(q.numel() + 32, dtype=q.dtype)
    shifted = buf[1:1 + q.numel()].view(q.shape).copy_(q)
    assert shifted.data_ptr() % 64
    with pytest.warns(S.ShimCopyWarning, match="aligned"):
        first = S.qsa_sparse_paged_attention(shifted, *args[1:], output_gate=gate).clone()
    shifted.mul_(-0.5)
    with pytest.warns(S.ShimCopyWarning, match="aligned"):
        got = S.qsa_sparse_paged_attention(shifted, *args[1:], output_gate=gate)
    want = S.qsa_sparse_paged_attention(shifted.clone(), *args[1:], output_gate=gate)
    assert not torch.equal(_bits(got), _bits(first)), "a stale copy of q was reused"
    assert torch.equal(_bits(got), _bits(want))


def test_call_cache_misses_what_the_checks_or_imports_depend_on(case):
    args, gate = case
    S.qsa_sparse_paged_attention(*args, output_gate=gate)
    q, k, v, li, bt, t2r, flag = args
    # Another dtype of the same memory view: the checks run again and refuse it.
    with pytest.raises(AssertionError, match="token_to_req"):
        S.qsa_sparse_paged_attention(q, k, v, li, bt, t2r.view(torch.float32), flag,
                                     output_gate=gate)
    # Another root tensor object at the very same memory as an argument whose import owns
    # it (the metadata, the KV cache): a miss (that import is only valid while the tensor
    # it was made for lives), and the same answer. (q and the gate: the next test.)
    twin = _twin(bt)
    misses = _call_cache.SPARSE_CALLS.misses
    want = S.qsa_sparse_paged_attention(*args, output_gate=gate).clone()
    got = S.qsa_sparse_paged_attention(q, k, v, li, twin, t2r, flag, output_gate=gate)
    assert _call_cache.SPARSE_CALLS.misses == misses + 1
    assert torch.equal(_bits(got), _bits(want))
    # A scale that hashes by identity is never a key.
    assert _call_cache.sparse_key(q, k, v, li, bt, t2r, None, gate, torch.tensor(1.0), 1.0,
                                  "0.34") is None
    # The twin's entry replaced q's (one key) and dies with the twin; clear_import_cache
    # clears the call cache too.
    assert len(_call_cache.SPARSE_CALLS) == 1
    del twin, got
    gc.collect()
    assert len(_call_cache.SPARSE_CALLS) == 0
    S.qsa_sparse_paged_attention(*args, output_gate=gate)
    assert len(_call_cache.SPARSE_CALLS) == 1
    I.clear_import_cache()
    assert len(_call_cache.SPARSE_CALLS) == 0


class _FakeEvent:
    """A CUDA event stand-in: complete once ``done`` is set (or after ``synchronize``)."""

    def __init__(self):
        self.done = False
        self.waited = 0

    def record(self, stream):
        self.done = False

    def query(self):
        return self.done

    def synchronize(self):
        self.waited += 1
        self.done = True


class _FakeCudaResult:
    is_cuda = True

    def get_device(self):
        return 0


def test_copy_sources_live_until_the_copy_ran(monkeypatch):
    """A copy route's result (JAX memory) is held until the event after torch's copy has
    completed, and never more than ``limit`` of them (the oldest is waited for)."""
    events = []

    def new_event():
        events.append(_FakeEvent())
        return events[-1]

    monkeypatch.setattr(torch.cuda, "Event", new_event)
    monkeypatch.setattr(_eager.P, "current_stream", lambda index: "stream")
    held = _eager.CopySources(limit=2)
    a, b, c = _FakeCudaResult(), _FakeCudaResult(), _FakeCudaResult()
    held.hold(a)
    held.hold(b)
    assert len(held) == 2 and not any(e.waited for e in events)  # copies still "running"
    held.hold(c)  # over the limit: the oldest is waited for, then released
    assert len(held) == 2 and events[0].waited == 1
    events[1].done = events[2].done = True
    held.hold(a)  # completed ones are released (their events reused)
    assert len(held) == 1 and len(events) == 3
    held.hold(torch.zeros(1))  # CPU: the copy has finished when copy_ returns
    assert len(held) == 1


def test_copy_route_holds_its_source(case, monkeypatch):
    args, gate = case
    S.set_out_copy_max_bytes(1 << 20)
    seen = []
    monkeypatch.setattr(_eager.COPY_SOURCES, "hold", seen.append)
    out = _poisoned_out(args[0])
    S.qsa_sparse_paged_attention(*args, out, output_gate=gate)
    assert len(seen) == 1 and torch.equal(_bits(seen[0]), _bits(out))
    assert seen[0].data_ptr() != out.data_ptr()
