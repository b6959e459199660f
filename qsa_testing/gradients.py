"""The gradient contract's reference (tests and mesh checks): float64 gradients of the exact
function (``backward.exact_forward``), and the CPU bars over the bf16 floor.

Bars: err(impl) <= factor x err(floor), the floor being the float64 gradient rounded once to
bf16; relative Frobenius errors, per cotangent. Measured on CPU (two seeds, both configs of
tests/test_backward.py): xla dq 1.05-1.09x, dkv 1.01-1.03x; pallas (interpret mode: bf16 dot
operands emulated exactly) dq 1.79-1.90x, dkv 1.74-1.83x -- its dots round dA, p and dS to
bf16 like flash attention; dgate 1.40-1.92x for both (more cases), because it is formed from
the forward's attention (the residual), which carries the forward's own error (~1.5x the
floor: bf16 probabilities in P.V, docs/spec.md §6) plus its bf16 rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

BF16_BAR = {"xla": {"q": 1.15, "kv": 1.15, "gate": 2.3},
            "pallas": {"q": 2.1, "kv": 2.1, "gate": 2.3}}


def float64_gradients(problem, q, kv_arrays, logical_indices, block_table, token_to_req, output_gate, ct,
                      argnums=(0, 1, 2)):
    """NumPy float64 cotangents of sum(exact output * ct) with respect to (q, kv_arrays,
    output_gate)[argnums] (``kv_arrays`` a tuple: its cotangent is a tuple)."""
    from qsa_jax.ops.sparse_attention import backward as B

    meta = tuple(jnp.asarray(x) for x in (logical_indices, block_table, token_to_req))
    with jax.enable_x64(True):
        f64 = lambda x: jnp.asarray(np.asarray(x, np.float64))  # noqa: E731
        c = f64(ct)

        def loss(q, kv_arrays, gate):
            return jnp.sum(B.exact_forward(problem, q, kv_arrays, *meta, gate)[0] * c)

        grads = jax.grad(loss, argnums)(f64(q), tuple(f64(x) for x in kv_arrays), f64(output_gate))
        return jax.tree.map(np.asarray, grads)


def relative_error(x, ref) -> float:
    """||x - ref|| / ||ref|| in float64 (x any float array, ref float64)."""
    x = np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def error_over_floor(x, ref) -> float:
    """err(x) / err(bf16 floor) against the float64 ``ref``."""
    return relative_error(x, ref) / relative_error(jnp.asarray(ref, jnp.bfloat16), ref)


# vLLM 0.34's arithmetic (k/v scales and an e4m3 cache; tests/test_backward_scaled.py).
# Measured on CPU (three seeds x fused/split x inverted/selection walk, scales 0.5 / 2.0):
# dq xla 1.08-1.35x, pallas 1.24-2.18x the bf16 floor (the fp8 forward's fp16 P.V and its
# residual attention feed dS); dgate 1.11-1.55x; an e4m3 cache's cotangent 1.000-1.018x the
# e4m3 floor (rounding to e4m3 dominates); the scales' cotangents 0.01-0.57x the floor of a
# sum of once-rounded terms (``scale_error_over_floor``).
SCALED_BF16_BAR = {"xla": {"q": 1.6, "gate": 2.3, "scales": 1.0},
                   "pallas": {"q": 2.6, "gate": 2.3, "scales": 1.0}}
E4M3_KV_BAR = 1.05
# bf16's unit roundoff: the floor of a sum is this times the sum of its terms' magnitudes.
BF16_UNIT = 2.0 ** -9


def scale_error_over_floor(mine: float, exact: float, terms: float) -> float:
    """|mine - exact| over the error bound of a sum whose terms are each rounded to bf16
    once, u * sum |term| (a scale's cotangent is a sum over rows and heads, with heavy
    cancellation: relative to its own value the error says little)."""
    return abs(mine - exact) / (BF16_UNIT * terms)
