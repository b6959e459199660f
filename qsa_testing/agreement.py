"""The agreement bar against the originals (docs/spec.md §6.2)."""

from __future__ import annotations

import numpy as np

REL_FROBENIUS_BAR = 1e-3


def rel_frobenius(actual, expected) -> float:
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    denom = np.linalg.norm(e)
    diff = np.linalg.norm(a - e)
    if denom == 0:
        return 0.0 if diff == 0 else float("inf")
    return float(diff / denom)


def assert_agrees(actual, expected, *, what: str = "output", bar: float = REL_FROBENIUS_BAR):
    """No NaN, exact zeros where the reference is zero, relative Frobenius error <= bar."""
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    assert not np.isnan(a).any(), f"{what}: {int(np.isnan(a).sum())} NaN values"
    zero = e == 0
    bad_zero = zero & (a != 0)
    assert not bad_zero.any(), (
        f"{what}: {int(bad_zero.sum())} elements are nonzero where the reference is exactly 0 "
        f"(first at {np.argwhere(bad_zero)[0].tolist()})")
    err = rel_frobenius(a, e)
    assert err <= bar, f"{what}: relative Frobenius error {err:.3g} > {bar:g}"
    return err
