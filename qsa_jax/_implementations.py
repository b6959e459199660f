"""Choosing an implementation (tokamax style).

Every operator offers up to three implementations of the same function:
``"pallas"`` (Pallas kernels; Triton lowering on GPU, the interpreter on CPU),
``"triton"`` (the project's Triton kernels through jax-triton) and ``"xla"``
(plain jnp/lax, runs anywhere). ``implementation=None`` takes the first one
that can run here, in ``DEFAULT_ORDER`` unless the operator's config prefers
another order for the problem (``config.sparse_attention_order``: an fp8 cache on
Hopper); naming one that cannot run raises ``NotImplementedError`` saying why.
"""

from __future__ import annotations

import jax

IMPLEMENTATIONS = ("pallas", "triton", "xla")
# On the GPU, Pallas first: on an H200 it matched or beat the jax-triton route at every
# measured bf16 shape except the one-warp prefill tiling (notes/, bench/results/), and its
# kernels are XLA-native, so they cost less launch time between calls. An fp8 cache on a
# Hopper where the measured table's entry names "triton" (5-24 programs and the one-warp
# entries from 25 programs up), or on 0.34.0's table there, prefers jax-triton
# (config.sparse_attention_order).
# The interpreter is far too slow to be a default: on CPU, None means "xla".
DEFAULT_ORDER = {"gpu": ("pallas", "triton", "xla"), "cpu": ("xla",)}


def backend() -> str:
    """'gpu' when JAX's default backend is a CUDA GPU, else 'cpu'."""
    return "gpu" if jax.default_backend() in ("gpu", "cuda") else "cpu"


class Registry:
    """The implementations of one operator, imported lazily by module name.

    Each implementation module ``qsa_jax.ops.<op>.<name>`` defines
    ``run(problem, *arrays)`` (traceable under jit) and ``why_not() -> str | None``
    (None when it can run on this machine). A module that does not exist yet,
    or fails to import (e.g. jax-triton missing), is reported as unavailable.
    """

    def __init__(self, op: str, package: str):
        self.op = op
        self.package = package
        self._modules: dict[str, object] = {}

    def module(self, name: str):
        if name not in self._modules:
            import importlib

            try:
                self._modules[name] = importlib.import_module(f"{self.package}.{name}")
            except ImportError as exc:
                self._modules[name] = exc
        return self._modules[name]

    def why_not(self, name: str) -> str | None:
        mod = self.module(name)
        if isinstance(mod, ImportError):
            return f"{self.package}.{name} is not importable ({mod})"
        return mod.why_not()

    def run(self, name: str):
        mod = self.module(name)
        if isinstance(mod, ImportError):
            raise NotImplementedError(f"{self.op}: implementation {name!r} cannot run here: {self.why_not(name)}")
        return mod.run

    def choose(self, requested: str | None, order: tuple[str, ...] | None = None) -> str:
        """Name of the implementation to run (see the module docstring); ``order``
        replaces ``DEFAULT_ORDER`` for ``requested=None`` (a per-problem preference)."""
        if requested is not None:
            if requested not in IMPLEMENTATIONS:
                raise ValueError(
                    f"{self.op}: implementation must be one of {IMPLEMENTATIONS} or None; got {requested!r}")
            reason = self.why_not(requested)
            if reason is not None:
                raise NotImplementedError(f"{self.op}: implementation {requested!r} cannot run here: {reason}")
            return requested
        for name in DEFAULT_ORDER[backend()] if order is None else order:
            if self.why_not(name) is None:
                return name
        raise NotImplementedError(f"{self.op}: no implementation can run on backend {jax.default_backend()!r}")

    def available(self) -> tuple[str, ...]:
        return tuple(name for name in IMPLEMENTATIONS if self.why_not(name) is None)


REGISTRIES = {
    "sparse_attention": Registry("sparse_attention", "qsa_jax.ops.sparse_attention"),
    "compress_groups_with_ratio": Registry("compress_groups_with_ratio", "qsa_jax.ops.compress_groups"),
    "store_cache_rows": Registry("store_cache_rows", "qsa_jax.ops.store_cache_rows"),
}


def available_implementations(op: str) -> tuple[str, ...]:
    """Implementations of ``op`` ("sparse_attention", "compress_groups_with_ratio",
    "store_cache_rows") that can run here."""
    if op not in REGISTRIES:
        raise ValueError(f"op must be one of {tuple(REGISTRIES)}; got {op!r}")
    return REGISTRIES[op].available()
