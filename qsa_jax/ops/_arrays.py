"""The one check every operator makes first: its array arguments are arrays."""

from __future__ import annotations


def require_arrays(**named) -> None:
    """``TypeError`` naming the first argument that is not an array (a JAX or NumPy array,
    a tracer or a ``jax.ShapeDtypeStruct``: anything with a shape and a dtype). Without it a
    list or a number fails later, deep in the shape checks, naming nothing."""
    for name, x in named.items():
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise TypeError(f"{name} must be an array (jax.Array or numpy.ndarray); got {type(x).__name__}")
