"""The public functions check arguments once per signature, and still reject bad ones every time."""

import jax
import numpy as np
import pytest

import qsa_jax
from qsa_jax.ops._memo import memoised, spec, stand_in
from qsa_jax.ops.sparse_attention import api as sparse_api
from qsa_testing import cases as C


def test_spec_round_trip():
    a = np.zeros((3, 4), np.int32)
    s = spec((a, a))
    assert s == ("seq", ((3, 4), np.dtype(np.int32)), ((3, 4), np.dtype(np.int32)))
    back = stand_in(s)
    assert isinstance(back, tuple) and back[0].shape == (3, 4) and back[0].dtype == np.int32
    assert spec(None) is None and stand_in(None) is None


def test_check_runs_once_per_signature_and_errors_are_not_cached():
    calls = []

    @memoised
    def check(x, *, flag):
        calls.append(x.shape)
        if x.shape[0] == 0:
            raise ValueError("empty")
        return x.shape[0] * (2 if flag else 1)

    a, b = np.ones((2, 3)), np.zeros((2, 3))
    assert check(a, flag=True) == 4 and check(b, flag=True) == 4
    assert len(calls) == 1  # same shapes and dtypes: one check
    assert check(a, flag=False) == 2 and len(calls) == 2
    for _ in range(2):
        with pytest.raises(ValueError, match="empty"):
            check(np.ones((0, 3)), flag=True)
    assert len(calls) == 4  # a failure is checked again on every call


def test_sparse_attention_plan_is_memoised_but_bad_args_still_raise():
    rng = np.random.default_rng(0)
    case = C.sparse_attention_case(rng, rows=2, num_query_heads=4, num_kv_heads=2, head_dim=16,
                                   page_size=8, selection_blocks=4, context_tokens=40)
    args = (case.q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req,
            case.output_gate)
    sparse_api._plan.cache_clear()
    first = np.asarray(qsa_jax.sparse_attention(*args))
    again = np.asarray(qsa_jax.sparse_attention(*[jax.numpy.asarray(a) for a in args]))
    np.testing.assert_array_equal(first.view(np.uint16), again.view(np.uint16))
    for _ in range(2):
        with pytest.raises(TypeError, match="q must be bfloat16"):
            qsa_jax.sparse_attention(case.q.astype(np.float32), *args[1:])


def test_a_value_equal_to_a_memoised_one_but_of_another_type_is_checked_again():
    """4.0 == 4 (and hashes alike): a check that refuses the float must refuse it also after the
    int was memoised, for a static scalar, a tuple and a named tuple (which come back rebuilt,
    as given)."""
    from qsa_jax.config import SparseAttentionConfig

    seen = []

    @memoised
    def check(x, *, ratio, config):
        seen.append(config)
        if not isinstance(ratio, int) or not all(isinstance(c, int) for c in config):
            raise ValueError("not an int")
        return ratio

    a = np.ones((2, 3))
    named = SparseAttentionConfig(16, 4, 2, 1)
    assert check(a, ratio=4, config=(16, 4, 2, 1)) == 4 and check(a, ratio=4, config=named) == 4
    assert type(seen[-1]) is SparseAttentionConfig and seen[-1] == named
    for ratio, config in ((4.0, (16, 4, 2, 1)), (4, (16.0, 4, 2, 1)), (4, SparseAttentionConfig(16.0, 4, 2, 1))):
        with pytest.raises(ValueError, match="not an int"):
            check(a, ratio=ratio, config=config)
    # Through the operators: the bad value raises after the good one ran (it did not before).
    rng = np.random.default_rng(0)
    cc = C.compress_case(rng, chunk_lens=[3, 2], head_dim=16)
    arrays = {k: jax.numpy.asarray(v) for k, v in cc.arrays().items()}
    qsa_jax.compress_groups_with_ratio(**arrays, compress_ratio=4, implementation="xla")
    with pytest.raises(ValueError, match="compress_ratio"):
        qsa_jax.compress_groups_with_ratio(**arrays, compress_ratio=4.0, implementation="xla")
    with pytest.raises(ValueError, match="row_stride"):
        qsa_jax.StridedQuery(np.zeros((12, 16), np.float32), 3, 4, 4.0)
