"""``compress_groups_with_ratio`` on int64 metadata held as int32 words (JAX without x64).

vLLM's indexer passes int64 positions, block tables, request ids, row offsets and slots.
qsa_torch_shim hands them over through DLPack as int32 word pairs (``qsa_jax.ops._arrays``:
little-endian, last axis doubled), and this module is where the operator's int64 semantics
are kept for them, so that the shim only converts:

- block table, request ids, row offsets and slots are indices compared against ranges inside
  int32: saturated (``int32_from_int64_words``), never wrapped.
- the end positions e are used only through e >= C - 1 (validity), e mod S (the ring slot)
  and differences that cancel e; the one e-valued output is e - C + 1 (the first positions
  without a rope cache). An e outside int32 gets an int32 stand-in with the same validity and
  the same e mod S (``end_positions``), and its exact e - C + 1 is rebuilt from the words.
- the rope positions (``raw_positions`` and the rope ring) only flow into the first positions,
  which are a selection (a gather, or 0 for an invalid row): the low and the high words are
  selected independently, each exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from qsa_jax.ops._arrays import int32_from_int64_words, int64_words_fit_int32, int64_words_from_int32, \
    split_int64_words
from qsa_jax.ops.compress_groups import api as _api  # (api imports this module too)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# Where a large positive e's stand-in sits: 2**30 + ((e - 2**30) mod S), so that e' mod S =
# e mod S and e' - C + 1 stays positive and inside int32 for any ratio C <= 2**30.
_BIG_BASE = 2**30
# e mod S is computed in uint32 from the words (products of two values below S): exact while
# S <= 2**16. A compressor ring holds a few groups of C rows, far below it.
MAX_RING_SLOTS = 2**16


def end_positions(words, ring_size: int, ratio: int):
    """int64 end positions as words [2R] -> (e' [R] int32, fits [R] bool, e - C + 1 as
    words [R, 2]): e' = e where e fits int32; else an e' with e's validity (e >= C - 1) and
    e's ring slot (e mod S): INT32_MIN + C for a negative e (invalid), 2**30 + ((e - 2**30)
    mod S) for a positive one (valid, C <= 2**30)."""
    lo, hi = split_int64_words(words)
    fits = int64_words_fit_int32(lo, hi)
    # e mod S from the words: (hi * 2**32 + ulo) mod S, every product below 2**32 (S <= 2**16).
    if ring_size > MAX_RING_SLOTS:
        raise ValueError(f"compressor_state_cache: a ring of {ring_size} slots; int64 end positions "
                         f"need at most {MAX_RING_SLOTS}")
    two32_mod = (2**32) % ring_size
    ulo = lax.bitcast_convert_type(lo, jnp.uint32)
    e_mod = ((hi.astype(jnp.uint32) % ring_size) * two32_mod + ulo % ring_size) % ring_size
    big = _BIG_BASE + (e_mod.astype(jnp.int32) - _BIG_BASE % ring_size) % ring_size
    stand_in = jnp.where(fits, lo, jnp.where(hi < 0, INT32_MIN + ratio, big))
    # e - (C - 1) in words: a subtraction with borrow.
    c1 = jnp.uint32(ratio - 1)
    first_lo = lax.bitcast_convert_type(ulo - c1, jnp.int32)
    first = jnp.stack([first_lo, hi - (ulo < c1).astype(jnp.int32)], -1)
    return stand_in, fits, first


def _int64_stand_in(e, ring_size: int, ratio: int):
    xp = np if isinstance(e, np.ndarray) else jnp
    fits = (e >= INT32_MIN) & (e <= INT32_MAX)
    # (e - 2**30 does not wrap where it is used: e > INT32_MAX there.)
    big = _BIG_BASE + xp.mod(e - _BIG_BASE, ring_size)
    stand_in = xp.where(fits, e, xp.where(e < 0, INT32_MIN + ratio, big)).astype(xp.int32)
    return stand_in, fits, e - (ratio - 1)


_int64_stand_in_jit = jax.jit(_int64_stand_in, static_argnums=(1, 2))


def int64_end_positions(e, ring_size: int, ratio: int):
    """``end_positions``'s stand-in from int64 values (NumPy, or JAX with x64), any ring size:
    (e' int32, (fits, e - C + 1 int64)) for ``exact_first_positions``. The public call's path;
    NumPy on the host, JAX in one jitted step (an eager op chain cost 10x the call, session 32)."""
    if isinstance(e, np.ndarray):
        stand_in, fits, first = _int64_stand_in(e, ring_size, ratio)
    else:
        stand_in, fits, first = _int64_stand_in_jit(e, ring_size, ratio)
    return stand_in, (fits, first)


@jax.jit
def _put_back(first, fits, exact_first):
    # Where e is outside int32, a valid row got e' - C + 1 >= 2**30 - C + 1 (nonzero) and an
    # invalid one 0: the valid ones take the exact value, in the result's dtype (an int32
    # result keeps its low word, as an int64 kernel storing into int32 would).
    return jnp.where((~fits)[:, None] & (first != 0), exact_first.astype(first.dtype)[:, None], first)


def exact_first_positions(first, fits, exact_first):
    """The call's first positions [R, 3] (no rope cache: e' - C + 1) with the exact e - C + 1
    put back where e was outside int32 (``int64_end_positions``)."""
    if isinstance(exact_first, np.ndarray):
        # Narrowed on the host: JAX without x64 would not take int64 (the low word is kept).
        exact_first = exact_first.astype(np.dtype(first.dtype))
    return _put_back(first, fits, exact_first)


def compress_groups_with_ratio_int64_words(
    raw_keys, raw_position_words, compressor_state_cache, compressor_state_block_table,
    token_to_req, query_start_loc, logical_positions, compressed_slots, compress_ratio: int,
    rope_cache_words=None, *, int64_words=(True, True, True, True, True),
    implementation: str | None = None,
):
    """``compress_groups_with_ratio`` with int64 positions as int32 words.

    ``raw_position_words``: [R, 1, 6] int32, the words of the int64 [R, 1, 3] positions;
    ``rope_cache_words``: [B, S, 1, 6] int32 or None. ``int64_words`` flags which of block
    table, token_to_req, query_start_loc, logical_positions and compressed_slots arrive as
    words (last axis doubled); the others are int32 already.

    Returns ``(pooled [R, 1, Dk], first position words [R, 3, 2] int32)``: the result of the
    int64 operator, bit for bit, for any int64 value of every argument."""
    bt_w, ttr_w, qsl_w, lp_w, cs_w = int64_words
    ring_size = compressor_state_cache.shape[1]

    def narrow(x, is_words):
        return int32_from_int64_words(x) if is_words else x

    block_table = narrow(compressor_state_block_table, bt_w)
    token_to_req = narrow(token_to_req, ttr_w)
    query_start_loc = narrow(query_start_loc, qsl_w)
    compressed_slots = narrow(compressed_slots, cs_w)
    if lp_w:
        e, fits, exact_first = end_positions(logical_positions, ring_size, compress_ratio)
    else:
        e, fits, exact_first = logical_positions, None, None
    pos_lo, pos_hi = split_int64_words(raw_position_words)  # [R, 1, 3] each

    def run(positions, rope, implementation=implementation):
        return _api.compress_groups_with_ratio(
            raw_keys, positions, compressor_state_cache, block_table, token_to_req, query_start_loc, e,
            compressed_slots, compress_ratio, rope, implementation=implementation)

    if rope_cache_words is None:
        pooled, first = run(pos_lo, None)  # e' - C + 1 (int32), 0 where invalid
        first_words = int64_words_from_int32(first)
        if fits is not None:
            # Where e is outside int32, a valid row got e' - C + 1 >= 2**30 - C + 1 (nonzero)
            # and an invalid one 0: the valid ones take the exact int64 value.
            use_exact = (~fits)[:, None] & (first != 0)
            first_words = jnp.where(use_exact[..., None], exact_first[:, None, :], first_words)
        return pooled, first_words
    rope_lo, rope_hi = split_int64_words(rope_cache_words)
    # The high words' pass runs the XLA implementation, whose pooling (unused) XLA drops, so
    # the kernel pools once; every implementation selects the same words.
    pooled, first_lo = run(pos_lo, rope_lo)
    _, first_hi = run(pos_hi, rope_hi, "xla")
    return pooled, jnp.stack([first_lo, first_hi], -1)
