"""Indexer key compression (QSA ``qsa_compress_groups_with_ratio``)."""

from qsa_jax.ops.compress_groups.api import compress_groups_with_ratio

__all__ = ["compress_groups_with_ratio"]
