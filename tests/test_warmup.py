"""warmup compiles every reachable config and fills the persistent cache."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import qsa_jax
from qsa_jax.warmup import default_row_counts


def test_default_row_counts_reach_every_config():
    """Against a brute force over every row count (not first_rows, which both functions use):
    the warmup's row counts reach every config, each config's first row count is the smallest
    that picks it, and reachable_configs lists exactly those."""
    from qsa_jax.config import first_rows

    first = {}
    for r in range(1, 8193):
        for f in (False, True):
            first.setdefault(qsa_jax.select_config(r, 2, f, 2051), r)
    rows = default_row_counts(2, 2051)
    got = {qsa_jax.select_config(r, 2, f, 2051) for r in rows for f in (False, True)}
    assert got == set(first) == set(qsa_jax.reachable_configs(2, 2051))
    assert first_rows(2, 2051) == first and set(first.values()) <= set(rows)
    assert max(rows) == 8192 and 1 in rows


def test_warmup_returns_profiles_and_writes_cache(tmp_path):
    rng = np.random.default_rng(0)
    kv = (rng.standard_normal((4, 2, 8, 32)).astype(np.float32)).astype(jax.numpy.bfloat16)
    table = np.zeros((2, 3), np.int32)
    try:
        profiles = qsa_jax.warmup(kv, table, num_query_heads=4, selection_width=131,
                                  row_counts=[1, 13, 1100], persistent_cache=tmp_path, config="vllm-0.30")
    finally:
        jax.config.update("jax_compilation_cache_dir", None)
    # 1 row -> (32, 5 splits, 4 warps); 13 rows x 2 = 26 programs -> 16 wanted, 5 tiles;
    # 1100 rows x 2 = 2200 programs -> both prefill and decode tilings.
    assert profiles == ((32, 1, 1), (32, 5, 1), (32, 5, 4), (64, 1, 2))
    assert any(tmp_path.iterdir()), "persistent cache folder stayed empty"


def _deployment(rng, rows):
    """One deployment's shapes (9 pages of 8 tokens, 2 requests of 3 pages, W = 131), fresh
    random values per call: what a server passes after warming up."""
    from qsa_testing import cases as C

    return C.sparse_attention_case(rng, rows=rows, num_query_heads=4, num_kv_heads=2, head_dim=16,
                                   page_size=8, selection_blocks=32, context_tokens=24, num_requests=2,
                                   num_pages=9)


_COMPILES: list[str] = []


def _count_compiles():
    """Listen (once per process) for XLA backend compilations: what a warm call must not do."""
    if not _COMPILES:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(
            lambda event, _secs, **_: _COMPILES.append(event) if event.endswith("backend_compile_duration")
            else None)
        _COMPILES.append("listening")


def _served_without_compiling(rng, kv, calls, gate_dtype=None):
    """Run each (rows, flag, config, launch) call on fresh device arrays (the gate in
    ``gate_dtype``, default its bf16); True when none of the calls compiled an executable."""
    _count_compiles()
    kv = jax.device_put(kv)
    compiled = 0
    for rows, flag, config, launch in calls:
        case = _deployment(rng, rows)
        gate = case.output_gate if gate_dtype is None else case.output_gate.astype(gate_dtype)
        args = jax.block_until_ready(jax.device_put(
            (case.q, case.logical_indices, case.block_table, case.token_to_req, gate)))
        q, idx, table, req, gate = args
        before = len(_COMPILES)
        out = qsa_jax.sparse_attention(q, kv, idx, table, req, gate, use_prefill_config=flag, config=config,
                                       implementation="xla", launch=launch)
        compiled += len(_COMPILES) - before
        assert np.isfinite(np.asarray(out, np.float32)).all()
    return compiled == 0


def test_warmup_leaves_every_warmed_call_compiled():
    """After warmup, server calls at the warmed row counts (both flags; a table name, an explicit
    tiling) compile nothing new; a row count that was not warmed does (the check can fail)."""
    rng = np.random.default_rng(5)
    kv = _deployment(rng, 1).kv_cache
    table = np.zeros((2, 3), np.int32)
    rows = [1, 3, 1100]
    explicit = (16, 2, 9, 3)
    for config in ("vllm-0.30", explicit):
        profiles = qsa_jax.warmup(kv, table, num_query_heads=4, selection_width=131, row_counts=rows,
                                  implementation="xla", persistent_cache=False, config=config)
        if config is explicit:
            assert profiles == ((16, 3, 2),)
        calls = [(r, f, config, None) for r in rows for f in (False, True)]
        assert _served_without_compiling(rng, kv, calls), config
    assert not _served_without_compiling(rng, kv, [(5, False, explicit, None)])
    # An fp32 gate is another executable (rows 3 warmed with bf16 gates above still compile),
    # warmed with gate_dtype (rows 7, never called before) it is served without compiling.
    assert not _served_without_compiling(rng, kv, [(3, False, explicit, None)], np.float32)
    qsa_jax.warmup(kv, table, num_query_heads=4, selection_width=131, row_counts=[7], implementation="xla",
                   persistent_cache=False, config=explicit, gate_dtype=jnp.float32)
    assert _served_without_compiling(rng, kv, [(7, False, explicit, None)], np.float32)


def test_warmup_config_and_its_old_name():
    """``config=`` takes what sparse_attention's takes, checked before anything compiles;
    ``table=`` still works, with a DeprecationWarning, and not together with ``config=``."""
    kv = _deployment(np.random.default_rng(6), 1).kv_cache
    table = np.zeros((2, 3), np.int32)
    kw = dict(num_query_heads=4, selection_width=131, row_counts=[2], implementation="xla",
              persistent_cache=False)
    with pytest.warns(DeprecationWarning, match="config="):
        old = qsa_jax.warmup(kv, table, table="vllm-0.30", **kw)
    assert old == qsa_jax.warmup(kv, table, config="vllm-0.30", **kw)
    with pytest.raises(ValueError, match="not both"):
        qsa_jax.warmup(kv, table, table="vllm-0.30", config="vllm-0.34", **kw)
    with pytest.raises(ValueError, match="num_tiles"):  # 4 tiles of 16 read 64 of 131 columns
        qsa_jax.warmup(kv, table, config=(16, 2, 4, 1), **kw)
    with pytest.raises(ValueError, match="table name"):
        qsa_jax.warmup(kv, table, config="vllm-0.31", **kw)
    with pytest.raises(ValueError, match="row_counts"):
        qsa_jax.warmup(kv, table, **{**kw, "row_counts": [4, -1]})
    with pytest.raises(TypeError, match="row_counts"):
        qsa_jax.warmup(kv, table, **{**kw, "row_counts": [4, 2.5]})
    launch = qsa_jax.PallasLaunch(num_warps=4)
    with pytest.raises(ValueError, match="launch="):  # a Pallas launch on an XLA call
        qsa_jax.warmup(kv, table, launch=launch, **kw)


def test_warmup_follows_the_tables_flag_past_2048_programs(monkeypatch):
    """Above 2048 programs the prefill flag is another executable only where it picks another
    entry (base.prefill_flag_selects): a prefill entry that differs only in its implementation
    is warmed with both flags; a measured table whose bands go past 2048 (session 38's fp8 table)
    is warmed once there and serves both flags. A table that would let such bands override two
    different large-batch entries is refused."""
    from qsa_jax import config

    rng = np.random.default_rng(11)
    kv = _deployment(rng, 1).kv_cache
    block_table = np.zeros((2, 3), np.int32)
    monkeypatch.setattr(config, "device_capability", lambda: (9, 0))
    rows = 1100  # x 2 KV heads: 2200 programs
    by_implementation = config._table("test-prefill", [(2048, (16, 2, 1, 2))], large_decode=(16, 2, 1, 2),
                                      large_prefill=(16, 2, 1, 2, "triton"))
    past = config._table("test-past", [(2048, (16, 2, 1, 2)), (4096, (16, 3, 1, 2))], large_decode=(16, 1, 1, 2))
    for table, profiles in ((by_implementation, ((16, 2, 1),)), (past, ((16, 3, 1),))):
        monkeypatch.setitem(config.MEASURED_TABLES, (9, 0), (table, table))
        got = qsa_jax.warmup(kv, block_table, num_query_heads=4, selection_width=131, row_counts=[rows],
                             implementation="xla", persistent_cache=False)
        assert got == profiles, (table.name, got)
        assert _served_without_compiling(rng, kv, [(rows, True, None, None), (rows, False, None, None)]), table.name
    with pytest.raises(ValueError, match="large-batch entries differ"):
        config._table("test-bad", [(2048, (16, 2, 1, 2)), (4096, (16, 3, 1, 2))], large_decode=(16, 1, 1, 2),
                      large_prefill=(32, 1, 1, 1))
