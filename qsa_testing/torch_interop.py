"""Moving test data between NumPy, torch (the originals) and JAX."""

from __future__ import annotations

import numpy as np

from qsa_testing import cases as C


def to_torch(x: np.ndarray, device="cuda"):
    import torch

    if x.dtype == C.BF16:
        src = torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)
    elif x.dtype == C.E4M3:  # NumPy has no fp8: carry the bytes
        src = torch.from_numpy(np.ascontiguousarray(x).view(np.uint8)).view(torch.float8_e4m3fn)
    else:
        src = torch.from_numpy(np.ascontiguousarray(x))
    # A fresh tensor has canonical strides even when empty (the originals
    # assert unit inner strides, which a 0-row NumPy view need not have).
    return torch.empty(src.shape, dtype=src.dtype, device=device).copy_(src)


def to_numpy(t) -> np.ndarray:
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(C.BF16)
    return t.numpy()


def torch_to_jax(t):
    """Zero-copy import of a compact CUDA tensor into JAX."""
    import jax

    return jax.dlpack.from_dlpack(t)


def kv_views(kv_cache, head_dim: int):
    """vLLM's K/V: strided views of the fused [NB, Hk, P, 2D] buffer."""
    return kv_cache.transpose(1, 2).split(head_dim, dim=-1)


def random_kv_pool(geometry, num_pages: int, seed: int, device="cuda"):
    """A fused ``[NB, Hk, P, 2D]`` bf16 page pool of normal values, drawn on ``device``."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (num_pages, geometry.num_kv_heads, geometry.page_size, 2 * geometry.head_dim)
    return torch.randn(shape, device=device, dtype=torch.bfloat16, generator=gen)
