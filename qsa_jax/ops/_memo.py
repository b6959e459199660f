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
        np.dtype(x.dtype)  # a torch tensor's dtype is not one: TypeError, and the check itself says so
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


def _typed(value):
    """A static argument with its type: 4 and 4.0 compare (and hash) equal, but a check may
    accept one and refuse the other, so they must not share a memo entry. Sequences (tuples,
    named tuples, lists) are typed element by element and rebuilt by ``_untyped``."""
    if isinstance(value, (tuple, list)):
        return ("seq", type(value)) + tuple(_typed(v) for v in value)
    return (type(value), value)


def _untyped(typed):
    if typed[0] != "seq":
        return typed[1]
    cls, values = typed[1], [_untyped(v) for v in typed[2:]]
    return cls(*values) if hasattr(cls, "_fields") else cls(values)  # a named tuple takes fields


def memoised(check):
    """Wrap ``check(*arrays, **static)`` so it runs once per (array specs, static args)."""

    @functools.lru_cache(maxsize=4096)
    def cached(specs, static):
        return check(*(stand_in(s) for s in specs), **{k: _untyped(v) for k, v in static})

    def call(*arrays, **static):
        try:
            specs = tuple(spec(a) for a in arrays)
            key_static = tuple(sorted((k, _typed(v)) for k, v in static.items()))
            hash(key_static)
        except (AttributeError, TypeError):  # not array-like / unhashable: check directly
            return check(*arrays, **static)
        return cached(specs, key_static)

    call.cache_clear = cached.cache_clear
    return call
