"""Sparse paged attention (QSA ``qsa_sparse_paged_attention``).

``api.py`` is the entry point, ``base.py`` the checks and cache addressing,
``xla.py`` the plain-XLA reference; kernels sit beside them.
"""

from qsa_jax.ops.sparse_attention.api import sparse_attention
from qsa_jax.ops.sparse_attention.base import KVScales, StridedQuery, kv_scales

__all__ = ["KVScales", "StridedQuery", "kv_scales", "sparse_attention"]
