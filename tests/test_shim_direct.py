"""The shim's ``implementation="triton-torch"`` (qsa_torch_shim/_direct.py): qsa_jax's jax-triton
kernels launched by Triton itself on the torch tensors.

On CPU the kernels run in Triton's interpreter, in a subprocess (the interpreter must be on
before triton is imported): ``python tests/test_shim_direct.py --interpret``. Each call is
checked against the shim's ``implementation="xla"`` on the same tensors under the fidelity
contract, on fresh random inputs with edge rows (invalid requests, -1 padding, empty rows) and
NaN in every unreferenced cache value, and with ``out`` filled with NaN first (also a
non-compact ``out``, which gets a copy): the fused cache's views, two compact caches, vLLM's strided q, e4m3 and uint8 caches with scales, one
split and several. The GPU timing is ``tools/profile_shim.py``'s (notes/shim.md).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def test_triton_torch_needs_cuda_tensors_outside_the_interpreter(monkeypatch):
    import qsa_torch_shim as S
    from qsa_testing import cases as C
    from qsa_testing.torch_interop import kv_views, to_torch

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rng = np.random.default_rng(1)
    case = C.sparse_attention_case(rng, name="cpu", rows=3, num_query_heads=4, num_kv_heads=2, head_dim=16,
                                   page_size=8, selection_blocks=4, context_tokens=32, num_requests=2)
    t = lambda x: to_torch(x, "cpu")  # noqa: E731
    k, v = kv_views(t(case.kv_cache), 16)
    with pytest.raises(NotImplementedError, match="triton-torch.*needs CUDA tensors"):
        S.qsa_sparse_paged_attention(t(case.q), k, v, t(case.logical_indices), t(case.block_table),
                                     t(case.token_to_req), False, output_gate=t(case.output_gate),
                                     implementation="triton-torch")


def test_process_default_implementation(monkeypatch):
    """``set_sparse_implementation`` sets the implementation of calls that name none (how an
    installed shim under vLLM picks a route); a call's own ``implementation=`` wins; "jax" is
    the JAX route with qsa_jax's choice; bad names raise, naming the argument or the variable."""
    import qsa_torch_shim as S
    from qsa_testing import cases as C
    from qsa_testing.torch_interop import kv_views, to_torch
    from qsa_torch_shim import _direct, _eager

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(_eager, "SPARSE_IMPLEMENTATION", [None])
    rng = np.random.default_rng(2)
    case = C.sparse_attention_case(rng, name="cpu", rows=3, num_query_heads=4, num_kv_heads=2, head_dim=16,
                                   page_size=8, selection_blocks=4, context_tokens=32, num_requests=2)
    t = lambda x: to_torch(x, "cpu")  # noqa: E731
    k, v = kv_views(t(case.kv_cache), 16)
    args = (t(case.q), k, v, t(case.logical_indices), t(case.block_table), t(case.token_to_req), False)
    gate = t(case.output_gate)
    routes = vars(_direct.ROUTES).copy()
    want = S.qsa_sparse_paged_attention(*args, output_gate=gate)  # CPU tensors: the JAX route (xla)
    assert torch_equal(S.qsa_sparse_paged_attention(*args, output_gate=gate, implementation="jax"), want)
    assert vars(_direct.ROUTES) == routes  # neither went near the direct launch
    import torch

    S.register_torch_ops()  # the custom op takes the route names too
    assert torch_equal(torch.ops.qsa_shim.sparse_paged_attention(*args, gate, "jax"), want)
    S.set_sparse_implementation("triton-torch")
    with pytest.raises(NotImplementedError, match="triton-torch.*needs CUDA tensors"):
        S.qsa_sparse_paged_attention(*args, output_gate=gate)  # the default now names triton-torch
    got = S.qsa_sparse_paged_attention(*args, output_gate=gate, implementation="xla")
    assert torch_equal(got, want)
    S.set_sparse_implementation("jax")
    assert torch_equal(S.qsa_sparse_paged_attention(*args, output_gate=gate), want)
    S.set_sparse_implementation(None)
    assert torch_equal(S.qsa_sparse_paged_attention(*args, output_gate=gate), want)
    with pytest.raises(ValueError, match="name must be None or one of"):
        S.set_sparse_implementation("cuda")
    with pytest.raises(ValueError, match="implementation must be None or one of"):
        _eager.check_sparse_implementation("jax-triton")
    for value, ok in (("triton-torch", True), ("jax", True), ("fast", False)):
        done = subprocess.run([sys.executable, "-c", "import qsa_torch_shim._eager as e; print(e.SPARSE_IMPLEMENTATION)"],
                              cwd=REPO, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "QSA_SHIM_SPARSE_IMPLEMENTATION": value, "JAX_PLATFORMS": "cpu"})
        if ok:
            assert done.returncode == 0 and f"['{value}']" in done.stdout, done.stderr[-2000:]
        else:
            assert done.returncode != 0 and "QSA_SHIM_SPARSE_IMPLEMENTATION must be None or one of" in done.stderr


def test_default_route_per_device(monkeypatch):
    """With no process default: CUDA tensors take triton-torch where Triton can launch it,
    everything else (CPU tensors, or no usable Triton) the JAX route; an explicit name or the
    process default always wins, and "jax" hands qsa_jax None (its own choice)."""
    import torch

    from qsa_torch_shim import _direct, _eager

    monkeypatch.setattr(_eager, "SPARSE_IMPLEMENTATION", [None])
    monkeypatch.setattr(_eager, "_DEFAULT_ROUTES", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert _direct.why_not(cuda) is None, "triton must be importable in the test environment"
    assert _eager.default_route(cuda) == "triton-torch" and _eager.default_route(cpu) == "jax"
    assert _eager.sparse_route(None, cuda) == "triton-torch" and _eager.sparse_route(None, cpu) is None
    for name in ("pallas", "triton", "xla", "triton-torch"):
        assert _eager.sparse_route(name, cuda) == name == _eager.sparse_route(name, cpu)
    assert _eager.sparse_route("jax", cuda) is None
    monkeypatch.setattr(_eager, "SPARSE_IMPLEMENTATION", ["jax"])
    assert _eager.sparse_route(None, cuda) is None
    # Not where the kernels cannot run: no Triton, a GPU below sm_80, ROCm (whose torch also says "cuda").
    for patch in ((torch.cuda, "get_device_capability", lambda device=None: (7, 5)), (torch.version, "hip", "6.2"),
                  (_direct, "why_not", lambda device: "no triton here")):
        with monkeypatch.context() as m:
            m.setattr(_eager, "SPARSE_IMPLEMENTATION", [None])
            m.setattr(_eager, "_DEFAULT_ROUTES", {})
            m.setattr(*patch)
            assert _eager.default_route(cuda) == "jax", patch[1]
            assert _direct.default_reason(cuda) is not None


def test_warmup_follows_the_route(monkeypatch):
    """The shim's warmup runs its calls on the route a call naming no implementation takes, and
    by default one row count per tiling of the table that route launches: on triton-torch a bf16
    cache gets vLLM 0.30.0's tilings (``_direct.effective_table``), on the JAX route the shim's."""
    import torch

    from qsa_jax.config import first_rows
    from qsa_testing import cases as C
    from qsa_testing.torch_interop import to_torch
    from qsa_torch_shim import _direct, _eager, _warmup

    case = C.sparse_attention_case(np.random.default_rng(3), rows=2, num_query_heads=4, num_kv_heads=2,
                                   head_dim=16, page_size=8, selection_blocks=4, context_tokens=32)
    kv, bt = to_torch(case.kv_cache, "cpu"), to_torch(case.block_table, "cpu")
    from qsa_jax import config

    monkeypatch.setattr(config, "device_capability", lambda: (9, 0))  # the shim's table: the H200's
    seen = []
    monkeypatch.setattr(_eager, "sparse_paged_attention_impl",
                        lambda q, *a: seen.append((q.shape[0], a[-2])))
    want = {route: sorted(set(first_rows(2, 2051, table=table).values()))
            for route, table in (("triton-torch", "vllm-0.30"), (None, None))}
    assert want["triton-torch"] != want[None]  # the two tables differ in where tilings change
    for route in ("triton-torch", None):
        monkeypatch.setattr(_eager, "SPARSE_IMPLEMENTATION", [route or "jax"])
        seen.clear()
        _warmup.warmup(kv, bt, num_query_heads=4, selection_width=2051, with_out=False)
        assert sorted({rows for rows, _ in seen}) == want[route], route
        assert {impl for _, impl in seen} == {route}
    assert _direct.effective_table(None, torch.bfloat16) == "vllm-0.30"


def test_warmup_brings_the_gate_dtype(monkeypatch):
    """``warmup(gate_dtype=)`` warms the calls with that output gate dtype (an fp16 or fp32 gate
    is its own kernel signature on triton-torch: a CUDA-graph capture must not meet its first
    call); bf16 by default; another dtype raises TypeError before any call."""
    import torch

    from qsa_testing import cases as C
    from qsa_testing.torch_interop import to_torch
    from qsa_torch_shim import _eager, _warmup

    case = C.sparse_attention_case(np.random.default_rng(4), rows=2, num_query_heads=4, num_kv_heads=2,
                                   head_dim=16, page_size=8, selection_blocks=4, context_tokens=32)
    kv, bt = to_torch(case.kv_cache, "cpu"), to_torch(case.block_table, "cpu")
    seen = []
    monkeypatch.setattr(_eager, "sparse_paged_attention_impl", lambda q, *a: seen.append((a[-3].dtype, q.dtype)))
    for dtype in (None, torch.float16, torch.float32):
        seen.clear()
        kw = {} if dtype is None else {"gate_dtype": dtype}
        _warmup.warmup(kv, bt, num_query_heads=4, selection_width=2051, rows=[1, 3], with_out=False, **kw)
        assert set(seen) == {(dtype or torch.bfloat16, torch.bfloat16)} and len(seen) == 4, (dtype, seen)
    seen.clear()
    with pytest.raises(TypeError, match="gate_dtype"):
        _warmup.warmup(kv, bt, num_query_heads=4, selection_width=2051, rows=[1], gate_dtype=torch.int32)
    assert not seen


def torch_equal(a, b):
    import torch

    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_triton_torch_in_triton_interpreter():
    done = subprocess.run([sys.executable, __file__, "--interpret"], cwd=REPO, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "TRITON_INTERPRET": "1", "JAX_PLATFORMS": "cpu"})
    print(done.stdout[-4000:], done.stderr[-4000:])
    assert done.returncode == 0 and "DIRECT OK" in done.stdout


# ============================================================================ GPU

def _gpu_skip_reason():
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU: torch sees none"
    from qsa_jax.ops.sparse_attention import triton as tri

    return tri.why_not()


def _gpu_call(rows: int, kv_dtype: str, seed: int):
    """TP1 inputs at the real shapes (W = 2051, 64-token pages, a ~0.6 GB pool shared by
    8 requests), NaN in the pool's unreferenced pages."""
    import torch

    from qsa_jax import arg_specs
    from qsa_testing import cases as C
    from qsa_testing.torch_interop import kv_views, random_kv_pool, to_torch

    g = arg_specs.GEOMETRIES["TP1"]
    rng = np.random.default_rng(seed)
    case = C.sparse_attention_case(rng, rows=rows, num_query_heads=g.num_query_heads, num_kv_heads=g.num_kv_heads,
                                   head_dim=g.head_dim, page_size=g.page_size, selection_blocks=512,
                                   context_tokens=16384, num_requests=min(rows, 8), num_pages=600, make_cache=False)
    t = lambda x: to_torch(x, "cuda")  # noqa: E731
    kv = random_kv_pool(g, 600, seed=seed)
    used = torch.unique(t(case.block_table).clamp(min=0).long())
    unused = torch.ones(600, dtype=torch.bool, device="cuda")
    unused[used] = False
    kv[unused] = float("nan")
    scales = {}
    if kv_dtype == "e4m3":
        kv, scales = kv.to(torch.float8_e4m3fn), dict(k_scale=0.5, v_scale=2.0)
    k, v = kv_views(kv, g.head_dim)
    args = (t(case.q), k, v, t(case.logical_indices), t(case.block_table), t(case.token_to_req), False)
    return args, t(case.output_gate), scales


def _triton_route(*args, output_gate, **kw):
    """implementation="triton" (through JAX) at the tiling table triton-torch launches by
    default for this cache's dtype (``_direct.effective_table``), then the default again."""
    import qsa_torch_shim as S
    from qsa_torch_shim import _direct

    S.set_tiling_table(_direct.effective_table(None, args[1].dtype))
    try:
        return S.qsa_sparse_paged_attention(*args, output_gate=output_gate, implementation="triton", **kw)
    finally:
        S.set_tiling_table(None)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("rows", [1, 64, 1024, 2049])
def test_gpu_triton_torch_equals_the_jax_route(rows, kv_dtype):
    """The same kernels at the same tiling as implementation="triton" (through JAX, at the
    table triton-torch takes by default): the same bits, written into a NaN-filled ``out``
    in place."""
    reason = _gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    import torch

    import qsa_torch_shim as S
    from qsa_torch_shim import _direct

    args, gate, scales = _gpu_call(rows, kv_dtype, seed=rows)
    want = _triton_route(*args, output_gate=gate, **scales)
    out = torch.full_like(args[0], float("nan"))
    before = _direct.ROUTES.direct
    got = S.qsa_sparse_paged_attention(*args, out, output_gate=gate, implementation="triton-torch", **scales)
    torch.cuda.synchronize()
    assert got is out and _direct.ROUTES.direct == before + 1
    assert torch.isfinite(got).all()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("gate_dtype", ["float16", "float32"])
def test_gpu_triton_torch_float_gates(gate_dtype):
    """fp16 and fp32 gates launch directly since session 31 (they took the JAX route before):
    the same bits as implementation="triton" through JAX with that gate."""
    reason = _gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    import torch

    import qsa_torch_shim as S
    from qsa_torch_shim import _direct

    args, gate, _ = _gpu_call(64, "bf16", seed=7)
    gate = (gate.float() + 1e-3 * torch.randn_like(gate.float())).to(getattr(torch, gate_dtype))  # off bf16's grid
    want = _triton_route(*args, output_gate=gate)
    before = _direct.ROUTES.direct
    got = S.qsa_sparse_paged_attention(*args, output_gate=gate, implementation="triton-torch")
    torch.cuda.synchronize()
    assert _direct.ROUTES.direct == before + 1
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype,cap", [("bf16", None), ("e4m3", None), ("e4m3", 200)])
def test_gpu_jax_route_runs_the_torch_routes_cubins(kv_dtype, cap, monkeypatch):
    """JAX's launch (implementation="triton", at the table triton-torch takes) hands jaxlib the
    very cubin Triton's launcher compiled for the torch route (``qsa_jax.ops._triton_images``):
    the PTX of each kernel jax-triton lowers is one the torch route compiled, and the image
    carried for it equals that compiled kernel's cubin, byte for byte. With the register cap
    (``config.triton_fp8_register_cap``; 40 rows are a one-warp fp8 launch) both routes cap the
    split kernel alike: Triton's ``maxnreg`` there, the PTX directive here, the same cubin, at
    most ``cap`` registers, and the uncapped bits."""
    reason = _gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    import torch

    import qsa_torch_shim as S
    from qsa_jax import config
    from qsa_jax.ops import _triton_images as T
    from qsa_jax.ops.sparse_attention import gluon_kernels, triton_kernels
    from qsa_jax.ops.sparse_attention import triton as tri
    from qsa_jax.ops.sparse_attention.api import _run as jitted
    from qsa_torch_shim import _direct, _jax_side

    T.install()
    if T.unavailable_reason() is not None:
        pytest.skip(f"the image hook is not installed here: {T.unavailable_reason()}")
    carried, assemble = [], T.assemble_like_triton

    def spy(ptx, capability, enable_fp_fusion=True):
        image = assemble(ptx, capability, enable_fp_fusion)
        carried.append((ptx, image))
        return image

    args, gate, scales = _gpu_call(40, kv_dtype, seed=41)  # 40 rows: a signature no other test lowers
    uncapped = None
    if cap:
        uncapped = _triton_route(*args, output_gate=gate, **scales)
        monkeypatch.setattr(config, "triton_fp8_register_cap", lambda: cap)
    # The knob is read into the launch plans, and so into JAX's traced calls (the library's and the
    # shim's JAX route's) and the shim's signatures.
    caches = (jitted.clear_cache, _jax_side.sparse_new.clear_cache, _jax_side.sparse_into.clear_cache,
              tri._launch_plan.cache_clear, _direct._SIGNATURES.clear)
    for clear in caches:
        clear()
    monkeypatch.setattr(T, "assemble_like_triton", spy)
    try:
        want = _triton_route(*args, output_gate=gate, **scales)
        out = torch.full_like(args[0], float("nan"))
        S.qsa_sparse_paged_attention(*args, out, output_gate=gate, implementation="triton-torch", **scales)
        torch.cuda.synchronize()
    finally:
        for clear in caches:
            clear()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    if cap:
        assert torch.equal(want.view(torch.int16), uncapped.view(torch.int16))
        capped = [ptx for ptx, _ in carried if f".maxnreg {cap}" in ptx]
        assert len(capped) == 1, "exactly the split kernel is capped"
    compiled = {}
    for module in (triton_kernels, gluon_kernels):
        for fn in vars(module).values():
            for kernel_cache, *_ in getattr(fn, "device_caches", {}).values():
                compiled.update({ck.asm["ptx"]: ck for ck in kernel_cache.values()})
    assert carried, "the JAX route lowered nothing new: the signature was seen before in this process"
    for ptx, image in carried:
        assert ptx in compiled, "jax-triton's PTX is not one Triton's launcher compiled for the torch route"
        assert image == compiled[ptx].asm["cubin"]
    if cap:
        assert 0 < compiled[capped[0]].n_regs <= cap


@pytest.mark.gpu
def test_gpu_triton_torch_follows_torchs_stream():
    """Launched on torch's current stream: q written there after a long sleep is what the
    kernels read, and the output is complete when torch reads it next on that stream."""
    reason = _gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    import torch

    import qsa_torch_shim as S

    args, gate, _ = _gpu_call(2048, "bf16", seed=5)
    q_sets = [args[0].clone(), (-args[0]).clone()]
    expected = [_triton_route(qs, *args[1:], output_gate=gate).clone() for qs in q_sets]
    torch.cuda.synchronize()
    assert not torch.equal(expected[0], expected[1])
    from qsa_torch_shim import _private_api as P

    fast_before = P.TRITON_PATHS.fast
    side, q, out = torch.cuda.Stream(), torch.empty_like(args[0]), torch.empty_like(args[0])
    results = torch.empty((20,) + tuple(out.shape), dtype=out.dtype, device="cuda")
    with torch.cuda.stream(side):
        for it in range(20):
            torch.cuda._sleep(2_000_000)
            q.copy_(q_sets[it % 2])
            out.fill_(float("nan"))
            S.qsa_sparse_paged_attention(q, *args[1:], out, output_gate=gate, implementation="triton-torch")
            results[it].copy_(out)
    torch.cuda.synchronize()
    bad = [it for it in range(20) if not torch.equal(results[it], expected[it % 2])]
    assert not bad, f"iterations {bad} read stale inputs or unwritten output"
    assert P.TRITON_PATHS.fast > fast_before, P.TRITON_PATHS.last_reason  # the cached launch took torch's stream


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["bf16", "e4m3"])
def test_gpu_triton_torch_cached_launch(kv_dtype):
    """From the second call of a signature the compiled kernels are launched directly
    (``_private_api.TritonLaunch``): the same bits as the first (``kernel[grid]``) call, on
    fresh q and gate; a q whose pointer is not 16-byte aligned gets its own compiled kernel
    (Triton specialises on alignment) and the same bits as an aligned copy of it."""
    reason = _gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    import torch

    import qsa_torch_shim as S
    from qsa_torch_shim import _private_api as P

    args, gate, scales = _gpu_call(64, kv_dtype, seed=17)

    def call(q, g):
        out = torch.full_like(q, float("nan"))
        S.qsa_sparse_paged_attention(q, *args[1:], out, output_gate=g, implementation="triton-torch", **scales)
        torch.cuda.synchronize()
        return out

    from qsa_torch_shim import _direct

    _direct._SIGNATURES.clear()  # earlier tests of these shapes: this signature starts afresh
    P.TRITON_PATHS.reset()
    first = call(args[0], gate)  # through kernel[grid](...), which caches the compiled kernels
    assert P.TRITON_PATHS.jit >= 1 and P.TRITON_PATHS.fast == 0, vars(P.TRITON_PATHS)
    assert P.TRITON_PATHS.last_reason is None, P.TRITON_PATHS.last_reason
    q2, g2 = torch.randn_like(args[0].float()).to(torch.bfloat16), torch.randn_like(gate.float()).to(torch.bfloat16)
    jit = P.TRITON_PATHS.jit
    again, other = call(args[0], gate), call(q2, g2)
    assert P.TRITON_PATHS.jit == jit and P.TRITON_PATHS.fast >= 2  # split (+ merge) launches, cached
    assert torch.isfinite(again).all() and torch.equal(again.view(torch.int16), first.view(torch.int16))
    assert not torch.equal(other, first)
    want = _triton_route(q2, *args[1:], output_gate=g2, **scales)
    assert torch.equal(other.view(torch.int16), want.view(torch.int16))
    # q at a 2-byte offset: compact, but not 16-byte aligned
    flat = torch.empty(args[0].numel() + 1, dtype=torch.bfloat16, device="cuda")
    shifted = flat[1:].view(args[0].shape)
    shifted.copy_(q2)
    assert shifted.data_ptr() % 16 and shifted.is_contiguous()
    jit = P.TRITON_PATHS.jit
    got = call(shifted, g2)
    assert P.TRITON_PATHS.jit > jit  # a new alignment key: compiled (or looked up) by Triton
    assert torch.equal(got.view(torch.int16), other.view(torch.int16))
    call(shifted, g2)
    assert P.TRITON_PATHS.last_reason is None
    # The cached launch keeps no tensor of the call that filled it (q here, the outputs too).
    import gc
    import weakref

    gone = weakref.ref(flat)
    del flat, shifted, got
    gc.collect()
    assert gone() is None, "the cached launch holds a tensor of the call that compiled it"


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("rows", [4, 512])
def test_gpu_default_route_is_direct_and_captures_in_a_cuda_graph(rows, kv_dtype, monkeypatch):
    """A call that names no implementation on CUDA tensors launches directly (triton-torch),
    and a torch CUDA graph captures it: replayed on new q, gate, selections (and, for fp8,
    scales first seen inside the capture, whose pair is filled by the graph), every replay
    equals the eager call on the same inputs bit for bit. A splitting tiling at 4 rows, and
    at 512 rows a one-split one (bf16; fp8's table splits there too). Inside a capture, a call
    whose layout needs the JAX route raises (JAX's work cannot be captured)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: torch sees none")
    from qsa_torch_shim import _direct as direct

    reason = direct.default_reason(torch.device("cuda"))
    if reason:
        pytest.skip(reason)

    import qsa_torch_shim as S
    from qsa_torch_shim import _direct, _eager

    monkeypatch.setattr(_eager, "SPARSE_IMPLEMENTATION", [None])
    args, gate, scales = _gpu_call(rows, kv_dtype, seed=40 + rows)
    q, k, v, indices, table, requests, _ = args
    captured_scales = dict(k_scale=0.375, v_scale=3.0) if scales else {}
    key = (q.shape[-1], (0.375, 3.0), q.device)
    _direct._SCALES.pop(key, None)  # first seen inside the capture

    def call(out, **kw):
        return S.qsa_sparse_paged_attention(q, k, v, indices, table, requests, False, out, output_gate=gate, **kw)

    out = torch.full_like(q, float("nan"))
    before = _direct.ROUTES.direct
    for _ in range(2):  # the signature's plan, the compile, then the cached launch (outside the capture)
        call(out, **scales)
    torch.cuda.synchronize()
    assert _direct.ROUTES.direct == before + 2, "a call naming no implementation did not launch directly"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(out, **captured_scales)
    assert key not in _direct._SCALES or not scales  # the captured fills are not cached
    rng = np.random.default_rng(rows)
    fresh_inputs = [_gpu_call(rows, kv_dtype, seed=int(rng.integers(1 << 30))) for _ in range(2)]
    for fresh_args, fresh_gate, _ in fresh_inputs:
        for dst, src in ((q, fresh_args[0]), (indices, fresh_args[3]), (gate, fresh_gate)):
            dst.copy_(src)
        out.fill_(float("nan"))
        graph.replay()
        replayed = out.clone()
        want = call(torch.full_like(q, float("nan")), implementation="triton-torch", **captured_scales)
        torch.cuda.synchronize()
        assert torch.isfinite(replayed).all()
        assert torch.equal(replayed.view(torch.int16), want.view(torch.int16))
    # K/V as views of a [NB, P, Hk, 2D] buffer: the JAX route's layout, refused inside a capture.
    pairs = torch.cat([k.view(torch.uint8), v.view(torch.uint8)], dim=-1).contiguous().view(k.dtype)
    d = q.shape[-1]
    with pytest.raises(RuntimeError, match="cannot be captured in a CUDA graph"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            S.qsa_sparse_paged_attention(q, pairs[..., :d], pairs[..., d:], indices, table, requests, False, out,
                                         output_gate=gate, **captured_scales)


def test_triton_torch_bf16_takes_the_030_table_by_default():
    """A bf16 cache on the shim's default table launches vLLM 0.30.0's tiling (the library's
    H200 bf16 table is the Pallas kernel's); fp8 keeps the library's; a table the user set
    is kept."""
    torch = pytest.importorskip("torch")
    from qsa_torch_shim import _direct

    assert _direct.effective_table(None, torch.bfloat16) == "vllm-0.30"
    assert _direct.effective_table(None, torch.float8_e4m3fn) is None
    assert _direct.effective_table(None, torch.uint8) is None
    assert _direct.effective_table("vllm-0.34", torch.bfloat16) == "vllm-0.34"


def test_triton_launch_convention_is_the_one_cached():
    """The cached launch (``_private_api.TritonLaunch``) repeats what ``JITFunction.run``
    does after its lookup: ``CompiledKernel.run(gx, gy, gz, stream, function, packed_metadata,
    launch_metadata, enter_hook, exit_hook, *every parameter's value)``. This reads the
    installed Triton's source for that call, so an upgrade that changes it fails here (and
    on a version outside ``TRITON_FAST_VERSIONS`` the cached launch stays off)."""
    import inspect

    triton = pytest.importorskip("triton")
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.jit import JITFunction

    from qsa_torch_shim import _private_api as P

    source = " ".join(inspect.getsource(JITFunction.run).split())
    call = ("kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, "
            "launch_metadata, knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, "
            "*bound_args.values())")
    if not triton.__version__.startswith(P.TRITON_FAST_VERSIONS):
        assert P._triton_fast_reason() is not None
        pytest.skip(f"triton {triton.__version__}: the cached launch is off on it")
    assert call in source, "JITFunction.run's launch changed: recheck _private_api.TritonLaunch"
    assert "return kernel" in source  # kernel[grid](...) returns the compiled kernel
    getitem = " ".join(inspect.getsource(CompiledKernel.__getitem__).split())
    assert "self.run(grid[0], grid[1], grid[2], stream, self.function, self.packed_metadata" in getitem


def _variants(torch, case, C, kv_views, t):
    """(name, q, k, v, scales) of one case in each layout and cache dtype the route reads."""
    d = case.head_dim
    fused = t(case.kv_cache)
    qkv, start = C.qkv_with_query(case.q, case.kv_cache.shape[1], leading_heads=1)
    rows, heads = case.q.shape[:2]
    strided_q = t(qkv)[:, start:start + heads * d].view(rows, heads, d)
    assert not strided_q.is_contiguous()
    split = [fused[..., i * d:(i + 1) * d].transpose(1, 2).contiguous() for i in range(2)]
    e4m3 = fused.float().mul(4).to(torch.float8_e4m3fn)
    yield "fused", t(case.q), *kv_views(fused, d), None
    yield "strided_q", strided_q, *kv_views(fused, d), None
    yield "split", t(case.q), *split, None
    yield "e4m3", t(case.q), *kv_views(e4m3, d), (0.5, 2.0)
    yield "e4m3_bytes", t(case.q), *kv_views(e4m3.view(torch.uint8), d), (0.5, 2.0)
    # Another pair after the first: the route caches the pair's device tensor per value.
    yield "e4m3_other_scales", t(case.q), *kv_views(e4m3, d), (0.25, 1.0)


def interpret_main() -> int:
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import warnings

    import torch
    import triton  # noqa: F401  (before the kernels: interpreter mode)

    from qsa_testing.triton_interpreter import patch_interpreter

    patch_interpreter()
    import qsa_torch_shim as S
    from qsa_jax.config import select_config
    from qsa_torch_shim import _direct
    from qsa_testing import cases as C
    from qsa_testing.agreement import assert_fidelity
    from qsa_testing.torch_interop import kv_views, to_numpy, to_torch

    warnings.simplefilter("ignore", S.ShimCopyWarning)  # the xla reference's CPU copy-back
    t = lambda x: to_torch(x, "cpu")  # noqa: E731
    seed = int(os.environ.get("QSA_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"seed {seed} (QSA_SEED={seed} replays it)")
    rng = np.random.default_rng(seed)
    plans = set()
    calls = 0
    for rows in (10, 160):  # 20 programs: several splits; 320: one split (asserted below)
        case = C.small_edge_case(rng, f"direct{rows}", rows=rows)
        splits = select_config(rows, 2, False, case.selection_width).num_splits
        meta = [t(case.logical_indices), t(case.block_table), t(case.token_to_req), False]
        gate = t(case.output_gate)
        for name, q, k, v, scales in _variants(torch, case, C, kv_views, t):
            extra = {} if scales is None else dict(k_scale=scales[0], v_scale=scales[1])
            want = S.qsa_sparse_paged_attention(q, k, v, *meta, output_gate=gate, implementation="xla", **extra)
            for with_out in (False, True):
                out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16) if with_out else None
                before = _direct.ROUTES.direct
                got = S.qsa_sparse_paged_attention(q, k, v, *meta, out, output_gate=gate,
                                                   implementation="triton-torch", **extra)
                assert _direct.ROUTES.direct == before + 1, f"{name}: not the direct route"
                assert got is out or out is None
                calls += 1
                res = assert_fidelity(to_numpy(got), to_numpy(want), what=f"{name} rows={rows} out={with_out}")
                print(f"direct {name} rows={rows} splits={splits} out={with_out} rel_err={res['rel_err']:.2e}")
            if name == "fused":  # a non-compact out: the kernel writes a temporary, torch copies
                wide = torch.full(q.shape[:2] + (2 * q.shape[2],), float("nan"), dtype=torch.bfloat16)
                out = wide[..., : q.shape[2]]
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", S.ShimCopyWarning)
                    got = S.qsa_sparse_paged_attention(q, k, v, *meta, out, output_gate=gate,
                                                       implementation="triton-torch", **extra)
                assert got is out and any("out is not compact" in str(w.message) for w in caught)
                assert torch.isnan(wide[..., q.shape[2]:]).all()  # nothing written beside the view
                assert_fidelity(to_numpy(got), to_numpy(want), what=f"non-compact out rows={rows}")
                calls += 1
            plans.add(splits == 1)
    assert plans == {True, False}, "both the one-split and the merge launch must run"
    # fp16 and fp32 gates (vLLM's reads any float gate as fp32) launch directly too, and
    # match the XLA reference on a gate off bf16's grid.
    case = C.sparse_attention_case(rng, name="gates", rows=4, num_query_heads=4, num_kv_heads=2, head_dim=16,
                                   page_size=8, selection_blocks=4, context_tokens=32, num_requests=2)
    k, v = kv_views(t(case.kv_cache), 16)
    meta = (t(case.logical_indices), t(case.block_table), t(case.token_to_req), False)
    off_grid = torch.from_numpy(C.off_grid_gate(rng, case.output_gate).astype(np.float32))
    for gate in (off_grid.half(), off_grid):
        before = _direct.ROUTES.direct
        got = S.qsa_sparse_paged_attention(t(case.q), k, v, *meta, output_gate=gate, implementation="triton-torch")
        want = S.qsa_sparse_paged_attention(t(case.q), k, v, *meta, output_gate=gate, implementation="xla")
        assert _direct.ROUTES.direct == before + 1, f"a {gate.dtype} gate did not launch directly"
        assert_fidelity(to_numpy(got), to_numpy(want), what=f"{gate.dtype} gate")
    calls += 2
    # Layouts the kernels cannot read in place take the JAX route: jax-triton where it runs,
    # else qsa_jax's default (here, without a GPU: xla).
    case = C.sparse_attention_case(rng, name="fallback", rows=4, num_query_heads=4, num_kv_heads=2, head_dim=16,
                                   page_size=8, selection_blocks=4, context_tokens=32, num_requests=2)
    # K/V as views of a [NB, P, Hk, 2D] buffer (vLLM's operator test builds that layout): neither
    # the fused cache's views nor compact caches.
    pairs = t(case.kv_cache).transpose(1, 2).contiguous()
    args = (t(case.q), pairs[..., :16], pairs[..., 16:], t(case.logical_indices), t(case.block_table),
            t(case.token_to_req), False)
    gate = t(case.output_gate)
    got = S.qsa_sparse_paged_attention(*args, output_gate=gate, implementation="triton-torch")
    want = S.qsa_sparse_paged_attention(*args, output_gate=gate, implementation="xla")
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert _direct.ROUTES.fallback == 1 and _direct.ROUTES.direct == calls
    # Inside a CUDA-graph capture that fallback would run JAX's work in it: refused, with the reason.
    from qsa_torch_shim import _eager

    real_capturing, _eager.capturing = _eager.capturing, lambda device: True
    try:
        S.qsa_sparse_paged_attention(*args, output_gate=gate, implementation="triton-torch")
        raise AssertionError("the JAX fallback ran inside a (pretended) capture")
    except RuntimeError as exc:
        assert "cannot be captured in a CUDA graph" in str(exc), exc
    finally:
        _eager.capturing = real_capturing
    assert _direct.ROUTES.fallback == 2  # the refused call was one more fallback
    _direct.ROUTES.fallback = 1
    # The call-signature cache keys on strides: K of one fused buffer with V of another has the
    # strides of a fused pair, so each hit re-checks the pair (else V would be read from K's).
    fused_a = t(case.kv_cache)
    fused_b = fused_a.clone()
    fused_b[..., 16:] = -fused_b[..., 16:]
    (k_a, v_a), (_, v_b) = kv_views(fused_a, 16), kv_views(fused_b, 16)
    meta = args[3:]
    for k, v, route in ((k_a, v_a, "direct"), (k_a, v_b, "fallback"), (k_a, v_a, "direct")):
        before = (_direct.ROUTES.direct, _direct.ROUTES.fallback)
        got = S.qsa_sparse_paged_attention(args[0], k, v, *meta, output_gate=gate, implementation="triton-torch")
        want = S.qsa_sparse_paged_attention(args[0], k, v, *meta, output_gate=gate, implementation="xla")
        assert_fidelity(to_numpy(got), to_numpy(want), what=f"mixed buffers, {route}")
        moved = (_direct.ROUTES.direct - before[0], _direct.ROUTES.fallback - before[1])
        assert moved == ((1, 0) if route == "direct" else (0, 1)), (route, moved)
    # torch.compile: the custom op's body launches the kernels directly too (the fake tensor
    # traced, the real call at run time), with the same bits as the eager call.
    S.register_torch_ops()

    def doubled(*a):
        return S.qsa_sparse_paged_attention(*a[:-1], False, output_gate=a[-1], implementation="triton-torch") * 2

    tensors = (args[0], k_a, v_a, *meta[:3], gate)
    compiled = torch.compile(doubled, backend="aot_eager", fullgraph=True)
    want = doubled(*tensors)
    before = _direct.ROUTES.direct
    got = compiled(*tensors)
    assert _direct.ROUTES.direct == before + 1, "the compiled call did not launch directly"
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    print("DIRECT OK")
    return 0


if __name__ == "__main__" and "--interpret" in sys.argv:
    sys.exit(interpret_main())
