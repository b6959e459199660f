"""Paged cache row stores (QSA ``qsa_store_cache_rows``)."""

from qsa_jax.ops.store_cache_rows.api import store_cache_rows

__all__ = ["store_cache_rows"]
