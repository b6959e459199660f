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
