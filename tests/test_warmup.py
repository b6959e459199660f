"""warmup compiles every reachable config and fills the persistent cache."""


import jax
import numpy as np

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
                                  row_counts=[1, 13, 1100], persistent_cache=tmp_path, table="vllm-0.30")
    finally:
        jax.config.update("jax_compilation_cache_dir", None)
    # 1 row -> (32, 5 splits, 4 warps); 13 rows x 2 = 26 programs -> 16 wanted, 5 tiles;
    # 1100 rows x 2 = 2200 programs -> both prefill and decode tilings.
    assert profiles == ((32, 1, 1), (32, 5, 1), (32, 5, 4), (64, 1, 2))
    assert any(tmp_path.iterdir()), "persistent cache folder stayed empty"
