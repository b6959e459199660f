"""select_config with table="vllm-0.30" must return the originals' tuple for every input (pure
Python). The table is named, not left to the device: on a Hopper GPU the default is the measured
H200 table (tests/test_fp8.py and test_pallas.py check the device keying)."""

import pytest

from qsa_jax import SparseAttentionConfig, reachable_configs, select_config
from qsa_testing import originals

WIDTHS = (1, 31, 32, 33, 2051, 8195)


@pytest.fixture(scope="module")
def original_select():
    return originals.load_or_skip()._select_config


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("width", WIDTHS)
def test_matches_original_table(original_select, kv_heads, width):
    mismatches = []
    for rows in range(1, 8193):
        for flag in (False, True):
            ours = select_config(rows, kv_heads, flag, width, table="vllm-0.30")
            theirs = original_select(rows, kv_heads, flag, width)
            if tuple(ours) != tuple(theirs):
                mismatches.append((rows, flag, tuple(ours), theirs))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:3]}"


def test_config_compares_equal_to_original_tuple():
    cfg = select_config(1, 2, False, 2051, table="vllm-0.30")
    assert cfg == (32, 4, 65, 64)  # NamedTuple equality with the originals' plain tuple
    assert isinstance(cfg, SparseAttentionConfig) and cfg.num_splits == 64


def test_reachable_configs_real_width():
    # Hk=2 (TP1): every distinct tiling rows 1..8192 x both flags can give.
    got = {tuple(c) for c in reachable_configs(2, 2051, table="vllm-0.30")}
    assert got == {(32, 4, 65, 64), (32, 1, 65, 16), (32, 1, 65, 8), (32, 1, 65, 4),
                   (64, 2, 33, 4), (64, 2, 33, 1), (32, 1, 65, 1)}


@pytest.mark.parametrize("bad", [(-1, 2, False, 10), (1, 0, False, 10), (1, 2, False, 0)])
def test_rejects_nonsense(bad):
    with pytest.raises(ValueError):
        select_config(*bad)
