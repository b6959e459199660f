"""The shim against vLLM 0.34.0's surface: fp8 caches and scales, signatures of both
versions, install() beside either version.

Exception parity runs against the live 0.34.0 originals on CPU (their checks run
before any launch). fp8 results are checked against qsa_jax called directly on the
same arrays (the shim only converts).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import warnings

import numpy as np
import pytest
import torch

import qsa_jax
import qsa_torch_shim as S
from qsa_torch_shim import _interop as I
from qsa_torch_shim import _jax_side as J
from qsa_testing import golden, originals
from qsa_testing.torch_interop import kv_views, to_numpy, to_torch

PUBLIC = ("qsa_sparse_paged_attention", "qsa_compress_groups_with_ratio", "qsa_store_cache_rows",
          "warmup_qsa_sparse_paged_attention", "_select_config")


@pytest.fixture(autouse=True)
def _quiet_cpu_donation():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not updated in place.*", category=S.ShimCopyWarning)
        yield


def _fp8_args(dtype=torch.float8_e4m3fn, name="tp1_r16_s16"):
    """A golden case's inputs with its fused cache quantised to e4m3 (uint8: the same bytes),
    and NaN-free random scales of the kind a checkpoint carries."""
    case = next(c for c, _ in golden.sparse_attention_cases() if c.name == name)
    t = lambda x: to_torch(x, "cpu")  # noqa: E731
    kv = t(case.kv_cache).float().mul_(4).to(torch.float8_e4m3fn)  # spread over e4m3's range
    if dtype == torch.uint8:
        kv = kv.view(torch.uint8)
    k, v = kv_views(kv, case.head_dim)
    return kv, [t(case.q), k, v, t(case.logical_indices), t(case.block_table),
                t(case.token_to_req), case.use_prefill_config], t(case.output_gate)


def _call(fn, args, gate, out=None, k_scale=None, v_scale=None):
    return fn(*args, out, k_scale, v_scale, output_gate=gate)


# --- signatures and install ---------------------------------------------------------------

@pytest.mark.parametrize("version", originals.VERSIONS)
@pytest.mark.parametrize("name", PUBLIC)
def test_signature_matches_the_original(version, name):
    """Every parameter of the original, in its place, kind and default; the shim's extras
    (``implementation``, warmup's ``rows``...) only keyword-only with defaults."""
    orig = originals.load_or_skip(version)
    want = list(inspect.signature(getattr(orig, name)).parameters.values())
    got = list(inspect.signature(getattr(S.surface_module(version), name)).parameters.values())
    assert [(p.name, p.kind, p.default) for p in got[:len(want)]] == \
        [(p.name, p.kind, p.default) for p in want]
    for extra in got[len(want):]:
        assert extra.kind is inspect.Parameter.KEYWORD_ONLY and extra.default is not inspect.Parameter.empty, extra


@pytest.mark.parametrize("version,surface", [("0.30.0", "qsa_torch_shim.vllm_0_30"),
                                             ("0.30.2", "qsa_torch_shim.vllm_0_30"),
                                             ("0.34.0", "qsa_torch_shim"),
                                             ("0.31.0", "qsa_torch_shim")])
def test_install_puts_the_installed_versions_surface(version, surface):
    name = "qsa_test_fake_vllm.ops.qsa"
    sentinel = object()
    sys.modules[name] = sentinel
    try:
        with pytest.warns(RuntimeWarning, match="imported before"):
            assert S.install(name, vllm_version=version) is sentinel
        module = importlib.import_module(name)
        assert module.__name__ == surface
        assert module.qsa_sparse_paged_attention is not None
    finally:
        sys.modules.pop(name)


def test_install_reads_the_installed_vllm(monkeypatch):
    monkeypatch.setattr(S, "installed_vllm_version", lambda: "0.30.0")
    try:
        S.install("qsa_test_fake_vllm.ops.qsa")
        assert sys.modules["qsa_test_fake_vllm.ops.qsa"].__name__ == "qsa_torch_shim.vllm_0_30"
    finally:
        sys.modules.pop("qsa_test_fake_vllm.ops.qsa")


# --- exception parity with the live 0.34.0 originals ----------------------------------------

BAD_FP8 = {
    "no_scales": lambda a: (a, None, None),
    "no_v_scale": lambda a: (a, 0.5, None),
    "no_k_scale": lambda a: (a, None, 2.0),
    "uint8_no_scales": lambda a: (_swap_kv(a, torch.uint8), None, None),
    "kv_dtype_mismatch": lambda a: ([*a[:2], a[2].view(torch.uint8), *a[3:]], 0.5, 2.0),
    "q_fp16": lambda a: ([a[0].half(), *a[1:]], 0.5, 2.0),
    "q_fp8": lambda a: ([a[0].to(torch.float8_e4m3fn), *a[1:]], 0.5, 2.0),
    "kv_fp16_with_scales": lambda a: (_swap_kv(a, torch.float16), 0.5, 2.0),
    "kv_int8_with_scales": lambda a: (_swap_kv(a, torch.int8), 0.5, 2.0),
    "scale_not_a_number": lambda a: (a, "half", 2.0),
    "scale_object": lambda a: (a, 0.5, object()),
    "nan_scale_and_int64_indices": lambda a: ([*a[:3], a[3].long(), *a[4:]], float("nan"), 2.0),
    "nan_scale_and_bad_shape": lambda a: ([a[0][:, :1], *a[1:]], float("nan"), 2.0),
    # NumPy arrays for tensors (the originals assert on their dtypes; the shim once failed in
    # its routing with an AttributeError).
    "numpy_q": lambda a: ([a[0].float().numpy(), *a[1:]], 0.5, 2.0),
    "numpy_indices": lambda a: ([*a[:3], a[3].numpy(), *a[4:]], 0.5, 2.0),
}


def _swap_kv(a, dtype):
    """The same K/V views in another cache dtype (a byte view, or a converted copy)."""
    swap = (lambda t: t.view(dtype)) if dtype.itemsize == 1 else (lambda t: t.to(dtype))  # noqa: E731
    return [a[0], swap(a[1]), swap(a[2]), *a[3:]]


@pytest.mark.parametrize("name", sorted(BAD_FP8))
def test_fp8_exception_parity_with_0_34(name):
    orig = originals.load_or_skip("0.34.0")
    _, a, gate = _fp8_args()
    args, ks, vs = BAD_FP8[name](a)
    with pytest.raises(Exception) as expected:
        _call(orig.qsa_sparse_paged_attention, args, gate, None, ks, vs)
    assert not isinstance(expected.value, (ImportError, AttributeError, RuntimeError)), expected.value
    with pytest.raises(type(expected.value)) as got:
        _call(S.qsa_sparse_paged_attention, args, gate, None, ks, vs)
    assert type(got.value) is type(expected.value), (got.value, expected.value)


@pytest.mark.parametrize("which", ["k_scale", "v_scale"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 0.0, -0.5,
                                   np.float32("nan"), torch.tensor(float("nan")),
                                   1e39, 1e-46, 1e-39])  # inf, 0 and subnormal as the kernels' fp32
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8])
def test_bad_scale_values_raise_value_error_naming_the_argument(which, value, dtype, monkeypatch):
    """Where 0.34 defines nothing (it folds the scale in unchecked): ValueError, before launch."""
    launched = []
    monkeypatch.setattr(J, "sparse_new", lambda *a, **k: launched.append(1))
    monkeypatch.setattr(J, "sparse_into", lambda *a, **k: launched.append(1))
    _, a, gate = _fp8_args(dtype)
    scales = {"k_scale": 0.5, "v_scale": 2.0, which: value}
    with pytest.raises(ValueError, match=which):
        _call(S.qsa_sparse_paged_attention, a, gate, None, scales["k_scale"], scales["v_scale"])
    assert not launched


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8])
def test_fp8_below_sm89_takes_the_jax_route(dtype, monkeypatch):
    """Below sm_89 (A100: Triton has no e4m3 type; vLLM hands the cache over as uint8) the
    default triton-torch route must not launch its kernels on an fp8 cache: it takes qsa_jax's
    choice, which leaves XLA there. Simulated on CPU (the capability and the launch patched)."""
    from qsa_torch_shim import _direct, _eager

    kv, a, gate = _fp8_args(dtype)
    want = _call(S.qsa_sparse_paged_attention, a, gate, None, 0.5, 2.0)  # the JAX route (xla on CPU)
    launched = []
    monkeypatch.setattr(_direct, "reads_fp8", lambda device: False)
    monkeypatch.setattr(_direct, "sparse", lambda *args, **kw: launched.append(1))
    got = _eager.sparse_paged_attention_impl(*a[:7], None, gate, _direct.NAME, (0.5, 2.0))
    assert not launched
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    monkeypatch.setattr(_direct, "reads_fp8", lambda device: True)  # sm_89 on: the launch is tried
    _eager.sparse_paged_attention_impl(*a[:7], None, gate, _direct.NAME, (0.5, 2.0))
    assert launched


def test_bf16_cache_ignores_scales_like_0_34():
    """0.34 reads the scales of an fp8 cache only; a bf16 call with any scales is the plain call."""
    case = next(c for c, _ in golden.sparse_attention_cases() if c.name == "tp1_r3_s64_full")
    t = lambda x: to_torch(x, "cpu")  # noqa: E731
    k, v = kv_views(t(case.kv_cache), case.head_dim)
    args = [t(case.q), k, v, t(case.logical_indices), t(case.block_table), t(case.token_to_req), False]
    gate = t(case.output_gate)
    plain = _call(S.qsa_sparse_paged_attention, args, gate)
    for ks, vs in ((0.5, 2.0), (float("nan"), -1.0)):
        got = _call(S.qsa_sparse_paged_attention, args, gate, None, ks, vs)
        assert torch.equal(got.view(torch.int16), plain.view(torch.int16))


# --- fp8 results ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8])
@pytest.mark.parametrize("with_out", [False, True])
def test_fp8_matches_qsa_jax_on_the_same_arrays(dtype, with_out, monkeypatch):
    """The shim only converts: its result is qsa_jax's on the same (zero-copy) arrays,
    bit for bit; the fused fp8 buffer is imported whole, and nothing is copied."""
    import jax
    import jax.numpy as jnp

    kv, a, gate = _fp8_args(dtype)
    out = torch.full_like(a[0], float("nan")) if with_out else None
    I.clear_import_cache()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*copied for this call", category=S.ShimCopyWarning)
        got = _call(S.qsa_sparse_paged_attention, a, gate, out, 0.5, 2.0)
    if with_out:
        assert got is out
    assert any(arr.unsafe_buffer_pointer() == kv.data_ptr() and arr.shape == tuple(kv.shape)
               for _, arr in I.PERSISTENT._entries.values()), "the fused fp8 cache was not imported whole"
    j = lambda x: jax.dlpack.from_dlpack(x.contiguous())  # noqa: E731
    want = qsa_jax.sparse_attention(j(a[0]), j(kv), j(a[3]), j(a[4]), j(a[5]), j(gate),
                                    use_prefill_config=a[6], k_scale=jnp.float32(0.5),
                                    v_scale=jnp.float32(2.0))
    want = to_torch(np.asarray(want), "cpu")
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert np.isfinite(to_numpy(got).astype(np.float32)).all()


def test_fp8_score_multiplier_is_rounded_from_float64_at_d128():
    """The shim's JAX route hands its host scales over prepared (``qsa_jax.kv_scales``): at
    D = 128, where D^-0.5 is not a power of two, its result is qsa_jax's with host floats
    bit for bit -- 0.34.0's float64-rounded multiplier -- where traced fp32 scales (the
    shim before session 25) flip about 25 of these 131072 bf16 outputs at k_scale 3.3."""
    from qsa_testing import cases as C

    case = C.sparse_attention_case(np.random.default_rng(11), rows=64, num_query_heads=16,
                                   num_kv_heads=2, head_dim=128, page_size=8, selection_blocks=10,
                                   context_tokens=80)
    t = lambda x: to_torch(x, "cpu")  # noqa: E731
    kv = t(case.kv_cache).float().to(torch.float8_e4m3fn)
    k, v = kv_views(kv, case.head_dim)
    a = [t(case.q), k, v, t(case.logical_indices), t(case.block_table), t(case.token_to_req), False]
    got = _call(S.qsa_sparse_paged_attention, a, t(case.output_gate), None, 3.3, 2.0)
    kv_bytes = kv.view(torch.uint8).numpy()  # the same e4m3 codes (uint8: vLLM's own fp8 cache)
    want = qsa_jax.sparse_attention(case.q, kv_bytes, case.logical_indices, case.block_table,
                                    case.token_to_req, case.output_gate, k_scale=3.3, v_scale=2.0)
    assert torch.equal(got.view(torch.int16), to_torch(np.asarray(want), "cpu").view(torch.int16))


def test_fp8_scales_are_traced_not_compiled_in():
    """A model has a scale pair per layer: new scale values must not compile anew."""
    _, a, gate = _fp8_args()
    _call(S.qsa_sparse_paged_attention, a, gate, None, 0.5, 2.0)
    before = J.sparse_new._cache_size()
    r1 = _call(S.qsa_sparse_paged_attention, a, gate, None, 0.25, 4.0)
    r2 = _call(S.qsa_sparse_paged_attention, a, gate, None, 0.5, 2.0)
    assert J.sparse_new._cache_size() == before
    assert not torch.equal(r1, r2)  # the scales do reach the computation


def test_fp8_warmup_returns_0_34_summary():
    orig = originals.load_or_skip("0.34.0")
    case = next(c for c, _ in golden.sparse_attention_cases() if c.name == "tp1_r16_s16")
    kv = to_torch(case.kv_cache, "cpu").float().to(torch.float8_e4m3fn).view(torch.uint8)
    bt = to_torch(case.block_table, "cpu")
    got = S.warmup_qsa_sparse_paged_attention(kv, bt, num_query_heads=case.q.shape[1],
                                              selection_width=2051, rows=[1], with_out=False)
    hk = kv.shape[1]
    want = sorted({orig._select_config(r, hk, f, 2051, True) for r in range(1, 8193)
                   for f in (False, True)})
    assert got == tuple((bn, s, w) for bn, w, _, s in want)


@pytest.mark.gpu
def test_gpu_select_config_matches_0_34_on_this_device():
    """On a GPU, 0.34 picks its table by compute capability (sm_90: the H20-tuned one); the
    shim answers what qsa_jax's table gives, which must be the same."""
    orig = originals.load_or_skip("0.34.0")
    for rows in (1, 2, 8, 12, 16, 32, 64, 128, 256, 512, 1024, 1025, 2048, 4096):
        for hk in (1, 2):
            for flag in (False, True):
                for fp8 in (False, True):
                    assert S._select_config(rows, hk, flag, 2051, fp8) == \
                        orig._select_config(rows, hk, flag, 2051, fp8), (rows, hk, flag, fp8)


@pytest.mark.parametrize("gate_dtype", [torch.float32, torch.float16])
def test_float_gates_are_read_at_their_width(gate_dtype):
    """The originals take an fp16 or fp32 output_gate and read it as fp32; so does the shim
    (its result is qsa_jax's on the same arrays, bit for bit), and not as its bf16 rounding
    (the originals' own agreement: tests/test_originals_interpreter.py)."""
    import jax

    case = next(c for c, _ in golden.sparse_attention_cases() if c.name == "tp1_r16_s16")
    t = lambda x: to_torch(x, "cpu")  # noqa: E731
    k, v = kv_views(t(case.kv_cache), case.head_dim)
    args = [t(case.q), k, v, t(case.logical_indices), t(case.block_table), t(case.token_to_req),
            case.use_prefill_config]
    gen = torch.Generator().manual_seed(5)
    gate = (t(case.output_gate).float() * (0.9 + 0.2 * torch.rand(case.output_gate.shape, generator=gen))).to(
        gate_dtype)
    got = _call(S.qsa_sparse_paged_attention, args, gate)
    j = lambda x: jax.dlpack.from_dlpack(x.contiguous())  # noqa: E731
    want = to_torch(np.asarray(qsa_jax.sparse_attention(j(args[0]), j(t(case.kv_cache)), *map(j, args[3:6]), j(gate),
                                                        use_prefill_config=args[6])), "cpu")
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    rounded = _call(S.qsa_sparse_paged_attention, args, gate.to(torch.bfloat16))
    assert not torch.equal(got.view(torch.int16), rounded.view(torch.int16))
