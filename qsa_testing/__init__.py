"""Test-only helpers for qsa-jax: an independent float64 NumPy oracle of the QSA operators."""
