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
from qsa_jax.ops._arrays import int32_from_int64_words
from qsa_jax.ops.compress_groups.int64_words import compress_groups_with_ratio_int64_words
from qsa_torch_shim import _ffi_fence, _private_api


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

@functools.partial(jax.jit, static_argnames=("slots_are_words", "implementation", "ffi_fence",
                                             "ffi_signal"), donate_argnums=(0,))
def store_into(cache, slot_mapping, rows, *, slots_are_words, implementation, ffi_fence=False,
               ffi_signal=False):
    """Returns (updated cache, FFI token or None). The cache passes the barrier too:
    it is read (the rows not stored keep their values), so any copy of it that XLA
    might make must also wait."""
    (cache, slot_mapping, rows), token = after_torch(ffi_fence, (cache, slot_mapping, rows))
    return signal_torch(ffi_signal, qsa_jax.store_cache_rows(
        cache, int32_from_int64_words(slot_mapping) if slots_are_words else slot_mapping, rows,
        implementation=implementation)), token


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
    logical_positions, compressed_slots arrive as int64 words. The int64 rules are
    qsa_jax's (``compress_groups.int64_words``); here only the ring's views.
    """
    keys, packed_rope = _ring_views(ring, ring_layout)
    rope = {"none": None, "separate": rope, "packed": packed_rope}[rope_mode]
    return compress_groups_with_ratio_int64_words(
        raw_keys, raw_positions, keys, block_table, token_to_req, query_start_loc, logical_positions,
        compressed_slots, compress_ratio, rope, int64_words=words, implementation=implementation)
