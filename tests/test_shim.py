"""qsa_torch_shim: the drop-in torch module over qsa_jax.

CPU: torch CPU tensors through the shim onto JAX's CPU backend, checked against
the golden files recorded from the originals; exception parity with the REAL
originals for sparse attention and ``_select_config`` (their checks run before
any CUDA launch); recorded expectations for compress/store checks (the
originals refuse CPU tensors first); zero-copy, int64 exactness, import-cache
invalidation, torch.compile.

GPU (marker ``gpu``): parity with the originals through the identical call at
real shapes, pointer identity of in-place writes, a stream race test, and a
memory test.
"""

from __future__ import annotations

import gc
import inspect
import warnings

import numpy as np
import pytest
import torch

import qsa_torch_shim as S
from qsa_torch_shim import _interop as I
from qsa_torch_shim._call_cache import SPARSE_CALLS
from qsa_testing import cases as C
from qsa_testing import golden, oracle
from qsa_testing.agreement import assert_fidelity
from qsa_testing.torch_interop import kv_views, random_kv_pool, to_numpy, to_torch

SPARSE = golden.sparse_attention_cases()
COMPRESS = golden.compress_cases()
STORE = golden.store_cases()


def _cpu(x):
    return to_torch(x, "cpu")


@pytest.fixture(autouse=True)
def _quiet_cpu_donation():
    # JAX's CPU backend never honours donation: the shim copies back (warned once).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not updated in place.*", category=S.ShimCopyWarning)
        yield


def _sparse_args(case, device="cpu"):
    t = lambda x: to_torch(x, device)  # noqa: E731
    kv = t(case.kv_cache)
    k, v = kv_views(kv, case.head_dim)
    return kv, dict(q=t(case.q), k_cache=k, v_cache=v, logical_indices=t(case.logical_indices),
                    block_table=t(case.block_table), token_to_req=t(case.token_to_req),
                    use_prefill_config=case.use_prefill_config), t(case.output_gate)


def _call_sparse(fn, a, gate, out=None, **kw):
    return fn(a["q"], a["k_cache"], a["v_cache"], a["logical_indices"], a["block_table"],
              a["token_to_req"], a["use_prefill_config"], out, output_gate=gate, **kw)


# ----------------------------------------------------------------------------- CPU: goldens

@pytest.mark.parametrize("mode", ["fused_out", "fused_new", "split"])
@pytest.mark.parametrize("case,expected", SPARSE, ids=[c.name for c, _ in SPARSE])
def test_sparse_golden(case, expected, mode):
    kv, a, gate = _sparse_args(case)
    if mode == "split":  # genuinely separate compact caches
        a["k_cache"], a["v_cache"] = (_cpu(x) for x in case.split_caches())
    out = torch.full_like(a["q"], float("nan")) if mode == "fused_out" else None
    got = _call_sparse(S.qsa_sparse_paged_attention, a, gate, out)
    if out is not None:
        assert got is out
    assert got.dtype == torch.bfloat16 and got.shape == a["q"].shape
    assert_fidelity(to_numpy(got), expected, what=f"shim/{mode}/{case.name}")


def _compress_torch(case, *, packed=False):
    t = _cpu
    a = dict(raw_keys=t(case.raw_keys), raw_positions=t(case.raw_positions.astype(np.int64)),
             compressor_state_cache=t(case.compressor_state_cache),
             compressor_state_block_table=t(case.compressor_state_block_table),
             token_to_req=t(case.token_to_req), query_start_loc=t(case.query_start_loc),
             logical_positions=t(case.logical_positions), compressed_slots=t(case.compressed_slots),
             compress_ratio=case.compress_ratio,
             rope_cache=None if case.rope_cache is None else t(case.rope_cache.astype(np.int64)))
    if packed:  # vLLM's ring: storage rows of Dk keys + 3 int64 positions (12 bf16 slots)
        bs, s, _, dk = case.compressor_state_cache.shape
        store = torch.zeros((bs, s, 1, dk + 12), dtype=torch.bfloat16)
        store[..., :dk] = a["compressor_state_cache"]
        rope_view = store[..., dk:].view(torch.int64)
        rope_view.copy_(a["rope_cache"])
        a["compressor_state_cache"], a["rope_cache"] = store[..., :dk], rope_view
        a["_store"] = store
    return a


def _compress_call(a, **kw):
    a = {k: v for k, v in a.items() if not k.startswith("_")}
    return S.qsa_compress_groups_with_ratio(**a, **kw)


@pytest.mark.parametrize("case,pooled,first", COMPRESS, ids=[c.name for c, _, _ in COMPRESS])
def test_compress_golden(case, pooled, first):
    got_pooled, got_first = _compress_call(_compress_torch(case))
    assert got_first.dtype == torch.int64 and got_first.shape == (case.raw_keys.shape[0], 3)
    np.testing.assert_array_equal(to_numpy(got_pooled).view(np.uint16), pooled.view(np.uint16))
    np.testing.assert_array_equal(to_numpy(got_first), first)


@pytest.mark.parametrize("case,pooled,first", [c for c in COMPRESS if c[0].rope_cache is not None
                                               and c[0].raw_keys.shape[0]],
                         ids=lambda c: getattr(c, "name", ""))
def test_compress_packed_ring_is_imported_whole(case, pooled, first, monkeypatch):
    a = _compress_torch(case, packed=True)
    imported = _record_imports(monkeypatch)
    I.clear_import_cache()
    got_pooled, got_first = _compress_call(a)
    np.testing.assert_array_equal(to_numpy(got_pooled).view(np.uint16), pooled.view(np.uint16))
    np.testing.assert_array_equal(to_numpy(got_first), first)
    assert a["_store"].data_ptr() in imported, "the packed ring storage was not imported whole"


def test_compress_with_a_rope_cache_pools_once(monkeypatch):
    """With a rope cache the first positions' int64 words are selected in two passes (low, then
    high words); only the first runs the kernel, the high words' pass is XLA's, whose unused
    pooling XLA drops. Traced with Pallas (interpret mode here): one pallas_call, where the
    kernel used to run for both passes; and the result is the golden one."""
    import jax

    from qsa_torch_shim import _jax_side as J

    case, pooled, first = next(c for c in COMPRESS if c[0].rope_cache is not None and c[0].raw_keys.shape[0])
    seen = {}
    real = J.compress

    def spy(*args, **kwargs):
        seen["args"], seen["kw"] = args, kwargs
        return real(*args, **kwargs)

    monkeypatch.setattr(J, "compress", spy)
    got_pooled, got_first = _compress_call(_compress_torch(case, packed=True), implementation="pallas")
    np.testing.assert_array_equal(to_numpy(got_pooled).view(np.uint16), pooled.view(np.uint16))
    np.testing.assert_array_equal(to_numpy(got_first), first)
    kw = {k: v for k, v in seen["kw"].items() if k != "ffi_fence"}
    assert kw["rope_mode"] == "packed" and kw["implementation"] == "pallas", kw
    def kernels(jaxpr) -> int:  # pallas_call equations, counted at every call site
        return sum((eqn.primitive.name == "pallas_call")
                   + sum(kernels(sub) for sub in jax.extend.core.jaxprs_in_params(eqn.params))
                   for eqn in jaxpr.eqns)

    closed = jax.make_jaxpr(lambda *a: J._compress(*a, **kw))(*seen["args"][1:])
    assert kernels(closed.jaxpr) == 1, kernels(closed.jaxpr)


@pytest.mark.parametrize("field", ["token_to_req", "compressor_state_block_table"])
def test_compress_int64_metadata_past_int32_saturates(field):
    """int64 request ids and ring blocks beyond int32 are out of range, as in the originals:
    the shim narrows them by saturation, never by wrapping (2**32 + r would wrap to the valid
    request r, and -2**32 + b to the valid block b)."""
    rng = np.random.default_rng()
    case = C.compress_case(rng, chunk_lens=[5, 1, 9, 3], with_rope=True, ring=8)
    values = getattr(case, field).astype(np.int64)
    flat = values.reshape(-1)
    flat[::2] += 2**32
    flat[1::4] -= 2**32
    setattr(case, field, values)
    a = _compress_torch(case)
    for name in ("compressor_state_block_table", "token_to_req", "query_start_loc", "compressed_slots"):
        a[name] = _cpu(np.asarray(getattr(case, name), np.int64))
    args = [getattr(case, k) for k in (
        "raw_keys", "raw_positions", "compressor_state_cache", "compressor_state_block_table",
        "token_to_req", "query_start_loc", "logical_positions", "compressed_slots")]
    ref_pooled, ref_first = oracle.compress_groups_oracle(*args, case.compress_ratio, case.rope_cache)
    got_pooled, got_first = _compress_call(a)
    np.testing.assert_array_equal(to_numpy(got_pooled).astype(np.float64), ref_pooled)
    np.testing.assert_array_equal(to_numpy(got_first), ref_first)


@pytest.mark.parametrize("offset", [2**31 - 20, 2**32 + 3, 2**40 + 5, -(2**33)])
@pytest.mark.parametrize("rope", [True, False])
def test_compress_int64_positions_stay_exact(offset, rope):
    """Positions around and beyond 2**31 (and int64 metadata) are not narrowed."""
    rng = np.random.default_rng(abs(offset) % 1000 + rope)
    case = C.compress_case(rng, chunk_lens=[5, 1, 9, 3], with_rope=rope, ring=8, edge=True)
    lp = case.logical_positions.astype(np.int64) + offset
    case.logical_positions = lp
    case.raw_positions = case.raw_positions.astype(np.int64) + offset
    if rope:
        case.rope_cache = case.rope_cache.astype(np.int64) + offset
    a = _compress_torch(case)
    for name in ("compressor_state_block_table", "token_to_req", "query_start_loc",
                 "compressed_slots"):
        a[name] = a[name].to(torch.int64)  # vLLM passes int64 metadata too
    args = {k: case.__dict__[k] for k in (
        "raw_keys", "raw_positions", "compressor_state_cache", "compressor_state_block_table",
        "token_to_req", "query_start_loc", "logical_positions", "compressed_slots")}
    ref_pooled, ref_first = oracle.compress_groups_oracle(*args.values(), case.compress_ratio,
                                                          case.rope_cache)
    got_pooled, got_first = _compress_call(a)
    np.testing.assert_array_equal(to_numpy(got_pooled).astype(np.float64), ref_pooled)
    np.testing.assert_array_equal(to_numpy(got_first), ref_first)
    if offset > 0:
        assert (to_numpy(got_first) >= 2**31 - 40).any() or offset < 2**31


@pytest.mark.parametrize("case,expected", STORE, ids=[c.name for c, _ in STORE])
def test_store_golden_in_place(case, expected):
    cache = _cpu(case.cache)
    ptr = cache.data_ptr()
    assert S.qsa_store_cache_rows(cache, _cpu(case.slot_mapping.astype(np.int64)), _cpu(case.rows)) is None
    assert cache.data_ptr() == ptr
    np.testing.assert_array_equal(to_numpy(cache).view(np.uint16), expected.view(np.uint16))


def test_store_int64_slots_are_not_wrapped():
    """A slot 2**32 + s must be skipped, not narrowed to s."""
    rng = np.random.default_rng(3)
    case = C.store_case(rng, n=40, pages=4, page_size=8, width=140)
    slots = case.slot_mapping.astype(np.int64)
    slots[::3] += 2**32
    slots[1::7] = -(2**32) + 5
    cache = _cpu(case.cache)
    S.qsa_store_cache_rows(cache, _cpu(slots), _cpu(case.rows))
    expected = oracle.store_cache_rows_oracle(case.cache, slots, case.rows)
    np.testing.assert_array_equal(to_numpy(cache).view(np.uint16), np.asarray(expected).view(np.uint16))


# ----------------------------------------------------------------------------- CPU: parity of checks

@pytest.fixture(scope="module")
def orig():
    from qsa_testing import originals

    return originals.load_or_skip()


@pytest.fixture
def tiling_030():
    """The shim on vLLM 0.30.0's tiling (any GPU), for fidelity against 0.30.0's originals."""
    S.set_tiling_table("vllm-0.30")
    yield
    S.set_tiling_table(None)


def test_set_tiling_table_reaches_the_jax_call(monkeypatch):
    """The table set on the shim is what the jitted call receives (as its static ``table``)."""
    from qsa_torch_shim import _jax_side as J

    seen = []
    real = J.sparse_new

    def spy(*args, **kwargs):
        seen.append(kwargs.get("table"))
        return real(*args, **kwargs)

    monkeypatch.setattr(J, "sparse_new", spy)
    case = C.sparse_attention_case(np.random.default_rng(), rows=2, num_query_heads=4, num_kv_heads=2,
                                   head_dim=16, page_size=8, selection_blocks=4, context_tokens=32)
    _, a, gate = _sparse_args(case)
    try:
        for table in ("vllm-0.30", None, "vllm-0.34"):
            S.set_tiling_table(table)
            _call_sparse(S.qsa_sparse_paged_attention, a, gate)
    finally:
        S.set_tiling_table(None)
    assert seen == ["vllm-0.30", None, "vllm-0.34"]
    with pytest.raises(ValueError, match="table"):
        S.set_tiling_table("gb300")


@pytest.fixture(scope="module", params=["0.30.0", "0.34.0"])
def versioned(request):
    """(vLLM ``version``'s originals, the shim surface ``install()`` puts beside that version)."""
    from qsa_testing import originals

    return originals.load_or_skip(request.param), S.surface_module(request.param)


def test_select_config_matches_original(versioned):
    orig, surface = versioned
    fp8_flags = (False, True) if "is_fp8" in inspect.signature(orig._select_config).parameters \
        else (None,)
    for rows in list(range(0, 70)) + [100, 128, 129, 256, 257, 512, 513, 1024, 1025, 2048, 2049,
                                      4096, 8192, -3]:
        for hk in (1, 2, 3):
            for flag in (False, True):
                for cols in (-5, 0, 1, 31, 32, 33, 67, 259, 2051):
                    for fp8 in fp8_flags:
                        extra = () if fp8 is None else (fp8,)
                        assert surface._select_config(rows, hk, flag, cols, *extra) == \
                            orig._select_config(rows, hk, flag, cols, *extra), (rows, hk, flag, cols, fp8)


def _bad_sparse_inputs():
    """(name, mutate(args, gate) -> (args, gate, out)) for inputs the originals reject."""
    def m(fn):
        return fn

    def strided(t, dim):  # same values, non-unit stride in ``dim``
        big = torch.repeat_interleave(t, 2, dim=dim)
        return big.narrow(dim, 0, big.shape[dim]).index_select(dim, torch.arange(0, big.shape[dim], 2)) \
            if False else big[(slice(None),) * dim + (slice(None, None, 2),)]

    cases = {
        "q_2d": lambda a, g: ({**a, "q": a["q"][:, 0]}, g, None),
        "v_shape": lambda a, g: ({**a, "v_cache": a["v_cache"][:-1]}, g, None),
        "k_3d": lambda a, g: ({**a, "k_cache": a["k_cache"][0], "v_cache": a["v_cache"][0]}, g, None),
        "indices_rows": lambda a, g: ({**a, "logical_indices": a["logical_indices"][:-1]}, g, None),
        "indices_1d": lambda a, g: ({**a, "logical_indices": a["logical_indices"][:, 0]}, g, None),
        "ttr_shape": lambda a, g: ({**a, "token_to_req": a["token_to_req"][:-1]}, g, None),
        "bt_1d": lambda a, g: ({**a, "block_table": a["block_table"][0]}, g, None),
        "bt_empty": lambda a, g: ({**a, "block_table": a["block_table"][:0]}, g, None),
        "cache_empty": lambda a, g: ({**a, "k_cache": a["k_cache"][:0], "v_cache": a["v_cache"][:0]}, g, None),
        "indices_one_column": lambda a, g: ({**a, "logical_indices": a["logical_indices"][:, :1].contiguous()}, g, None),
        "head_dim_mismatch": lambda a, g: ({**a, "q": a["q"][..., :16].contiguous()}, g[..., :16].contiguous(), None),
        "heads_not_multiple": lambda a, g: ({**a, "q": a["q"][:, :3].contiguous()}, g[:, :3].contiguous(), None),
        "head_dim_8": lambda a, g: ({**a, "q": a["q"][..., :8].contiguous(), "k_cache": a["k_cache"][..., :8],
                                     "v_cache": a["v_cache"][..., :8]}, g[..., :8].contiguous(), None),
        "head_dim_48": lambda a, g: ({**a, "q": a["q"][..., :24].contiguous(), "k_cache": a["k_cache"][..., :24],
                                      "v_cache": a["v_cache"][..., :24]}, g[..., :24].contiguous(), None),
        "q_fp16": lambda a, g: ({**a, "q": a["q"].half()}, g, None),
        "kv_fp32": lambda a, g: ({**a, "k_cache": a["k_cache"].float(), "v_cache": a["v_cache"].float()}, g, None),
        "indices_int64": lambda a, g: ({**a, "logical_indices": a["logical_indices"].long()}, g, None),
        "bt_int64": lambda a, g: ({**a, "block_table": a["block_table"].long()}, g, None),
        "ttr_int64": lambda a, g: ({**a, "token_to_req": a["token_to_req"].long()}, g, None),
        "q_inner_stride": lambda a, g: ({**a, "q": strided(a["q"], 2)}, g, None),
        "indices_col_stride": lambda a, g: ({**a, "logical_indices": strided(a["logical_indices"], 1)}, g, None),
        "bt_col_stride": lambda a, g: ({**a, "block_table": strided(a["block_table"], 1)}, g, None),
        "ttr_stride": lambda a, g: ({**a, "token_to_req": strided(a["token_to_req"], 0)}, g, None),
        "out_shape": lambda a, g: (a, g, torch.empty_like(a["q"])[:-1]),
        "out_dtype": lambda a, g: (a, g, torch.empty_like(a["q"]).float()),
        "out_stride": lambda a, g: (a, g, strided(torch.empty_like(a["q"]), 2)),
        "gate_noncontiguous": lambda a, g: (a, g.transpose(0, 1).contiguous().transpose(0, 1), None),
        "gate_numel": lambda a, g: (a, g[:-1].contiguous(), None),
    }
    return cases


BAD = _bad_sparse_inputs()


@pytest.mark.parametrize("name", sorted(BAD))
def test_sparse_exception_parity_with_original(versioned, name):
    """Each version's originals against the surface the shim installs beside it."""
    orig, surface = versioned
    case = next(c for c, _ in SPARSE if c.name == "tp1_r3_s64_full")
    _, a, gate = _sparse_args(case)
    args, g, out = BAD[name](dict(a), gate)
    with pytest.raises(Exception) as expected:
        _call_sparse(orig.qsa_sparse_paged_attention, args, g, out)
    assert not isinstance(expected.value, (ImportError, AttributeError)), expected.value
    with pytest.raises(type(expected.value)) as got:
        _call_sparse(surface.qsa_sparse_paged_attention, args, g, out)
    assert type(got.value) is type(expected.value), (got.value, expected.value)


# Inputs the originals reject by reading an attribute the argument lacks (``out.shape``,
# ``output_gate.is_contiguous()``): AttributeError there, which the parity test above rules out
# (a stub of the CPU-run originals could raise one too), so here the attribute is named.
BAD_BY_ATTRIBUTE = {
    "out_list": (lambda a, g: (a, g, [0.0]), "shape"),
    "gate_none": (lambda a, g: (a, None, None), "is_contiguous"),
    "gate_numpy": (lambda a, g: (a, g.float().numpy(), None), "is_contiguous"),
}


@pytest.mark.parametrize("name", sorted(BAD_BY_ATTRIBUTE))
def test_sparse_attribute_errors_match_original(versioned, name):
    orig, surface = versioned
    case = next(c for c, _ in SPARSE if c.name == "tp1_r3_s64_full")
    _, a, gate = _sparse_args(case)
    mutate, attribute = BAD_BY_ATTRIBUTE[name]
    args, g, out = mutate(dict(a), gate)
    with pytest.raises(AttributeError, match=attribute):
        _call_sparse(orig.qsa_sparse_paged_attention, args, g, out)
    with pytest.raises(AttributeError, match="out must be|output_gate must be"):
        _call_sparse(surface.qsa_sparse_paged_attention, args, g, out)


def test_empty_batch_returns_like_original(orig):
    case = next(c for c, _ in SPARSE if c.q.shape[0] == 0)
    _, a, gate = _sparse_args(case)
    out = torch.empty_like(a["q"])
    assert _call_sparse(S.qsa_sparse_paged_attention, a, gate, out) is out
    assert _call_sparse(orig.qsa_sparse_paged_attention, a, gate, out) is out


# Recorded from the originals' source (vLLM 0.30.0): on CPU they raise RuntimeError
# ("requires Triton"/CUDA) before these checks, so the types are recorded here.
COMPRESS_BAD = {
    "ratio_zero": (lambda a: {**a, "compress_ratio": 0}, ValueError),
    # A float ratio: the originals' kernel fails on it (a loop bound; TypeError in Triton's
    # interpreter); the shim once pooled int(4.5) = 4 members.
    "ratio_float": (lambda a: {**a, "compress_ratio": 4.5}, TypeError),
    "raw_keys_2d": (lambda a: {**a, "raw_keys": a["raw_keys"][:, 0]}, ValueError),
    "raw_keys_rows": (lambda a: {**a, "raw_keys": a["raw_keys"][:-1]}, ValueError),
    "positions_int32": (lambda a: {**a, "raw_positions": a["raw_positions"].int()}, ValueError),
    "positions_shape": (lambda a: {**a, "raw_positions": a["raw_positions"][..., :2]}, ValueError),
    "logical_positions_shape": (lambda a: {**a, "logical_positions": a["logical_positions"][:-1]}, ValueError),
    "slots_shape": (lambda a: {**a, "compressed_slots": a["compressed_slots"][:-1]}, ValueError),
    "ring_3d": (lambda a: {**a, "compressor_state_cache": a["compressor_state_cache"][:, :, 0]}, ValueError),
    "ring_too_small": (lambda a: {**a, "compressor_state_cache": a["compressor_state_cache"][:, :2],
                                  "rope_cache": None}, ValueError),
    "ring_head_dim": (lambda a: {**a, "compressor_state_cache": a["compressor_state_cache"][..., :64]}, ValueError),
    "ring_dtype": (lambda a: {**a, "compressor_state_cache": a["compressor_state_cache"].float()}, ValueError),
    "table_1d": (lambda a: {**a, "compressor_state_block_table": a["compressor_state_block_table"][:, 0]}, ValueError),
    "qsl_short": (lambda a: {**a, "query_start_loc": a["query_start_loc"][:1]}, ValueError),
    "table_rows": (lambda a: {**a, "compressor_state_block_table": a["compressor_state_block_table"][:1]}, ValueError),
    "rope_dtype": (lambda a: {**a, "rope_cache": a["rope_cache"].int()}, ValueError),
    "rope_shape": (lambda a: {**a, "rope_cache": a["rope_cache"][..., :2]}, ValueError),
    "ring_empty": (lambda a: {**a, "compressor_state_cache": a["compressor_state_cache"][:0],
                              "rope_cache": a["rope_cache"][:0]}, ValueError),
}


@pytest.mark.parametrize("name", sorted(COMPRESS_BAD))
def test_compress_checks_match_recorded(name):
    case = next(c for c, _, _ in COMPRESS if c.name == "prefill_s4_rope")
    mutate, exc = COMPRESS_BAD[name]
    with pytest.raises(exc):
        _compress_call(mutate(_compress_torch(case)))


def test_compress_ratio_of_any_integral_type():
    """A NumPy integer ratio pools as the Python int does (bit for bit); a bool is refused."""
    case, pooled, first = next(c for c in COMPRESS if c[0].name == "prefill_s4_rope")
    a = _compress_torch(case)
    got_pooled, got_first = _compress_call({**a, "compress_ratio": np.int64(case.compress_ratio)})
    np.testing.assert_array_equal(to_numpy(got_pooled).view(np.uint16), pooled.view(np.uint16))
    np.testing.assert_array_equal(to_numpy(got_first), first)
    with pytest.raises(TypeError, match="compress_ratio"):
        _compress_call({**a, "compress_ratio": True})


STORE_BAD = {
    "cache_3d": (lambda c, s, r: (c[:, :, 0], s, r), ValueError),
    "cache_two_heads": (lambda c, s, r: (torch.cat([c, c], 2), s, r), ValueError),
    "cache_empty": (lambda c, s, r: (c[:, :0], s, r), ValueError),
    "rows_two_heads": (lambda c, s, r: (c, s, torch.stack([r, r], 1)), ValueError),
    "rows_count": (lambda c, s, r: (c, s[:-1], r), ValueError),
    "rows_width": (lambda c, s, r: (c, s, r[:, :-1]), ValueError),
    "meta_device": (lambda c, s, r: (c.to("meta"), s, r), RuntimeError),
}


@pytest.mark.parametrize("name", sorted(STORE_BAD))
def test_store_checks_match_recorded(name):
    case = STORE[0][0]
    mutate, exc = STORE_BAD[name]
    with pytest.raises(exc):
        S.qsa_store_cache_rows(*mutate(_cpu(case.cache), _cpu(case.slot_mapping), _cpu(case.rows)))


# ----------------------------------------------------------------------------- CPU: zero copy, caching

def _record_imports(monkeypatch):
    """Patch the shim's import so every imported tensor's pointer is recorded and checked."""
    imported = {}
    real = I.to_jax

    def spy(t, **kw):
        a = real(t, **kw)
        if t.numel():
            assert a.unsafe_buffer_pointer() == t.data_ptr(), "an import copied its tensor"
            imported[t.data_ptr()] = tuple(t.shape)
        return a

    monkeypatch.setattr(I, "to_jax", spy)
    return imported


def test_sparse_imports_are_zero_copy(monkeypatch):
    case = next(c for c, _ in SPARSE if c.name == "tp4_r20_w63_d256_s2")
    kv, a, gate = _sparse_args(case)
    imported = _record_imports(monkeypatch)
    I.clear_import_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error", S.ShimCopyWarning)
        warnings.filterwarnings("ignore", message=".*not updated in place.*")
        got = _call_sparse(S.qsa_sparse_paged_attention, a, gate, torch.empty_like(a["q"]))
    # The fused buffer itself (not a copy of K/V) went to JAX, and q and the gate unchanged.
    assert imported[kv.data_ptr()] == tuple(kv.shape)
    assert a["q"].data_ptr() in imported and gate.data_ptr() in imported
    cached = {arr.unsafe_buffer_pointer() for _, arr in I.PERSISTENT._entries.values()} | {
        arr.unsafe_buffer_pointer() for arr in I.ACTIVATIONS._entries.values()}
    assert cached == {kv.data_ptr(), a["q"].data_ptr(), gate.data_ptr(),
                      a["logical_indices"].data_ptr(), a["block_table"].data_ptr(),
                      a["token_to_req"].data_ptr()}
    assert_fidelity(to_numpy(got), dict(SPARSE_BY_NAME)[case.name])


SPARSE_BY_NAME = [(c.name, e) for c, e in SPARSE]


def _qkv_view(q: torch.Tensor, kv_heads: int, leading_heads: int = 0):
    """vLLM's q: a [R, H, D] view of the fused qkv projection (other columns NaN)."""
    qkv, start = C.qkv_with_query(to_numpy(q), kv_heads, leading_heads=leading_heads)
    qkv = to_torch(qkv, q.device.type)
    rows, heads, d = q.shape
    view = qkv[:, start:start + heads * d].view(rows, heads, d)
    assert (rows == 1 or not view.is_contiguous()) and torch.equal(view, q)
    return qkv, view


@pytest.mark.parametrize("leading_heads", [0, 1])
def test_strided_q_is_read_in_place(monkeypatch, leading_heads):
    """q as a column slice of qkv (row stride (H + 2 Hk) * D) is not copied: the qkv
    rows go to JAX, and the result is bit-identical to the compact q's."""
    case = next(c for c, _ in SPARSE if c.name == "tp4_r20_w63_d256_s2")
    kv, a, gate = _sparse_args(case)
    qkv, q = _qkv_view(a["q"], case.kv_cache.shape[1], leading_heads)
    want = _call_sparse(S.qsa_sparse_paged_attention, a, gate)
    imported = _record_imports(monkeypatch)
    I.clear_import_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error", S.ShimCopyWarning)
        warnings.filterwarnings("ignore", message=".*not updated in place.*")
        got = _call_sparse(S.qsa_sparse_paged_attention, {**a, "q": q}, gate, torch.empty_like(a["q"]))
    assert q.data_ptr() in imported and q.data_ptr() == qkv.data_ptr() + leading_heads * 256 * 2
    rows_of_q = imported[q.data_ptr()]
    assert rows_of_q[1] == 256 and rows_of_q[0] < qkv.numel() // 256  # the qkv rows, not a copy
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert_fidelity(to_numpy(got), dict(SPARSE_BY_NAME)[case.name])


def test_strided_query_geometry():
    """(table rows, row stride, head stride) in D-wide rows, or None when q's rows are
    not on a D-row grid of the storage (those are copied with a warning)."""
    x = torch.zeros((5, 40 * 16), dtype=torch.bfloat16)
    assert I.strided_query_geometry(x[:, 16:16 + 32 * 16].view(5, 32, 16)) == (4 * 40 + 32, 40, 1)
    assert I.strided_query_geometry(x[:1, 16:16 + 32 * 16].view(1, 32, 16)) == (32, 0, 1)
    y = torch.zeros((5, 32, 32), dtype=torch.bfloat16)
    assert I.strided_query_geometry(y.view(5, 64, 16)[:, ::2]) == (4 * 64 + 31 * 2 + 1, 64, 2)
    assert I.strided_query_geometry(y[:, :, ::2]) is None  # non-unit stride in D
    z = torch.zeros((5, 520), dtype=torch.bfloat16)
    assert I.strided_query_geometry(z[:, :512].view(5, 32, 16)) is None  # row stride 520 % 16 != 0


def test_fused_base_recognition():
    kv = torch.zeros((3, 2, 8, 32), dtype=torch.bfloat16)
    k, v = kv.transpose(1, 2).split(16, -1)
    base = I.fused_kv_base(k, v)
    assert base is not None and base.data_ptr() == kv.data_ptr() and base.shape == kv.shape
    assert base._base is None  # an alias of the storage, not a view that pins kv
    assert I.fused_kv_base(v, k) is None  # swapped halves
    other = torch.zeros_like(kv)
    assert I.fused_kv_base(k, other.transpose(1, 2).split(16, -1)[1]) is None  # other storage
    k2, v2 = kv.transpose(1, 2)[..., :8], kv.transpose(1, 2)[..., 16:24]
    assert I.fused_kv_base(k2, v2) is None  # not the D-split


def test_import_cache_follows_the_buffers():
    """Cached imports (KV, q, gate, metadata) see torch's in-place writes, and die with
    the user's tensors; a new buffer is never served stale."""
    case = next(c for c, _ in SPARSE if c.name == "tp1_r16_s16")
    I.clear_import_cache()
    kv, a, gate = _sparse_args(case)
    call = lambda: _call_sparse(S.qsa_sparse_paged_attention, a, gate).clone()  # noqa: E731

    def fresh():
        I.clear_import_cache()
        return call()

    first = call()
    assert len(I.PERSISTENT) == 4  # fused KV, 3 metadata buffers
    assert len(I.ACTIVATIONS) == 2  # q, gate: keyed on their memory views, owning nothing
    rng = torch.Generator().manual_seed(3)
    # torch writes in place into each cached buffer in turn; the cached import must see it.
    writes = {
        "kv": lambda: kv.mul_(-0.5),
        "q": lambda: a["q"].copy_(torch.randn(a["q"].shape, generator=rng)),
        "gate": lambda: gate.copy_(torch.randn(gate.shape, generator=rng)),
        "counts": lambda: a["logical_indices"][:, -1].floor_divide_(2),
        "block_table": lambda: a["block_table"].copy_(a["block_table"].roll(1, 1)),
        "token_to_req": lambda: a["token_to_req"].copy_(a["token_to_req"].flip(0)),
    }
    previous = first
    for name, write in writes.items():
        I.PERSISTENT.hits = I.ACTIVATIONS.hits = SPARSE_CALLS.hits = 0
        write()
        got = call()
        # Served from the cached imports: the call cache's entry (same tensors), or the
        # import caches' six entries.
        assert SPARSE_CALLS.hits >= 1 or I.PERSISTENT.hits + I.ACTIVATIONS.hits >= 6, name
        want = fresh()
        # Bit patterns, not values: after the block-table write the rows read pages the golden
        # poisons (NaN V), and NaN != NaN.
        bits = lambda t: t.view(torch.int16)  # noqa: E731
        assert torch.equal(bits(got), bits(want)), f"cached import of {name} served stale data"
        assert not torch.equal(bits(got), bits(previous)), f"the write into {name} changed nothing (weak test)"
        previous = got
    # Dropping the user's tensors drops their entries (and the storage they pinned).
    del kv, a, gate, call, writes
    gc.collect()
    assert len(I.PERSISTENT) == 0 and len(SPARSE_CALLS) == 0
    # New buffers (possibly at the same addresses) with other data are not served stale.
    kv2, a2, gate2 = _sparse_args(case)
    kv2.mul_(-0.5)
    again = _call_sparse(S.qsa_sparse_paged_attention, a2, gate2)
    I.clear_import_cache()
    assert torch.equal(again, _call_sparse(S.qsa_sparse_paged_attention, a2, gate2))
    assert not torch.equal(again, first)


def test_misaligned_view_is_copied_with_warning():
    case = next(c for c, _ in SPARSE if c.name == "tp1_r3_s64_full")
    _, a, gate = _sparse_args(case)
    buf = torch.empty(a["q"].numel() + 8, dtype=torch.bfloat16)
    q = buf[1:1 + a["q"].numel()].view(a["q"].shape)
    q.copy_(a["q"])
    assert q.data_ptr() % 64
    with pytest.warns(S.ShimCopyWarning, match="aligned"):
        got = _call_sparse(S.qsa_sparse_paged_attention, {**a, "q": q}, gate)
    assert_fidelity(to_numpy(got), dict(SPARSE_BY_NAME)[case.name])


def test_noncompact_out_is_written():
    case = next(c for c, _ in SPARSE if c.name == "tp1_r3_s64_full")
    _, a, gate = _sparse_args(case)
    # NaN-poisoned: the interleaved heads must stay untouched (even by zeros), every out head written.
    big = torch.full((a["q"].shape[0], a["q"].shape[1] * 2, a["q"].shape[2]), float("nan"), dtype=torch.bfloat16)
    out = big[:, ::2]
    with pytest.warns(S.ShimCopyWarning):
        got = _call_sparse(S.qsa_sparse_paged_attention, a, gate, out)
    assert got is out
    assert_fidelity(to_numpy(out), dict(SPARSE_BY_NAME)[case.name])
    assert torch.isnan(big[:, 1::2]).all()


def test_install_swaps_module():
    import importlib
    import sys

    prev = S.install("qsa_test_fake.ops.qsa")
    try:
        assert importlib.import_module("qsa_test_fake.ops.qsa") is S
    finally:
        sys.modules.pop("qsa_test_fake.ops.qsa")
    assert prev is None


@pytest.mark.parametrize("original_imported_first", [False, True])
def test_install_serves_every_import_form(tmp_path, monkeypatch, original_imported_first):
    """With a package on disk standing in for vLLM's (``pkg.ops.qsa``), every way vLLM code can
    import the ops gives the shim after ``install()``: the attribute forms read the parent
    package, which ``sys.modules`` alone does not change. If the original was imported first,
    install warns: what bound it before keeps it."""
    import importlib
    import sys

    pkg = tmp_path / "qsa_fake_vllm_pkg"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "ops" / "qsa.py").write_text("ORIGINAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    name = "qsa_fake_vllm_pkg.ops.qsa"
    try:
        if original_imported_first:
            assert importlib.import_module(name).ORIGINAL
            with pytest.warns(RuntimeWarning, match="imported before"):
                S.install(name, vllm_version="0.34.0")
        else:
            S.install(name, vllm_version="0.34.0")
        import qsa_fake_vllm_pkg.ops.qsa as as_alias
        from qsa_fake_vllm_pkg.ops import qsa as from_parent
        import qsa_fake_vllm_pkg.ops.qsa
        from qsa_fake_vllm_pkg.ops.qsa import qsa_sparse_paged_attention
        assert as_alias is from_parent is qsa_fake_vllm_pkg.ops.qsa is S
        assert qsa_sparse_paged_attention is S.qsa_sparse_paged_attention
    finally:
        for mod in [m for m in sys.modules if m.startswith("qsa_fake_vllm_pkg")]:
            sys.modules.pop(mod)


def test_install_leaves_nothing_when_the_package_fails_to_import(tmp_path, monkeypatch):
    """A parent package that raises on import (not ImportError): the error propagates and
    sys.modules is as before."""
    import sys

    pkg = tmp_path / "qsa_fake_broken_pkg"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ops" / "__init__.py").write_text("raise RuntimeError('no CUDA device found')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    name = "qsa_fake_broken_pkg.ops.qsa"
    try:
        with pytest.raises(RuntimeError, match="no CUDA device"):
            S.install(name, vllm_version="0.34.0")
        assert name not in sys.modules
    finally:
        for mod in [m for m in sys.modules if m.startswith("qsa_fake_broken_pkg")]:
            sys.modules.pop(mod)


def test_torch_compile_traces_through_custom_ops():
    case = next(c for c, _ in SPARSE if c.name == "tp1_r16_s16")
    _, a, gate = _sparse_args(case)
    S.register_torch_ops()
    assert hasattr(torch.ops.qsa_shim, "sparse_paged_attention")

    def f(q, k, v, li, bt, ttr, g):
        out = S.qsa_sparse_paged_attention(q, k, v, li, bt, ttr, False, output_gate=g)
        return out * 2

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    args = (a["q"], a["k_cache"], a["v_cache"], a["logical_indices"], a["block_table"],
            a["token_to_req"], gate)
    torch.testing.assert_close(compiled(*args), f(*args), rtol=0, atol=0)


def test_custom_op_fakes():
    S.register_torch_ops()
    case = next(c for c, _ in SPARSE if c.name == "tp1_r16_s16")
    _, a, gate = _sparse_args(case)
    torch.library.opcheck(torch.ops.qsa_shim.sparse_paged_attention.default,
                          (a["q"], a["k_cache"], a["v_cache"], a["logical_indices"],
                           a["block_table"], a["token_to_req"], False, gate),
                          test_utils=("test_schema", "test_faketensor"))


def test_measure_eager_latency_smoke():
    case = next(c for c, _ in SPARSE if c.name == "tp1_r3_s64_full")
    _, a, gate = _sparse_args(case)
    out = torch.empty_like(a["q"])
    res = S.measure_eager_latency(lambda: _call_sparse(S.qsa_sparse_paged_attention, a, gate, out),
                                  iters=5, warmup=2, repeats=2)
    assert res["per_call_us"] > 0 and res["host_us"] > 0


# ============================================================================ GPU


@pytest.fixture(autouse=True)
def _jax_route(monkeypatch):
    """This module tests the JAX route (DLPack imports, stream fences, ``out`` routes): calls
    that name no implementation take it here. The default route on CUDA tensors (triton-torch)
    is tested in test_shim_direct.py, and against the originals below (``route``)."""
    from qsa_torch_shim import _eager

    monkeypatch.setattr(_eager, "SPARSE_IMPLEMENTATION", ["jax"])

CONTEXT = 65536
POOL_PAGES = {"TP1": 300, "TP2": 500, "TP4": 1000}  # about 1 GB of cache each


def _gpu_case(g, rows, seed, kv):
    rng = np.random.default_rng(seed)
    case = C.sparse_attention_case(
        rng, rows=rows, num_query_heads=g.num_query_heads, num_kv_heads=g.num_kv_heads,
        head_dim=g.head_dim, page_size=g.page_size, selection_blocks=512, context_tokens=CONTEXT,
        num_requests=max(1, min(rows, 8)), num_pages=kv.shape[0], make_cache=False)
    t = lambda x: to_torch(x, "cuda")  # noqa: E731
    k, v = kv_views(kv, g.head_dim)
    return dict(q=t(case.q), k_cache=k, v_cache=v, logical_indices=t(case.logical_indices),
                block_table=t(case.block_table), token_to_req=t(case.token_to_req),
                use_prefill_config=False), t(case.output_gate)


@pytest.fixture(scope="module", params=["TP1", "TP2", "TP4"])
def gpu_pool(request):
    from qsa_jax import arg_specs

    g = arg_specs.GEOMETRIES[request.param]
    kv = random_kv_pool(g, POOL_PAGES[g.name], seed=7)
    yield g, kv
    del kv
    I.clear_import_cache()
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["jax", None])  # None: the default on CUDA, triton-torch
@pytest.mark.parametrize("rows", [1, 16, 64, 512, 2049])
def test_gpu_sparse_matches_original_identical_call(orig, gpu_pool, rows, tiling_030, route, monkeypatch):
    from qsa_torch_shim import _direct, _eager

    monkeypatch.setattr(_eager, "SPARSE_IMPLEMENTATION", [route])
    assert _eager.sparse_route(None, torch.device("cuda")) == (None if route else "triton-torch")
    g, kv = gpu_pool
    a, gate = _gpu_case(g, rows, rows + g.num_query_heads, kv)
    flags = (False, True) if rows * g.num_kv_heads > 2048 else (False,)
    for flag in flags:
        a["use_prefill_config"] = flag
        want = _call_sparse(orig.qsa_sparse_paged_attention, a, gate, torch.empty_like(a["q"]))
        out = torch.empty_like(a["q"])
        direct = _direct.ROUTES.direct
        got = _call_sparse(S.qsa_sparse_paged_attention, a, gate, out)
        assert got is out and _direct.ROUTES.direct == direct + (route is None)  # the route asked for
        assert_fidelity(to_numpy(got), to_numpy(want), what=f"{g.name}/r{rows}/prefill={flag}")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 64, 2049])
def test_gpu_strided_q_matches_original_without_copy(orig, gpu_pool, rows, monkeypatch, tiling_030):
    """vLLM's q (a view of the fused qkv, other columns NaN) through the identical call:
    same result as the originals, no copy (ShimCopyWarning is an error), qkv imported."""
    g, kv = gpu_pool
    a, gate = _gpu_case(g, rows, rows + 5, kv)
    qkv, q = _qkv_view(a["q"], g.num_kv_heads)
    a["q"] = q
    want = _call_sparse(orig.qsa_sparse_paged_attention, a, gate, torch.empty_like(q))
    imported = _record_imports(monkeypatch)
    out = torch.empty_like(q)
    with warnings.catch_warnings():
        warnings.simplefilter("error", S.ShimCopyWarning)
        got = _call_sparse(S.qsa_sparse_paged_attention, a, gate, out)
        new = _call_sparse(S.qsa_sparse_paged_attention, a, gate)
    assert got is out and qkv.data_ptr() in imported
    assert torch.equal(new.view(torch.int16), got.view(torch.int16))
    assert_fidelity(to_numpy(got), to_numpy(want), what=f"{g.name}/r{rows}/strided q")


@pytest.mark.gpu
@pytest.mark.parametrize("out_route", ["donate", "copy"], indirect=True)
def test_gpu_in_place_pointer_identity_and_zero_copy(gpu_pool, monkeypatch, fence, out_route):
    g, kv = gpu_pool
    a, gate = _gpu_case(g, 64, 11, kv)
    imported = _record_imports(monkeypatch)
    I.clear_import_cache()
    out = torch.empty_like(a["q"])
    ptr = out.data_ptr()
    with warnings.catch_warnings():
        warnings.simplefilter("error", S.ShimCopyWarning)  # any copy-back fails the test
        got = _call_sparse(S.qsa_sparse_paged_attention, a, gate, out)
        cache = torch.randn((64, 16, 1, 140), device="cuda").to(torch.bfloat16)
        cptr = cache.data_ptr()
        slots = torch.randperm(64 * 16, device="cuda")[:100]  # int64, as vLLM's slot_mapping
        rows = torch.randn((100, 140), device="cuda").to(torch.bfloat16)
        S.qsa_store_cache_rows(cache, slots, rows)
    assert got is out and out.data_ptr() == ptr and cache.data_ptr() == cptr
    assert imported[kv.data_ptr()] == tuple(kv.shape)
    _assert_fence_ran(fence, 2, signalled=2)
    _assert_out_route(out_route, fence, 1)
    page, tok = slots // 16, slots % 16
    assert torch.equal(cache[page, tok, 0], rows)


@pytest.mark.gpu
def test_gpu_store_and_compress_match_original(orig):
    torch.manual_seed(0)
    rng = np.random.default_rng(5)
    for case, _ in STORE:
        c1, c2 = to_torch(case.cache), to_torch(case.cache)
        s, r = to_torch(case.slot_mapping.astype(np.int64)), to_torch(case.rows)
        orig.qsa_store_cache_rows(c1, s, r)
        S.qsa_store_cache_rows(c2, s, r)
        assert torch.equal(c1.view(torch.int16), c2.view(torch.int16)), case.name
    cases = [c for c, _, _ in COMPRESS] + [C.compress_case(rng, chunk_lens=[3000, 1, 700, 4492],
                                                           ring=8, edge=True)]
    for case in cases:
        a = {k: (v.to("cuda") if isinstance(v, torch.Tensor) else v)
             for k, v in _compress_torch(case).items()}
        want = orig.qsa_compress_groups_with_ratio(**a)
        got = _compress_call(a)
        assert torch.equal(want[0].view(torch.int16), got[0].view(torch.int16)), case.name
        assert torch.equal(want[1], got[1]), case.name


def _race_iterations(g, kv, with_out: bool, n: int = 40, fresh_q: bool = False) -> list[int]:
    """Iterations whose output differs from the expected one when torch writes q and the
    counts on a side stream right before each call and reads the output right after.
    ``fresh_q``: q is a new tensor each iteration, so its import is never a cache hit
    (made without a handshake: the call's fence must order it)."""
    a, gate = _gpu_case(g, 2048, 3, kv)
    counts = a["logical_indices"][:, -1].clone()
    q_sets = [a["q"].clone(), (-a["q"]).clone()]
    count_sets = [counts, counts // 3]
    expected = []
    for qs, cs in zip(q_sets, count_sets):
        li = a["logical_indices"].clone()
        li[:, -1] = cs
        expected.append(_call_sparse(S.qsa_sparse_paged_attention,
                                     {**a, "q": qs, "logical_indices": li}, gate).clone())
    torch.cuda.synchronize()
    assert not torch.equal(expected[0], expected[1])
    side = torch.cuda.Stream()
    q = torch.empty_like(a["q"])
    li = a["logical_indices"].clone()
    out = torch.empty_like(a["q"])
    results = torch.empty((n,) + tuple(out.shape), dtype=out.dtype, device="cuda")
    I.clear_import_cache()
    I.PERSISTENT.hits = I.PERSISTENT.misses = SPARSE_CALLS.hits = 0
    I.ACTIVATIONS.hits = I.ACTIVATIONS.misses = 0
    with torch.cuda.stream(side):
        for it in range(n):
            torch.cuda._sleep(2_000_000)  # delay torch's writes: a JAX read that does not wait sees stale inputs
            if fresh_q:
                q = torch.empty_like(q_sets[0])
            q.copy_(q_sets[it % 2])
            li[:, -1].copy_(count_sets[it % 2])
            args = {**a, "q": q, "logical_indices": li}
            if with_out:
                out.fill_(float("nan"))
                got = _call_sparse(S.qsa_sparse_paged_attention, args, gate, out)
            else:
                got = _call_sparse(S.qsa_sparse_paged_attention, args, gate)
            results[it].copy_(got)  # immediately after: must wait for JAX's write
            got.fill_(float("nan"))
    torch.cuda.synchronize()
    if fresh_q:
        # A new q object each call: served by its memory view (the call cache's entry, or
        # the unowned import of q at that address), never by the previous object's entry.
        assert SPARSE_CALLS.hits + I.ACTIVATIONS.hits + I.ACTIVATIONS.misses >= n - 1, \
            "the fresh q's calls did not go through the activation imports"
    else:
        # Every call after the first finds its imports cached: as one call-cache hit (which
        # skips the per-tensor lookups) or as per-tensor hits. The first call misses both.
        assert I.PERSISTENT.hits + SPARSE_CALLS.hits >= n - 1, "the cached imports were not exercised"
    return [it for it in range(n) if not torch.equal(results[it], expected[it % 2])]


@pytest.fixture(params=["import", "ffi", "ffi-signal"])
def fence(request):
    """Each per-call stream fence: the fresh import, the FFI wait (``_ffi_fence``), and the
    FFI wait with the FFI signal in place of the export for ``out=`` and the store."""
    from qsa_torch_shim import _ffi_fence as F

    previous = F.mode()
    F.set_mode(request.param)
    F.FENCE.reset()
    yield request.param
    F.set_mode(previous)


def _assert_fence_ran(fence, calls, signalled=0):
    """``calls`` calls went through ``fence`` (and ``signalled`` of them skipped the
    export thanks to the FFI signal, in mode "ffi-signal")."""
    from qsa_torch_shim import _ffi_fence as F

    if fence == "import":
        assert F.FENCE.imported >= calls and F.FENCE.ffi == 0, vars(F.FENCE)
        return
    assert F.FENCE.reason is None, F.FENCE.reason
    assert F.FENCE.ffi >= calls and F.FENCE.imported == 0, vars(F.FENCE)
    assert F.FENCE.signalled >= (signalled if fence == "ffi-signal" else 0), vars(F.FENCE)
    assert F.pending() == 0


@pytest.fixture
def out_route(request):
    """``out=``'s route for this test: "donate" (limit -1), "copy" (every size), or the
    default limit (None); restored afterwards."""
    from qsa_torch_shim import _eager as E

    previous = E.OUT_COPY_MAX_BYTES[0]
    route = getattr(request, "param", None)
    if route is not None:
        S.set_out_copy_max_bytes(-1 if route == "donate" else 1 << 40)
    E.OUT_ROUTES.reset()
    yield route
    E.OUT_COPY_MAX_BYTES[0] = previous


def _assert_out_route(route, fence, calls):
    """``calls`` calls with ``out=`` took ``route`` (the FFI signal keeps the donation)."""
    from qsa_torch_shim import _eager as E

    if route == "copy" and fence != "ffi-signal":
        assert E.OUT_ROUTES.copied >= calls and E.OUT_ROUTES.donated == 0, vars(E.OUT_ROUTES)
    elif route is not None:
        assert E.OUT_ROUTES.donated >= calls and E.OUT_ROUTES.copied == 0, vars(E.OUT_ROUTES)


@pytest.mark.gpu
@pytest.mark.parametrize("with_out,out_route,fresh_q", [
    (True, "donate", False), (True, "copy", False), (False, None, False), (True, None, True)],
    ids=["out", "out-copy", "new", "out-fresh-q"], indirect=["out_route"])
def test_gpu_stream_race(gpu_pool, with_out, out_route, fresh_q, fence):
    """q and the counts are the same tensor objects every iteration, so their imports are
    cached: only the per-call fence (the donated ``out``, or ``stream_fence`` without
    ``out`` and on the copy route; or the FFI wait) orders JAX's reads after torch's
    writes; on the copy route, the export orders torch's copy into ``out`` after JAX."""
    g, kv = gpu_pool
    if g.name != "TP1":
        pytest.skip("one geometry is enough")
    bad = _race_iterations(g, kv, with_out, fresh_q=fresh_q)
    assert not bad, f"stream race ({fence} fence): iterations {bad} read stale or unwritten data"
    _assert_fence_ran(fence, 40, signalled=40 if with_out else 0)  # checked in "ffi-signal" only
    _assert_out_route(out_route, fence, 40)


@pytest.mark.gpu
@pytest.mark.parametrize("with_out,out_route,fresh_q", [
    (False, None, False), (True, "copy", False), (False, None, True)],
    ids=["new", "out-copy", "new-fresh-q"], indirect=["out_route"])
def test_gpu_stream_race_test_catches_a_missing_fence(gpu_pool, monkeypatch, with_out, out_route,
                                                     fresh_q):
    """Negative control: with the fence removed, the race test must see stale reads (also
    on the copy route for ``out=``, whose fence is the same one, and with q imported
    afresh each call, which takes no handshake of its own)."""
    g, kv = gpu_pool
    if g.name != "TP1":
        pytest.skip("one geometry is enough")
    from qsa_torch_shim import _ffi_fence as F

    monkeypatch.setattr(F, "_MODE", ["import"])  # this control removes the import fence
    monkeypatch.setattr(I, "stream_fence", lambda device: None)
    bad = _race_iterations(g, kv, with_out=with_out, fresh_q=fresh_q)
    I.clear_import_cache()
    assert bad, "no stale read without the fence: the race test cannot detect a missing wait"


@pytest.mark.gpu
@pytest.mark.parametrize("mode,switch,with_out", [
    ("ffi", "SKIP_WAIT", True), ("ffi", "SKIP_WAIT", False), ("ffi-signal", "SKIP_SIGNAL", True)],
    ids=["wait-out", "wait-new", "signal-out"])
def test_gpu_stream_race_test_catches_a_missing_ffi_wait(gpu_pool, monkeypatch, mode, switch,
                                                        with_out):
    """Negative controls of the FFI modes: the handlers run (and keep the bookkeeping in
    step) but skip the wait on torch's event (SKIP_WAIT), or, in mode "ffi-signal" where
    the export is skipped, the signal's record and torch's wait (SKIP_SIGNAL); the race
    test must then see stale inputs or an unwritten ``out``."""
    from qsa_torch_shim import _ffi_fence as F

    g, kv = gpu_pool
    if g.name != "TP1":
        pytest.skip("one geometry is enough")
    monkeypatch.setattr(F, "_MODE", [mode])
    monkeypatch.setattr(F, switch, [True])
    F.FENCE.reset()
    bad = _race_iterations(g, kv, with_out=with_out)
    I.clear_import_cache()
    _assert_fence_ran(mode, 40, signalled=40 if mode == "ffi-signal" else 0)
    assert bad, f"no bad read with {switch}: the race test cannot detect a missing wait"


@pytest.mark.gpu
def test_gpu_torch_keeps_its_memory(gpu_pool):
    import os

    g, kv = gpu_pool
    assert os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE") == "false" or any(
        v in os.environ for v in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR"))
    a, gate = _gpu_case(g, 256, 9, kv)
    _call_sparse(S.qsa_sparse_paged_attention, a, gate)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    assert free > 0.5 * total, f"only {free / 2**30:.1f} of {total / 2**30:.1f} GiB free after a shim call"
    block = torch.empty(int(0.4 * total), dtype=torch.uint8, device="cuda")
    block.fill_(1)
    del block
    torch.cuda.empty_cache()
