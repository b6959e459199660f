"""The one check every operator makes first (its array arguments are arrays), and the
index arrays' narrowing to int32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def require_arrays(**named) -> None:
    """``TypeError`` naming the first argument that is not an array (a JAX or NumPy array,
    a tracer or a ``jax.ShapeDtypeStruct``: anything with a shape and a dtype). Without it a
    list or a number fails later, deep in the shape checks, naming nothing."""
    for name, x in named.items():
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise TypeError(f"{name} must be an array (jax.Array or numpy.ndarray); got {type(x).__name__}")
        try:
            np.dtype(x.dtype)
        except TypeError:  # e.g. a torch tensor: its dtype is torch's own
            raise TypeError(f"{name} must be a JAX or NumPy array; got {type(x).__module__}.{type(x).__name__} "
                            f"of dtype {x.dtype} (torch tensors: use qsa_torch_shim, or jax.dlpack.from_dlpack)"
                            ) from None


_INT32 = np.iinfo(np.int32)


def index_int32(x):
    """An integer index array as int32, values outside int32's range saturated instead of
    wrapped, so an index out of range stays out of range (a slot of 2**32 + 5 must be
    skipped, not written to slot 5). vLLM passes int64; JAX with x64 off would wrap a NumPy
    int64 array on entry, so NumPy inputs are clipped on the host. int32 (and narrower)
    arrays and shape-only stand-ins pass unchanged."""
    dtype = np.dtype(x.dtype)
    if dtype == np.int32 or dtype.itemsize < 4 or isinstance(x, jax.ShapeDtypeStruct):
        return x
    low = _INT32.min if np.issubdtype(dtype, np.signedinteger) else 0
    if isinstance(x, np.ndarray):
        return np.clip(x, low, _INT32.max).astype(np.int32)
    return jnp.clip(x, low, _INT32.max).astype(jnp.int32)


# --- int64 as int32 words ------------------------------------------------------------------
# Without jax_enable_x64 JAX has no int64: a caller holding int64 metadata (vLLM's, handed
# over by qsa_torch_shim through DLPack) passes it as int32 word pairs, little-endian, the
# last axis doubled. These are the rules by which such words reach the operators.

def split_int64_words(words):
    """int32 words [..., 2n] of int64 values -> (lo, hi) [..., n]."""
    w = words.reshape(words.shape[:-1] + (words.shape[-1] // 2, 2))
    return w[..., 0], w[..., 1]


def int64_words_fit_int32(lo, hi):
    """Where the int64 value of (lo, hi) equals its sign-extended low word."""
    return hi == (lo >> 31)  # arithmetic shift


def int32_from_int64_words(words):
    """int64 values held as words [..., 2n] -> int32 [..., n], saturated as ``index_int32``
    saturates: exact inside int32, INT32_MIN / INT32_MAX outside it. The operators compare
    indices only against ranges inside int32, so a saturated index is out of range exactly
    when the int64 one is (a slot of 2**32 + 5 is skipped, not written to slot 5)."""
    lo, hi = split_int64_words(words)
    return jnp.where(int64_words_fit_int32(lo, hi), lo, jnp.where(hi < 0, _INT32.min, _INT32.max))


def int64_words_from_int32(values):
    """int32 values [...] -> int64 words [..., 2] (sign-extended)."""
    return jnp.stack([values, values >> 31], axis=-1)
