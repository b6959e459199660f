"""compress_groups_with_ratio and store_cache_rows (XLA) vs the oracle; in-place stores."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import qsa_jax
from qsa_testing import cases as C
from qsa_testing import oracle

FIELDS = ("raw_keys", "raw_positions", "compressor_state_cache", "compressor_state_block_table",
          "token_to_req", "query_start_loc", "logical_positions", "compressed_slots")


def _compress(case, impl="xla"):
    a = [getattr(case, f) for f in FIELDS]
    a[1] = a[1].astype(np.int32)  # JAX without x64
    rope = None if case.rope_cache is None else case.rope_cache.astype(np.int32)
    return qsa_jax.compress_groups_with_ratio(*a, case.compress_ratio, rope, implementation=impl)


@pytest.mark.parametrize("ring,ratio", [(4, 4), (8, 4), (5, 3), (2, 1)])
@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_compress_matches_oracle(ring, ratio, rope, seed):
    rng = np.random.default_rng(seed * 100 + ring)
    lens = list(rng.integers(0, 12, 5))
    case = C.compress_case(rng, chunk_lens=lens, head_dim=64, ring=ring, ratio=ratio,
                           with_rope=rope, edge=seed > 0)
    pooled, first = _compress(case)
    ref_pooled, ref_first = oracle.compress_groups_oracle(
        *[getattr(case, f) for f in FIELDS], case.compress_ratio, case.rope_cache)
    np.testing.assert_array_equal(np.asarray(pooled).astype(np.float64), ref_pooled)
    np.testing.assert_array_equal(np.asarray(first).astype(np.int64), ref_first)


def test_compress_positions_near_int32_max_are_exact():
    rng = np.random.default_rng(1)
    case = C.compress_case(rng, chunk_lens=[3, 5], position_base=2**31 - 60, with_rope=False)
    _, first = _compress(case)
    _, ref_first = oracle.compress_groups_oracle(*[getattr(case, f) for f in FIELDS], case.compress_ratio)
    assert ref_first.max() > 2**31 - 70
    np.testing.assert_array_equal(np.asarray(first).astype(np.int64), ref_first)


def _words(x):
    """int64 values -> int32 words, last axis doubled (as DLPack hands torch's int64 to JAX)."""
    x = np.ascontiguousarray(np.asarray(x, np.int64))
    return x.view(np.int32).reshape(x.shape[:-1] + (2 * x.shape[-1],)) if x.ndim else x.view(np.int32)


def test_end_positions_keep_validity_slot_and_first_position():
    """``int64_words.end_positions`` against int64 arithmetic on the host: the stand-in is e
    itself inside int32, else has e's validity (e >= C - 1) and ring slot (e mod S); the words
    of e - C + 1 are exact, borrow included (e = 2**32 + 1, C = 4)."""
    from qsa_jax.ops.compress_groups.int64_words import end_positions

    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    edges = [0, 1, 2, 3, 2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**32 + 2, 2**33 + 7, 2**40 + 5, 2**62,
             2**63 - 1, -1, -(2**31), -(2**31) - 1, -(2**32), -(2**63)]
    e = np.concatenate([np.array(edges, np.int64), rng.integers(-(2**63), 2**63 - 1, 200, dtype=np.int64),
                        rng.integers(-(2**34), 2**34, 200, dtype=np.int64)])
    for ring, ratio in ((4, 4), (5, 3), (7, 1), (96, 64), (65536, 4)):
        stand_in, fits, first = (np.asarray(x) for x in end_positions(jnp.asarray(_words(e)), ring, ratio))
        inside = (e >= -(2**31)) & (e < 2**31)
        np.testing.assert_array_equal(fits, inside)
        np.testing.assert_array_equal(stand_in[inside], e[inside])
        np.testing.assert_array_equal(stand_in.astype(np.int64) >= ratio - 1, e >= ratio - 1)
        valid = e >= ratio - 1
        np.testing.assert_array_equal(np.mod(stand_in[valid].astype(np.int64), ring), np.mod(e[valid], ring))
        np.testing.assert_array_equal(first.reshape(-1).view(np.int64), e - (ratio - 1))


@pytest.mark.parametrize("offset", [0, 2**31 - 20, 2**32, 2**32 + 3, 2**40 + 5, -(2**33)])
@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_compress_int64_words_is_the_int64_operator(offset, rope, impl):
    """``compress_groups_with_ratio_int64_words`` (int64 metadata as int32 words: JAX without
    x64, the shim's form) gives the int64 oracle's result bit for bit with positions around and
    far beyond int32 and int64 indices beyond it (2**32 + r must not wrap to request r)."""
    from qsa_jax.ops.compress_groups.int64_words import compress_groups_with_ratio_int64_words

    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    case = C.compress_case(rng, chunk_lens=[5, 1, 9, 3, 2], with_rope=rope, ring=8, edge=True)
    case.logical_positions = case.logical_positions.astype(np.int64) + offset
    case.raw_positions = case.raw_positions.astype(np.int64) + offset
    if rope:
        case.rope_cache = case.rope_cache.astype(np.int64) + offset
    req = case.token_to_req.astype(np.int64)
    req[::3] += 2**32
    case.token_to_req = req
    ref_pooled, ref_first = oracle.compress_groups_oracle(*[getattr(case, f) for f in FIELDS],
                                                          case.compress_ratio, case.rope_cache)
    flags = (True, True, False, True, True)  # query_start_loc stays int32
    a = [case.raw_keys, _words(case.raw_positions), case.compressor_state_cache,
         _words(case.compressor_state_block_table), _words(case.token_to_req), case.query_start_loc,
         _words(case.logical_positions), _words(case.compressed_slots)]
    pooled, first = compress_groups_with_ratio_int64_words(
        *a, case.compress_ratio, None if case.rope_cache is None else _words(case.rope_cache),
        int64_words=flags, implementation=impl)
    np.testing.assert_array_equal(np.asarray(pooled).astype(np.float64), ref_pooled, err_msg=f"seed {seed}")
    np.testing.assert_array_equal(np.ascontiguousarray(np.asarray(first)).view(np.int64)[..., 0], ref_first,
                                  err_msg=f"seed {seed}")
    if offset >= 0:  # (a negative offset leaves every row invalid: all zeros, as checked)
        assert np.asarray(pooled).any() and (ref_first != 0).any()


@pytest.mark.parametrize("offset", [2**32, 2**40 + 5, -(2**33)])
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("x64", [True, False], ids=["jax-int64", "numpy-int64"])
def test_compress_int64_end_positions_beyond_int32(offset, rope, x64):
    """The public call with int64 end positions past int32 (JAX with x64, or NumPy int64): each
    row's validity and ring slot are the int64 value's, so pooled matches the int64 oracle; the
    first positions are exact in an int64 result (x64) and keep their low word in an int32 one
    (as an int64 kernel storing into int32). Saturating e to int32, as indices are, read the
    wrong ring slot. (The negative offset checks that rows past int32 below stay invalid.)"""
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    case = C.compress_case(rng, chunk_lens=[5, 1, 9, 3], ring=8, with_rope=rope, edge=True)
    case.logical_positions = case.logical_positions.astype(np.int64) + offset
    case.raw_positions = case.raw_positions.astype(np.int64) + offset
    if rope:
        case.rope_cache = case.rope_cache.astype(np.int64) + offset
    ref_pooled, ref_first = oracle.compress_groups_oracle(*[getattr(case, f) for f in FIELDS],
                                                          case.compress_ratio, case.rope_cache)
    a = [getattr(case, f) for f in FIELDS]
    rope_cache = case.rope_cache
    with jax.enable_x64(x64):
        if x64:
            a = [jnp.asarray(x) for x in a]
            rope_cache = None if rope_cache is None else jnp.asarray(rope_cache)
        else:  # (JAX without x64 has no int64 positions to return: int32 ones, low words)
            a[1] = a[1].astype(np.int32)
            rope_cache = None if rope_cache is None else rope_cache.astype(np.int32)
        pooled, first = qsa_jax.compress_groups_with_ratio(*a, case.compress_ratio, rope_cache,
                                                           implementation="xla")
        pooled, first = np.asarray(pooled).astype(np.float64), np.asarray(first)
    np.testing.assert_array_equal(pooled, ref_pooled, err_msg=f"seed {seed}")
    np.testing.assert_array_equal(first, ref_first if x64 else ref_first.astype(np.int32), err_msg=f"seed {seed}")
    if offset > 0:
        assert pooled.any() and (ref_first != 0).any(), seed


def test_compress_int64_end_positions_on_a_large_ring():
    """Rings past the words' 65536-slot bound: the public call's int64 path (native int64
    arithmetic) still reads the right ring slot; the words entry point refuses before any launch."""
    from qsa_jax.ops.compress_groups.int64_words import compress_groups_with_ratio_int64_words

    rng = np.random.default_rng(5)
    case = C.compress_case(rng, chunk_lens=[3, 2], ring=70000, head_dim=16, with_rope=False)
    case.logical_positions = case.logical_positions.astype(np.int64) + 2**32
    ref_pooled, _ = oracle.compress_groups_oracle(*[getattr(case, f) for f in FIELDS], case.compress_ratio)
    a = [getattr(case, f) for f in FIELDS]
    a[1] = a[1].astype(np.int32)
    pooled, _ = qsa_jax.compress_groups_with_ratio(*a, case.compress_ratio, implementation="xla")
    np.testing.assert_array_equal(np.asarray(pooled).astype(np.float64), ref_pooled)
    assert np.asarray(pooled).any()
    a[6] = _words(case.logical_positions)
    a[1] = _words(case.raw_positions.astype(np.int64))
    with pytest.raises(ValueError, match="compressor_state_cache: a ring of 70000 slots"):
        compress_groups_with_ratio_int64_words(*a, case.compress_ratio, int64_words=(False, False, False, True, False))


def test_compress_rejects_bad_arguments():
    rng = np.random.default_rng(0)
    case = C.compress_case(rng, chunk_lens=[2, 3])
    a = [getattr(case, f) for f in FIELDS]
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="compress_ratio"):
            qsa_jax.compress_groups_with_ratio(*a, bad)
    with pytest.raises(ValueError, match="raw_keys"):
        qsa_jax.compress_groups_with_ratio(a[0][:, 0], *a[1:], 4)
    with pytest.raises(ValueError, match="ring size"):
        qsa_jax.compress_groups_with_ratio(*a, 5)
    with pytest.raises(ValueError, match="query_start_loc"):
        qsa_jax.compress_groups_with_ratio(*a[:5], a[5][:1], *a[6:], 4)
    with pytest.raises(ValueError, match="rope_cache"):
        qsa_jax.compress_groups_with_ratio(*a, 4, np.zeros((1, 1, 1, 3), np.int32))
    with pytest.raises(TypeError, match="compressor_state_cache dtype"):
        qsa_jax.compress_groups_with_ratio(a[0], a[1], a[2].astype(np.float32), *a[3:], 4)
    with pytest.raises(TypeError, match="token_to_req must be an array"):
        qsa_jax.compress_groups_with_ratio(*a[:4], a[4].tolist(), *a[5:], 4)
    with pytest.raises(ValueError, match="token_to_req must be"):  # once an XLA broadcasting error
        qsa_jax.compress_groups_with_ratio(*a[:4], a[4][:, None], *a[5:], 4)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
@pytest.mark.parametrize("x64", [False, True], ids=["numpy-int64", "jax-int64"])
def test_indices_beyond_int32_stay_out_of_range(impl, x64):
    """vLLM's indices are int64: a slot of 2**32 + 5 or a request of 2**32 is out of range and
    must be skipped, not wrapped to slot 5 / request 0 by the narrowing to int32 (NumPy int64
    with JAX's x64 off, JAX int64 with it on)."""
    rng = np.random.default_rng(7)
    cache = C.bf16_random(rng, (4, 8, 1, 16))
    rows = rng.standard_normal((3, 16)).astype(np.float32)
    slots = np.array([2**32 + 5, -(2**32) + 1, 9], np.int64)  # wrap to 5 and 1; 9 is valid
    case = C.compress_case(rng, chunk_lens=[3, 2], head_dim=16)
    a = {f: getattr(case, f) for f in FIELDS}
    a["raw_positions"] = a["raw_positions"].astype(np.int32)
    clean = qsa_jax.compress_groups_with_ratio(**a, compress_ratio=case.compress_ratio, implementation=impl)
    assert np.any(np.asarray(clean[0][0], np.float32)), "row 0 must be valid before its request is spoiled"
    req = np.asarray(a["token_to_req"], np.int64).copy()
    req[0] = 2**32  # wraps to request 0, row 0's own request
    with jax.enable_x64(x64):
        convert = jnp.asarray if x64 else (lambda x: x)
        new = np.asarray(qsa_jax.store_cache_rows(jnp.asarray(cache), convert(slots), rows, implementation=impl),
                         np.float32)
        pooled, first = qsa_jax.compress_groups_with_ratio(**{**a, "token_to_req": convert(req)},
                                                           compress_ratio=case.compress_ratio, implementation=impl)
    changed = np.argwhere((new != np.asarray(cache, np.float32)).any(-1).reshape(-1)).ravel().tolist()
    assert changed == [9]
    assert not np.any(np.asarray(pooled[0], np.float32)) and not np.any(np.asarray(first[0]))
    np.testing.assert_array_equal(np.asarray(pooled[1:], np.float32), np.asarray(clean[0][1:], np.float32))


@pytest.mark.parametrize("rows_dtype", [C.BF16, np.float32])
@pytest.mark.parametrize("three_d", [False, True])
def test_store_matches_oracle(rows_dtype, three_d):
    rng = np.random.default_rng(2)
    case = C.store_case(rng, n=50, pages=5, page_size=16, rows_dtype=rows_dtype, three_d=three_d)
    got = qsa_jax.store_cache_rows(case.cache, case.slot_mapping, case.rows)
    ref = oracle.store_cache_rows_oracle(case.cache, case.slot_mapping, case.rows)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), ref.view(np.uint16))


def test_store_donated_cache_is_aliased_to_the_result():
    """With donate=True the cache parameter is aliased to the output.

    The lowered module must declare the aliasing (that is what makes XLA write
    in place); the donated input is consumed. Whether the CPU runtime then
    reuses the buffer varies from run to run (seen here), so the pointer itself
    is checked on the GPU (test below).
    """
    from qsa_jax.ops.store_cache_rows import api
    from qsa_jax.ops.store_cache_rows.base import check_store_args

    rng = np.random.default_rng(4)
    case = C.store_case(rng, n=30, pages=4, page_size=16)
    problem = check_store_args(case.cache, case.slot_mapping, case.rows)
    for impl in qsa_jax.available_implementations("store_cache_rows"):
        text = api._run_donated.lower(case.cache, case.slot_mapping, case.rows, problem=problem,
                                      implementation=impl).as_text()
        assert "tf.aliasing_output = 0" in text.split("func.func public @main", 1)[1].split("\n")[0], impl
    cache = jax.device_put(case.cache)
    new = qsa_jax.store_cache_rows(cache, case.slot_mapping, case.rows, donate=True)
    assert cache.is_deleted()
    ref = oracle.store_cache_rows_oracle(case.cache, case.slot_mapping, case.rows)
    np.testing.assert_array_equal(np.asarray(new).view(np.uint16), ref.view(np.uint16))


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["xla", "pallas", "triton"])
def test_store_donated_updates_in_place_on_gpu(impl):
    if impl not in qsa_jax.available_implementations("store_cache_rows"):
        pytest.skip(f"{impl} cannot run here")
    rng = np.random.default_rng(4)
    case = C.store_case(rng, n=300, pages=64, page_size=16)
    cache = jax.device_put(case.cache)
    before = cache.unsafe_buffer_pointer()
    new = qsa_jax.store_cache_rows(cache, case.slot_mapping, case.rows, donate=True,
                                   implementation=impl)
    assert new.unsafe_buffer_pointer() == before, "donated cache was not updated in place"
    ref = oracle.store_cache_rows_oracle(case.cache, case.slot_mapping, case.rows)
    np.testing.assert_array_equal(np.asarray(new).view(np.uint16), ref.view(np.uint16))


def test_store_rejects_bad_arguments():
    cache = jnp.zeros((2, 4, 1, 8), jnp.bfloat16)
    with pytest.raises(ValueError, match="cache must be"):
        qsa_jax.store_cache_rows(cache[:, :, 0], np.zeros(1, np.int32), np.zeros((1, 8)))
    with pytest.raises(ValueError, match="nonzero"):
        qsa_jax.store_cache_rows(cache[:0], np.zeros(1, np.int32), np.zeros((1, 8)))
    with pytest.raises(ValueError, match="rows must be"):
        qsa_jax.store_cache_rows(cache, np.zeros(2, np.int32), np.zeros((1, 8)))
    with pytest.raises(ValueError, match="one head"):
        qsa_jax.store_cache_rows(cache, np.zeros(1, np.int32), np.zeros((1, 2, 8)))
    with pytest.raises(TypeError, match="slot_mapping must be an array"):  # a list once recursed
        qsa_jax.store_cache_rows(cache, [0, 5], np.ones((2, 8)))
