"""The jitted JAX calls behind the shim: argument plumbing only, the math is qsa_jax.

Each function is jitted once per static signature (shapes, dtypes, flags,
implementation); JAX's dispatch cache makes a repeated call cost one C++ cache
lookup. Functions whose first argument is donated write their result into
that buffer (XLA input/output aliasing): the shim donates the caller's
``out``/``cache`` memory, imported from torch, so the result lands in place.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

import qsa_jax
from qsa_torch_shim import _ffi_fence, _private_api

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


# --- int64 words -> int32, with explicit range rules ------------------------------------

def _split_words(w):
    """int32 words [..., 2n] of int64 values -> (lo, hi) [..., n] (little-endian)."""
    w = w.reshape(w.shape[:-1] + (w.shape[-1] // 2, 2))
    return w[..., 0], w[..., 1]


def _fits(lo, hi):
    return hi == (lo >> 31)  # arithmetic shift: the int64 equals sign-extended lo


def saturate(words):
    """int64 (as words) -> int32, out-of-range values clamped to INT32_MIN/MAX.

    Exact for every value in int32 range. Used for request ids, row offsets,
    block ids and slots: the operators only compare those against ranges that
    lie inside int32, and a clamped value falls outside those ranges exactly
    when the original value does.
    """
    lo, hi = _split_words(words)
    return jnp.where(_fits(lo, hi), lo, jnp.where(hi < 0, INT32_MIN, INT32_MAX))


def as_int32(x, is_words: bool):
    return saturate(x).reshape(x.shape[:-1] + (-1,)) if is_words else x


def _sign_extend(v):
    """int32 values -> int64 words [..., 2]."""
    return jnp.stack([v, v >> 31], axis=-1)


# --- torch -> XLA stream order --------------------------------------------------------------

def after_torch(ffi_fence: bool, args):
    """``(args, token)``: with ``ffi_fence``, every input passed through an
    optimization barrier behind the FFI wait (``_ffi_fence``), else ``(args, None)``.

    The barrier makes every use of an input (the kernels, and any copy or slice
    XLA adds) come after the wait in XLA's schedule, which is the order of
    XLA's stream. The wait's 4-byte token is returned by the jitted call and
    dropped by the caller: an output is never removed, so neither is the wait,
    and the call needs no side-effect flag (which would take jit's dispatch off
    its C++ fast path: 70 µs against 5 µs per call, measured on CPU).
    """
    if not ffi_fence:
        return args, None
    token = jax.ffi.ffi_call(_ffi_fence.TARGET, jax.ShapeDtypeStruct((), jnp.int32))()
    token, args = lax.optimization_barrier((token, args))
    return args, token


def signal_torch(ffi_signal: bool, result):
    """``result``, passed through the FFI signal when ``ffi_signal`` (mode "ffi-signal").

    The signal's handler makes torch's stream wait for XLA's at this point, after
    the kernel. Its output aliases its operand (no copy, same buffer), so it is the
    last producer of the call's result: nothing writes the result after it.
    """
    if not ffi_signal:
        return result
    return jax.ffi.ffi_call(_ffi_fence.SIGNAL_TARGET, jax.ShapeDtypeStruct(result.shape, result.dtype),
                            input_output_aliases={0: 0})(result)


# --- sparse attention -------------------------------------------------------------------------

_SCALES: dict[tuple, qsa_jax.KVScales] = {}


def scale_arrays(scales: tuple[float, float], like, head_dim: int) -> qsa_jax.KVScales:
    """(k_scale, v_scale) as a ``qsa_jax.KVScales`` on ``like``'s device, cached per value.

    Traced, not static: a model has a scale pair per layer, and static scales
    would compile one executable per layer and row count. Prepared on the host:
    the score multiplier D^-0.5 * k_scale is rounded from float64 as vLLM 0.34.0
    rounds it (traced fp32 scales would be an ulp off for some values at D = 128).
    Cached: a fresh operand per call would be a host-to-device copy per call.
    """
    key = (scales, head_dim, _private_api.jax_device(like))
    found = _SCALES.get(key)
    if found is None:
        if len(_SCALES) > 4096:  # bounded: scales are per layer, not per call
            _SCALES.clear()
        found = _SCALES[key] = jax.device_put(qsa_jax.kv_scales(*scales, head_dim=head_dim), key[2])
    return found


# The tiling table the shim's sparse attention uses (``qsa_torch_shim.set_tiling_table``):
# None = qsa_jax's default (a measured table for the card where one exists, else vLLM
# 0.34.0's; the triton-torch route runs bf16 on 0.30.0's, ``_direct.effective_table``), or
# "vllm-0.30" / "vllm-0.34" to reproduce that version's tiling (and so its rounding) on any
# GPU. A one-element list so the eager path reads it on every call.
TILING_TABLE: list = [None]


def _sparse(q, kv_arrays, logical_indices, block_table, token_to_req, output_gate, scales, *,
            use_prefill_config, implementation, table=None):
    kv = kv_arrays[0] if len(kv_arrays) == 1 else tuple(kv_arrays)
    # Scales only for fp8 caches: a bf16 call keeps vLLM 0.30.0's normalisation (acc / l;
    # 0.34.0 multiplies by 1 / l, at most an ulp apart -- inside the fidelity contract).
    return qsa_jax.sparse_attention(q, kv, logical_indices, block_table, token_to_req, output_gate,
                                    use_prefill_config=use_prefill_config, config=table,
                                    implementation=implementation, scales=scales)


_STATIC = ("use_prefill_config", "implementation", "table", "ffi_fence")


@functools.partial(jax.jit, static_argnames=_STATIC, keep_unused=True)
def sparse_new(fence, q, kv_arrays, logical_indices, block_table, token_to_req, output_gate,
               scales=None, *, use_prefill_config, implementation, table=None, ffi_fence=False):
    """Returns (result, FFI token or None).

    ``fence``: a fresh per-call import (or None on CPU, or with ``ffi_fence``) that
    orders this call after torch's pending writes (``_interop.stream_fence``);
    keep_unused keeps it a parameter."""
    del fence
    args, token = after_torch(ffi_fence, (q, kv_arrays, logical_indices, block_table,
                                          token_to_req, output_gate, scales))
    return _sparse(*args, use_prefill_config=use_prefill_config, implementation=implementation,
                   table=table), token


@functools.partial(jax.jit, static_argnames=_STATIC + ("ffi_signal",), donate_argnums=(0,),
                   keep_unused=True)
def sparse_into(out, q, kv_arrays, logical_indices, block_table, token_to_req, output_gate,
                scales=None, *, use_prefill_config, implementation, table=None, ffi_fence=False,
                ffi_signal=False):
    # ``out`` is only the destination: donated, and aliased to the result
    # (same shape and dtype), so XLA writes the result into its memory.
    # keep_unused: without it jit prunes the unused parameter, and with it the
    # donation (the result would land in a fresh buffer). With ``ffi_fence`` the
    # only write into it is the kernel's, which comes after the wait (qsa_jax's
    # forward kernels alias no output to an input, so there is no early init).
    del out
    args, token = after_torch(ffi_fence, (q, kv_arrays, logical_indices, block_table,
                                          token_to_req, output_gate, scales))
    return signal_torch(ffi_signal, _sparse(*args, use_prefill_config=use_prefill_config,
                                            implementation=implementation, table=table)), token


# --- store ------------------------------------------------------------------------------------

def _slots(slot_mapping, slots_are_words: bool):
    if not slots_are_words:
        return slot_mapping
    # A slot is valid iff 0 <= s < pages * P < 2**31: exactly the int64 values
    # whose high word is 0 and low word is non-negative. Everything else is
    # skipped, so it maps to -1.
    lo, hi = _split_words(slot_mapping)
    return jnp.where((hi == 0) & (lo >= 0), lo, -1)


@functools.partial(jax.jit, static_argnames=("slots_are_words", "implementation", "ffi_fence",
                                             "ffi_signal"), donate_argnums=(0,))
def store_into(cache, slot_mapping, rows, *, slots_are_words, implementation, ffi_fence=False,
               ffi_signal=False):
    """Returns (updated cache, FFI token or None). The cache passes the barrier too:
    it is read (the rows not stored keep their values), so any copy of it that XLA
    might make must also wait."""
    (cache, slot_mapping, rows), token = after_torch(ffi_fence, (cache, slot_mapping, rows))
    return signal_torch(ffi_signal, qsa_jax.store_cache_rows(
        cache, _slots(slot_mapping, slots_are_words), rows, implementation=implementation)), token


# --- compress ------------------------------------------------------------------------------------

def _ring_views(ring, ring_layout):
    """(keys [Bs,S,1,Dk], rope words [Bs,S,1,6] int32 or None) from the ring argument.

    ``ring_layout`` is None when ``ring`` is the keys themselves, or
    ``(head_dim, rope_offset)`` when ``ring`` is the packed storage rows
    ``[Bs, S, 1, width]`` holding the keys in ``[0, head_dim)`` and the three
    int64 rope positions at element ``rope_offset`` (vLLM's indexer ring).
    """
    if ring_layout is None:
        return ring, None
    head_dim, offset = ring_layout
    keys = ring[..., :head_dim]
    per_word = 4 // ring.dtype.itemsize
    tail = ring[..., offset:offset + 6 * per_word]
    if per_word == 1:
        words = lax.bitcast_convert_type(tail, jnp.int32)
    else:
        words = lax.bitcast_convert_type(tail.reshape(tail.shape[:-1] + (6, per_word)), jnp.int32)
    return keys, words


def _exact_end_positions(e, is_words: bool, ring_size: int, ratio: int):
    """int32 stand-in e' for the int64 end positions e, and the exact e - C + 1 words.

    The operator uses e only through e >= C-1 (validity), e mod S (ring slot)
    and differences that cancel e; its only e-valued output is e - C + 1
    (first positions without a rope cache). For e outside int32 the stand-in
    keeps validity and e mod S; the exact first position is rebuilt from the
    words afterwards.
    """
    if not is_words:
        return e, None
    lo, hi = _split_words(e)
    fits = _fits(lo, hi)
    # Large positive: 2**30 + ((e - 2**30) mod S), computed from the words.
    two32_mod = (2**32) % ring_size
    ulo = lax.bitcast_convert_type(lo, jnp.uint32)
    e_mod = ((hi.astype(jnp.uint32) % ring_size) * two32_mod + ulo % ring_size) % ring_size
    base = 2**30
    shift = (e_mod.astype(jnp.int32) - base % ring_size) % ring_size
    big = base + shift
    stand_in = jnp.where(fits, lo, jnp.where(hi < 0, INT32_MIN + ratio, big))
    # e - (C - 1) in words: subtract with borrow.
    c1 = ratio - 1
    new_ulo = ulo - jnp.uint32(c1)
    borrow = (ulo < jnp.uint32(c1)).astype(jnp.int32)
    first_words = jnp.stack([lax.bitcast_convert_type(new_ulo, jnp.int32), hi - borrow], -1)
    return stand_in, (fits, first_words)


@functools.partial(jax.jit, static_argnames=(
    "ring_layout", "rope_mode", "words", "compress_ratio", "implementation", "ffi_fence"),
    keep_unused=True)
def compress(fence, *arrays, ring_layout, rope_mode, words, compress_ratio, implementation,
             ffi_fence=False):
    """``_compress(*arrays)``, returned as (its result, FFI token or None)."""
    arrays, token = after_torch(ffi_fence, arrays)
    return _compress(*arrays, ring_layout=ring_layout, rope_mode=rope_mode, words=words,
                     compress_ratio=compress_ratio, implementation=implementation), token


def _compress(raw_keys, raw_positions, ring, rope, block_table, token_to_req, query_start_loc,
              logical_positions, compressed_slots, *, ring_layout, rope_mode, words,
              compress_ratio, implementation):
    """Returns (pooled [R,1,Dk], first position words [R,3,2] int32): the body of
    ``compress`` (whose ``fence`` is the per-call stream fence, see ``sparse_new``).

    ``raw_positions`` are int32 words [R,1,6] of the int64 positions; ``rope``
    the int32 words [Bs,S,1,6] of the rope ring, or None. ``rope_mode``:
    "none", "separate" (``rope`` given) or "packed" (in ``ring``).
    ``words`` flags which of block_table, token_to_req, query_start_loc,
    logical_positions, compressed_slots arrive as int64 words.
    """
    keys, packed_rope = _ring_views(ring, ring_layout)
    if rope_mode == "packed":
        rope = packed_rope
    bt_w, ttr_w, qsl_w, lp_w, cs_w = words
    block_table = as_int32(block_table, bt_w)
    token_to_req = as_int32(token_to_req, ttr_w)
    query_start_loc = as_int32(query_start_loc, qsl_w)
    compressed_slots = as_int32(compressed_slots, cs_w)
    ring_size = keys.shape[1]
    e, exact = _exact_end_positions(logical_positions, lp_w, ring_size, compress_ratio)

    pos_lo, pos_hi = _split_words(raw_positions)  # [R, 1, 3] each

    def run(positions, rope_part, implementation=implementation):
        return qsa_jax.compress_groups_with_ratio(
            raw_keys, positions, keys, block_table, token_to_req, query_start_loc, e,
            compressed_slots, compress_ratio, rope_part, implementation=implementation)

    if rope_mode == "none":
        pooled, first = run(pos_lo, None)  # e' - C + 1 (int32), 0 when invalid
        first_words = _sign_extend(first)
        if exact is not None:
            fits, exact_first = exact
            # Rows whose e is outside int32: valid ones got e' - C + 1 >= 2**30 - C + 1
            # (nonzero), invalid ones 0. Rebuild the exact int64 value for the valid ones.
            use_exact = (~fits)[:, None] & (first != 0)
            first_words = jnp.where(use_exact[..., None], exact_first[:, None, :], first_words)
        return pooled, first_words
    rope_lo, rope_hi = _split_words(rope)
    # First positions are a selection (a gather or 0): low and high words
    # are selected independently and exactly. The high words' pass runs the XLA
    # implementation, whose pooling (unused here) XLA drops, so the kernel pools once
    # (a kernel's pass would pool again; every implementation selects the same words).
    pooled, first_lo = run(pos_lo, rope_lo)
    _, first_hi = run(pos_hi, rope_hi, "xla")
    return pooled, jnp.stack([first_lo, first_hi], -1)
