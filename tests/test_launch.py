"""Launch knobs (``qsa_jax.PallasLaunch``): the default launch is the one chosen before the
knobs had a home of their own, and ``launch=`` reaches the kernels. Checked on the Triton
IR and launch attributes lowered for sm_90 on CPU, as on an H200 (tools/sm90_forward_ir.py)."""

from __future__ import annotations

import os
import sys

import pytest

import qsa_jax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import sm90_forward_ir as IR  # noqa: E402

pytest.importorskip("jax._src.pallas.triton.pallas_call_registration")


def _attrs(text: str) -> list[str]:
    return text.split("\n\n")[0].splitlines()


@pytest.fixture
def sm90(monkeypatch):
    IR.patch_for_sm90("h200", monkeypatch.setattr)
    return IR.lower_case


# Row counts odd enough not to meet another test's compiled problem (the patches change
# what a trace of the same problem lowers to).
@pytest.mark.parametrize("name,rows,heads,hk,config,want", [
    # H200 measured table: 4 warps at 10 programs (split-K), 3 stages at 66 programs; the merge of
    # tp1_splitk's 120 (row, head) pairs on 1 warp (64-wide, config.PALLAS_MERGE_LAYOUTS).
    ("tp1_splitk", 5, 24, 2, None, ["qsa_sparse_attention: num_stages=2 num_warps=4",
                                    "qsa_merge_splits: num_stages=1 num_warps=1"]),
    # ... and 2 warps at 7 programs (vLLM 0.34.0's own tiling there since session 26); its 42
    # (row, head) pairs merge on 1 warp (32-wide D chunks, config.PALLAS_MERGE_LAYOUTS, session 30).
    ("tp4_split33", 7, 6, 1, None, ["qsa_sparse_attention: num_stages=2 num_warps=2",
                                    "qsa_merge_splits: num_stages=1 num_warps=1"]),
    ("tp4_stages3", 66, 6, 1, None, ["qsa_sparse_attention: num_stages=3 num_warps=2",
                                     "qsa_merge_splits: num_stages=1 num_warps=2"]),
    # vLLM 0.30.0's one-warp entry becomes two warps on Hopper; an explicit config stays as given.
    ("vllm030", 51, 24, 2, "vllm-0.30", ["qsa_sparse_attention: num_stages=2 num_warps=2",
                                         "qsa_merge_splits: num_stages=1 num_warps=2"]),
    ("explicit", 3, 24, 2, (32, 1, 65, 8), ["qsa_sparse_attention: num_stages=2 num_warps=1",
                                            "qsa_merge_splits: num_stages=1 num_warps=1"]),
])
def test_default_launch_is_the_previous_choice(sm90, name, rows, heads, hk, config, want):
    assert _attrs(sm90(name, rows, heads, hk, "fused", "bf16", config)) == want


def test_launch_override_reaches_the_kernels(sm90):
    case = ("override", 5, 24, 2, "fused", "bf16", None)
    default = sm90(*case)
    knobs = qsa_jax.PallasLaunch(num_warps=8, num_stages=3, merge_warps=8, merge_block_d=128)
    tuned = sm90(*case, knobs)
    assert _attrs(tuned) == ["qsa_sparse_attention: num_stages=3 num_warps=8",
                             "qsa_merge_splits: num_stages=1 num_warps=8"]
    # Only the fields given change: stages alone keeps the default's 4 warps.
    assert _attrs(sm90(*case, qsa_jax.PallasLaunch(num_stages=3)))[0] == \
        "qsa_sparse_attention: num_stages=3 num_warps=4"
    # Prefetch restructures the tile loop; the merge block changes the merge's slices.
    split_ir, merge_ir = default.split("\n\n")[1:3]
    assert sm90(*case, qsa_jax.PallasLaunch(prefetch=True)).split("\n\n")[1] != split_ir
    assert tuned.split("\n\n")[2] != merge_ir
    assert sm90(*case, qsa_jax.PallasLaunch()) == default  # nothing set: the default launch


def test_launch_is_checked_before_any_launch():
    import jax.numpy as jnp

    q = jnp.zeros((1, 2, 16), jnp.bfloat16)
    kv = jnp.zeros((2, 1, 4, 32), jnp.bfloat16)
    li = jnp.zeros((1, 3), jnp.int32)
    args = (q, kv, li, jnp.zeros((1, 2), jnp.int32), jnp.zeros((1,), jnp.int32), q)
    with pytest.raises(ValueError, match="launch=.*is for implementation 'pallas', but this call runs 'xla'"):
        qsa_jax.sparse_attention(*args, implementation="xla", launch=qsa_jax.PallasLaunch(num_warps=4))
    with pytest.raises(ValueError, match="launch=.*is for implementation 'triton'"):
        qsa_jax.sparse_attention(*args, implementation="pallas", launch=qsa_jax.TritonLaunch())
    with pytest.raises(TypeError, match="launch must be None, a PallasLaunch or a TritonLaunch"):
        qsa_jax.sparse_attention(*args, implementation="pallas", launch={"num_warps": 4})
    with pytest.raises(ValueError, match="PallasLaunch.num_warps must be a power of two"):
        qsa_jax.PallasLaunch(num_warps=3)
    with pytest.raises(ValueError, match="PallasLaunch.num_stages must be an int >= 1"):
        qsa_jax.PallasLaunch(num_stages=0)
    with pytest.raises(TypeError, match="TritonLaunch.prefetch must be a bool"):
        qsa_jax.TritonLaunch(prefetch=1)


def test_a_shard_keeps_the_launch():
    import jax
    import jax.numpy as jnp

    from qsa_jax.ops.sparse_attention.base import check_sparse_attention_args

    s = jax.ShapeDtypeStruct
    q = s((8, 24, 256), jnp.bfloat16)
    knobs = qsa_jax.PallasLaunch(num_stages=3, merge_block_d=128)
    problem = check_sparse_attention_args(
        q, s((10, 2, 64, 512), jnp.bfloat16), s((8, 2052), jnp.int32), s((2, 64), jnp.int32),
        s((8,), jnp.int32), q, use_prefill_config=False, config=None, launch=knobs)
    shard = problem.for_shard(4, 12, 1)
    assert shard.launch == knobs and shard.num_rows == 4
    launch = qsa_jax.config.pallas_launch(shard)
    # Another D chunk than the default's, warps not set: 2 warps, not the default chunk's.
    assert (launch.merge_block_d, launch.merge_warps) == (128, 2)


def _problem(rows, kv_dtype, launch=None, config=None, prefill=False):
    import jax
    import jax.numpy as jnp

    from qsa_jax.ops.sparse_attention.base import check_sparse_attention_args

    s = jax.ShapeDtypeStruct
    q = s((rows, 24, 256), jnp.bfloat16)
    fp8 = kv_dtype != jnp.bfloat16
    return check_sparse_attention_args(
        q, s((10, 2, 64, 512), kv_dtype), s((rows, 2052), jnp.int32), s((2, 64), jnp.int32),
        s((rows,), jnp.int32), q, use_prefill_config=prefill, config=config,
        scales_given=(fp8, fp8), launch=launch)


# rows (x 24 query heads = pairs) -> the (D chunk, warps) of the Pallas and the jax-triton merge.
@pytest.mark.parametrize("rows, pallas, triton", [(1, (32, 1), (32, 1)), (4, (32, 1), (64, 1)),
                                                  (8, (64, 1), (64, 1)), (12, (128, 1), (64, 1)),
                                                  (16, (128, 1), (256, 2)), (17, (256, 2), (256, 2)),
                                                  (512, (256, 2), (256, 2))])
def test_merge_layout_rule(rows, pallas, triton, monkeypatch):
    """On the library's measured table each merge takes its layout by (row, head) pairs from
    its own measured rows (config.PALLAS_MERGE_LAYOUTS, TRITON_MERGE_LAYOUTS; H100, session 30,
    and H200, session 32: 1 warp with 32- to 128-wide D chunks fastest at small batches,
    jax-triton to 288 pairs and Pallas to 384; D whole on 2 warps above, where chunks only add programs:
    2.0-2.4x slower for jax-triton's fixed 64-wide chunks from 256 programs, H200, session 8).
    On any other tiling -- vLLM's tables, an explicit config -- the jax-triton merge launches as
    the originals do: the tiling as given (no Hopper split tweak, which put TP2 16 rows 3.4e-4
    from vLLM 0.30.0, over the fidelity bar; H200, session 12) and the merge over D whole on 2
    warps."""
    import jax.numpy as jnp

    from qsa_jax import config

    monkeypatch.setattr(config, "device_capability", lambda: (9, 0))
    p = _problem(rows, jnp.bfloat16)
    assert config.measured_entry(p) is not None
    launch = config.pallas_launch(p)
    assert (launch.merge_block_d, launch.merge_warps) == pallas
    launch = config.triton_launch(p)
    assert (launch.merge_block_d, launch.merge_warps) == triton


def test_merge_layout_edges_and_guards(monkeypatch):
    """``config.merge_layout`` at each row's edge, with a D smaller than the chunk, and with
    more splits than the 1-warp layouts were timed with; the Pallas merge's untimed layout off
    Hopper; a ``launch=`` that sets the chunk and not the warps."""
    import jax.numpy as jnp

    from qsa_jax import config

    T, P = config.TRITON_MERGE_LAYOUTS, config.PALLAS_MERGE_LAYOUTS
    assert T == ((24, 32, 1), (288, 64, 1)) and P == ((96, 32, 1), (256, 64, 1), (384, 128, 1))
    layout = config.merge_layout
    assert [layout(n, 256, 33, T) for n in (24, 25, 288, 289)] == [(32, 1), (64, 1), (64, 1), (256, 2)]
    assert [layout(n, 256, 17, P) for n in (96, 97, 256, 257, 384, 385)] == [
        (32, 1), (64, 1), (64, 1), (128, 1), (128, 1), (256, 2)]
    # 128 columns on 1 warp up to 32 splits (32 x 128 / 32 = 128 values); from 33 splits, and
    # where 128 columns are D itself, D whole on 2 warps (the layout the row replaced), never
    # the untimed 128 columns on 2 warps.
    assert layout(300, 256, 32, P) == (128, 1) and layout(300, 256, 33, P) == (256, 2)
    assert layout(300, 256, 65, P) == (256, 2)
    assert layout(300, 128, 16, P) == (128, 2) and layout(200, 128, 16, P) == (64, 1)
    # D = 32: the 32-wide row fits, the 64-wide one does not (D whole on 2 warps); D = 16: whole.
    assert layout(24, 32, 33, T) == (32, 1) and layout(48, 32, 33, T) == (32, 2)
    assert layout(24, 16, 33, T) == (16, 2)
    # 1 warp up to 128 fp32 values per thread: 65 splits x 32 columns (next_pow2 128 x 32 / 32)
    # or 33 x 64; 129 splits at 32 columns, or 65 at 64, run on 2 warps.
    assert layout(24, 256, 65, T) == (32, 1) and layout(24, 256, 129, T) == (32, 2)
    assert layout(48, 256, 33, T) == (64, 1) and layout(48, 256, 65, T) == (64, 2)
    # Off Hopper the Pallas merge keeps its layout from before session 30.
    monkeypatch.setattr(config, "device_capability", lambda: (8, 0))
    launch = config.pallas_launch(_problem(1, jnp.bfloat16))
    assert (launch.merge_block_d, launch.merge_warps) == (64, 2)
    # On a Hopper: a launch= with the default's chunk keeps its warps; another chunk gets 2.
    monkeypatch.setattr(config, "device_capability", lambda: (9, 0))
    for chunk, warps in ((32, 1), (256, 2), (64, 2)):
        launch = config.triton_launch(_problem(1, jnp.bfloat16, launch=qsa_jax.TritonLaunch(merge_block_d=chunk)))
        assert (launch.merge_block_d, launch.merge_warps) == (chunk, warps)
    launch = config.pallas_launch(_problem(1, jnp.bfloat16, launch=qsa_jax.PallasLaunch(merge_warps=4)))
    assert (launch.merge_block_d, launch.merge_warps) == (32, 4)


@pytest.mark.parametrize("rows, pairs_d_warps", [(1, (32, 1)), (8, (64, 1)), (16, (256, 2))])
def test_triton_plan_launches_the_merge_layout(rows, pairs_d_warps, monkeypatch):
    """The jax-triton launch plan (what JAX's route and the shim's triton-torch route launch)
    carries the layout: the merge's grid splits D into the chunk and its meta has the warps."""
    import jax.numpy as jnp

    from qsa_jax import config
    from qsa_jax.ops.sparse_attention.triton import launch_plan

    monkeypatch.setattr(config, "device_capability", lambda: (9, 0))
    plan = launch_plan(_problem(rows, jnp.bfloat16))
    block_d, warps = pairs_d_warps
    assert dict(plan.merge_meta)["num_warps"] == warps
    assert plan.merge_grid[-1] == 256 // block_d, plan.merge_grid
    for cap, table in (((9, 0), "vllm-0.30"), ((9, 0), "vllm-0.34"), ((10, 0), None), ((9, 0), (32, 4, 65, 8))):
        monkeypatch.setattr(config, "device_capability", lambda cap=cap: cap)
        other = _problem(rows, jnp.bfloat16, config=table)
        assert config.measured_entry(other) is None, (cap, table)
        launch = config.triton_launch(other)
        assert (launch.merge_block_d, launch.merge_warps) == (256, 2), (cap, table)
        # ... and the tiling as given: no Hopper split tweak (tune_config_for_hopper) either.
        assert config.triton_tiling(other) == other.config, (cap, table)
    # On a Hopper, vLLM 0.30.0's 16-program tiling (64 splits of 65 tiles) launches as is.
    monkeypatch.setattr(config, "device_capability", lambda: (9, 0))
    tp2_like = _problem(8, jnp.bfloat16, config="vllm-0.30")
    assert tp2_like.config[2:] == (65, 64) and config.triton_tiling(tp2_like).num_splits == 64
    # A launch= override still wins.
    forced = _problem(rows, jnp.bfloat16, config="vllm-0.30", launch=qsa_jax.TritonLaunch(merge_block_d=64))
    assert config.triton_launch(forced).merge_block_d == 64


def test_implementation_order_prefers_jax_triton_for_fp8_on_hopper(monkeypatch):
    """implementation=None: Pallas first on a GPU, except where the measured Hopper table's entry
    names jax-triton (fp8: its one-warp entries from 25 programs, where the Pallas kernel
    spills under XLA's Triton, notes/pallas.md "Session 8", and 5-24 programs at 0.34.0's
    tiling); 0.34.0's table puts jax-triton first for fp8 on a Hopper (0.34.0's own launch),
    bf16 there, 0.30.0's table and explicit configs keep Pallas first; a
    launch= record's implementation first; the CPU order stays XLA only."""
    import jax.numpy as jnp

    from qsa_jax import _implementations, config

    monkeypatch.setattr(_implementations, "backend", lambda: "cpu")
    assert config.sparse_attention_order(_problem(512, jnp.float8_e4m3fn)) == ("xla",)
    monkeypatch.setattr(_implementations, "backend", lambda: "gpu")
    for cap in ((9, 0), (10, 0), (8, 9)):
        monkeypatch.setattr(config, "device_capability", lambda cap=cap: cap)
        hopper = cap == (9, 0)
        fp8_1024 = _problem(512, jnp.float8_e4m3fn)  # 1024 programs: H200_FP8 runs one warp
        assert (fp8_1024.config.num_warps == 1) == hopper  # (else vLLM's/GB300 tables)
        assert config.sparse_attention_order(fp8_1024)[0] == ("triton" if hopper else "pallas"), cap
        # 33-512 programs: jax-triton at 0.34.0's own one-warp tiling (sessions 8-11)
        for rows in (17, 32, 64, 128, 256):
            fp8 = _problem(rows, jnp.float8_e4m3fn)
            assert config.sparse_attention_order(fp8)[0] == ("triton" if hopper else "pallas"), (cap, rows)
            assert config.sparse_attention_order(_problem(rows, jnp.bfloat16))[0] == "pallas", (cap, rows)
        # 5-24 programs: the entries at 0.34.0's own tiling, which jax-triton ran faster
        # (session 10); 25-32 its one-warp tiling (session 26); 1-4 keep the Pallas winners.
        for rows, triton_tiling in ((1, None), (2, None), (3, (64, 2)), (4, (64, 2)), (8, (64, 2)),
                                    (12, (64, 2)), (13, (32, 1)), (16, (32, 1))):
            fp8 = _problem(rows, jnp.float8_e4m3fn)
            want = "triton" if hopper and triton_tiling else "pallas"
            assert config.sparse_attention_order(fp8)[0] == want, (cap, rows)
            assert config.sparse_attention_order(_problem(rows, jnp.bfloat16))[0] == "pallas", (cap, rows)
            if hopper and triton_tiling:
                assert fp8.config[:2] == triton_tiling and fp8.num_stages == 2, fp8.config
        for big in (_problem(2048, jnp.float8_e4m3fn), _problem(4096, jnp.float8_e4m3fn),
                    _problem(2048, jnp.float8_e4m3fn, prefill=True)):  # large decode entry, one warp
            assert config.sparse_attention_order(big)[0] == ("triton" if hopper else "pallas"), cap
        explicit = _problem(512, jnp.float8_e4m3fn, config=(32, 1, 65, 2))  # not measured this way
        assert config.sparse_attention_order(explicit)[0] == "pallas", cap
        # vLLM's tables: on a Hopper fp8 runs jax-triton (0.34.0's own launch) at every size,
        # bf16 keeps Pallas; elsewhere Pallas as before.
        for rows in (1, 4, 12, 16, 64, 512, 4096):
            fp8 = _problem(rows, jnp.float8_e4m3fn, config="vllm-0.34")
            assert config.measured_entry(fp8) is None
            assert config.sparse_attention_order(fp8)[0] == ("triton" if hopper else "pallas"), (cap, rows)
            bf16_034 = _problem(rows, jnp.bfloat16, config="vllm-0.34")
            assert config.sparse_attention_order(bf16_034)[0] == "pallas", (cap, rows)
            fp8_030 = _problem(rows, jnp.float8_e4m3fn, config="vllm-0.30")  # GB300's: not timed
            assert config.sparse_attention_order(fp8_030)[0] == "pallas", (cap, rows)
        bf16 = _problem(512, jnp.bfloat16)
        assert config.sparse_attention_order(bf16) == ("pallas", "triton", "xla"), cap
        assert config.sparse_attention_order(fp8_1024, "pallas")[0] == "pallas"
        assert config.sparse_attention_order(bf16, "triton")[0] == "triton"
        assert sorted(config.sparse_attention_order(fp8_1024)) == ["pallas", "triton", "xla"]
    # Registry.choose walks the given order, skipping what cannot run.
    reg = _implementations.Registry("sparse_attention", "qsa_jax.ops.sparse_attention")
    monkeypatch.setattr(reg, "why_not", lambda name: None if name != "triton" else "no jax-triton")
    assert reg.choose(None, order=("triton", "pallas", "xla")) == "pallas"
    assert reg.choose(None, order=("xla", "pallas")) == "xla"


@pytest.mark.parametrize("sm_count", [78, 114, 132])
def test_hopper_with_another_sm_count_launches_vllms_table(sm_count, monkeypatch):
    """On an sm_90 card the measured table was not measured on (H20: 78 SMs, H100 PCIe: 114) the
    default call is vLLM 0.34.0's: its tiling, no Hopper split tweak, the originals' merge
    layout (D whole on 2 warps), and for fp8 jax-triton first (0.34.0's own launch); on 132 SMs
    the measured table's entry and its launch."""
    import jax.numpy as jnp

    from qsa_jax import _implementations, config

    monkeypatch.setattr(_implementations, "backend", lambda: "gpu")
    monkeypatch.setattr(config, "device_capability", lambda: (9, 0))
    monkeypatch.setattr(config, "device_sm_count", lambda: sm_count)
    measured = sm_count == 132
    for rows in (1, 3, 8, 64, 512, 4096):
        for dtype in (jnp.bfloat16, jnp.float8_e4m3fn):
            p = _problem(rows, dtype)
            vllm = _problem(rows, dtype, config="vllm-0.34")
            assert (config.measured_entry(p) is not None) == measured, (rows, dtype)
            if measured:
                continue
            assert p.config == vllm.config and config.triton_tiling(p) == p.config, (rows, dtype)
            assert (config.triton_launch(p).merge_block_d, config.triton_launch(p).merge_warps) == (256, 2)
            want = "triton" if dtype == jnp.float8_e4m3fn else "pallas"
            assert config.sparse_attention_order(p)[0] == want, (rows, dtype)


def test_prefill_entry_that_differs_only_in_implementation_keeps_its_own(monkeypatch):
    """A measured table whose prefill entry has the decode entry's tiling but another
    implementation (or stages): use_prefill_config=True gets the prefill entry's, False the
    decode entry's (the problem keeps the flag whenever the entry differs, not only the tiling)."""
    import jax.numpy as jnp

    from qsa_jax import _implementations, config

    table = config._table("test-prefill", [(2048, (32, 2, 1, 2))], large_decode=(32, 2, 1, 2),
                          large_prefill=(32, 2, 1, 2, "triton"))
    monkeypatch.setitem(config.MEASURED_TABLES, (9, 0), (table, table))
    monkeypatch.setattr(config, "device_capability", lambda: (9, 0))
    monkeypatch.setattr(_implementations, "backend", lambda: "gpu")
    big = 2048  # x 2 KV heads: above LARGE_BATCH_PROGRAMS
    decode, prefill = _problem(big, jnp.bfloat16), _problem(big, jnp.bfloat16, prefill=True)
    assert decode.config == prefill.config and prefill.prefill_tiling and not decode.prefill_tiling
    assert config.sparse_attention_order(prefill)[0] == "triton"
    assert config.sparse_attention_order(decode)[0] == "pallas"
    small = _problem(4, jnp.bfloat16, prefill=True)  # the flag changes nothing below the large batch
    assert not small.prefill_tiling and config.sparse_attention_order(small)[0] == "pallas"


def test_pallas_keeps_its_own_warps_at_jax_triton_entries(monkeypatch):
    """fp8 at 33-128 programs: the H200 entries name jax-triton at 0.34.0's one-warp tiling,
    but Pallas (without jax-triton, or named) keeps its own sweep winner's 2 warps there
    (one warp spills in Pallas); from 129 programs the one-warp entries were Pallas's own
    winners too."""
    import jax.numpy as jnp

    from qsa_jax import config

    monkeypatch.setattr(config, "device_capability", lambda: (9, 0))
    monkeypatch.setattr(config, "running_on_hopper", lambda: True)
    for rows, pallas_warps in ((17, 2), (32, 2), (64, 2), (128, 1), (1024, 1)):
        p = _problem(rows, jnp.float8_e4m3fn)
        assert p.config.num_warps == 1, rows
        assert config.pallas_launch(p).num_warps == pallas_warps, rows
        assert config.triton_launch(p).num_warps == 1, rows
    assert config.pallas_launch(_problem(32, jnp.bfloat16)).num_warps == config.table_tiling(
        64, False, is_fp8=False, capability=(9, 0)).warps


def test_memcheck_shapes_reach_every_merge_layout(monkeypatch):
    """tools/memcheck.py's sparse shapes, on a Hopper's measured table without the prefill flag,
    launch every 1-warp row of ``config.PALLAS_MERGE_LAYOUTS`` and ``TRITON_MERGE_LAYOUTS`` (a
    layout added without a memcheck shape that runs it fails here). (D whole on 2 warps, the
    merge above the tables' rows, is no longer reached there: shapes 2 and 3 run one split on
    today's table; it was memchecked while it was the merge of shapes 0-1, up to session 29.)"""
    import jax
    import jax.numpy as jnp

    import memcheck  # tools/
    from qsa_jax import config
    from qsa_jax.ops.sparse_attention.base import check_sparse_attention_args

    monkeypatch.setattr(config, "device_capability", lambda: (9, 0))
    s = jax.ShapeDtypeStruct
    seen = {"pallas": set(), "triton": set()}
    for rows, heads, kv_heads, width in memcheck.SPARSE_SHAPES:
        q = s((rows, heads, 256), jnp.bfloat16)
        p = check_sparse_attention_args(
            q, s((5, kv_heads, 16, 512), jnp.bfloat16), s((rows, width + 1), jnp.int32),
            s((3, 4), jnp.int32), s((rows,), jnp.int32), q, use_prefill_config=False, config=None)
        if p.config.num_splits == 1:
            continue  # no merge kernel
        for impl, launch in (("pallas", config.pallas_launch(p)), ("triton", config.triton_launch(p))):
            seen[impl].add((launch.merge_block_d, launch.merge_warps))
    for impl, layouts in (("pallas", config.PALLAS_MERGE_LAYOUTS), ("triton", config.TRITON_MERGE_LAYOUTS)):
        want = {(d, w) for _, d, w in layouts}
        assert want <= seen[impl], (impl, want - seen[impl])


def test_pallas_keeps_its_own_splits_at_wave_filling_entries(monkeypatch):
    """fp8 at 33-132 programs (session 35): the measured table's
    split count fills one wave of the one-warp jax-triton kernel, but Pallas (without
    jax-triton, or named) launches its own sweep's count there (``Tiling.pallas_splits``,
    ``config.pallas_tiling``), and ``pallas.run`` hands its kernels that tiling; jax-triton
    launches the entry's. An explicit ``config=``, vLLM's tables and bf16 keep one tiling."""
    import jax.numpy as jnp

    from qsa_jax import config
    from qsa_jax.ops.sparse_attention import pallas as P

    monkeypatch.setattr(config, "device_capability", lambda: (9, 0))
    monkeypatch.setattr(config, "running_on_hopper", lambda: True)
    # TP1 rows (2 KV heads): programs -> (jax-triton's splits, Pallas's)
    for rows, triton_splits, pallas_splits in ((16, 16, 16), (20, 16, 8), (50, 8, 4), (66, 8, 4), (80, 6, 6),
                                               (100, 4, 4), (150, 3, 3), (200, 2, 2), (264, 2, 2), (512, 1, 1)):
        p = _problem(rows, jnp.float8_e4m3fn)
        assert config.triton_tiling(p).num_splits == p.config.num_splits == triton_splits, rows
        assert config.pallas_tiling(p).num_splits == pallas_splits, rows
        assert config.pallas_tiling(p)._replace(num_splits=triton_splits) == p.config, rows
    for p in (_problem(150, jnp.float8_e4m3fn, config=(32, 1, 65, 3)), _problem(150, jnp.bfloat16),
              _problem(150, jnp.float8_e4m3fn, config="vllm-0.34")):
        assert config.pallas_tiling(p) == p.config
    seen = []

    def split_kernel(p, *args, **kwargs):
        seen.append(p.config)
        raise RuntimeError("stop: the tiling is what this test checks")

    monkeypatch.setattr(P, "split_kernel", split_kernel)
    p = _problem(50, jnp.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="stop"):
        P.run(p, None, None, None, None, None, None)
    assert seen == [config.pallas_tiling(p)] and seen[0].num_splits == 4 != p.config.num_splits
