"""Argument checks run once per call signature, not once per call.

The checks depend only on static metadata (shapes, dtypes, flags), so the
public functions memoise their result — the static problem description and
the chosen implementation — keyed on that metadata. A repeated eager call
then costs a dictionary lookup instead of the checks (tens of µs of Python).
Failures are not memoised: bad arguments raise on every call.
"""

from __future__ import annotations

import functools

import jax
import numpy as np


def spec(x):
    """Static metadata of an array-like (NumPy, JAX, tracer, ShapeDtypeStruct); None stays None."""
    if x is None:
        return None
    if isinstance(x, (tuple, list)):
        return ("seq",) + tuple(spec(a) for a in x)
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        if not isinstance(x.dtype, np.dtype):  # e.g. a torch tensor: the check itself names it
            raise TypeError(f"{type(x).__name__} has no NumPy dtype")
        return (tuple(x.shape), x.dtype)
    # A registered pytree (e.g. ``StridedQuery``): its static fields live in the
    # treedef, which is hashable; its arrays are described like any array.
    leaves, treedef = jax.tree_util.tree_flatten(x)
    if treedef.num_leaves == 1 and leaves[0] is x:  # a leaf that is no array (an int, a str)
        raise TypeError(f"{type(x).__name__} is not array-like")
    return ("tree", treedef) + tuple(spec(a) for a in leaves)


def stand_in(s):
    """An object with the same static metadata as the one ``s`` was taken from."""
    if s is None:
        return None
    if s[0] == "seq":
        return tuple(stand_in(a) for a in s[1:])
    if s[0] == "tree":
        return s[1].unflatten([stand_in(a) for a in s[2:]])
    return jax.ShapeDtypeStruct(*s)


def _type_signature(values) -> tuple:
    """The types of static arguments: 4, 4.0 and True compare (and hash) equal, but a check
    may accept one and refuse another, so they must not share a memo entry. Keyed beside the
    values it keeps them apart; a tuple's elements are typed one level deep (the operators'
    static arguments are flat)."""
    return tuple([(type(v),) + tuple(map(type, v)) if isinstance(v, tuple) else type(v) for v in values])


def memoised(check):
    """Wrap ``check(*arrays, **static)`` so it runs once per (array specs, static args)."""

    @functools.lru_cache(maxsize=4096)
    def cached(specs, static, _types):
        return check(*(stand_in(s) for s in specs), **dict(static))

    def call(*arrays, **static):
        try:
            specs = tuple(spec(a) for a in arrays)
            # In call order: each operator calls its memo with one order (another is a miss).
            key_static = tuple(static.items())
            hash(key_static)
        except (AttributeError, TypeError):  # not array-like / unhashable: check directly
            return check(*arrays, **static)
        return cached(specs, key_static, _type_signature(static.values()))

    call.cache_clear = cached.cache_clear
    return call
