"""Train a toy model through ``qsa_jax.sparse_attention`` (gradients: issue 16).

    python examples/train_toy.py [--steps 300] [--implementation xla|pallas]

Task: sequences of random tokens; at position t predict the token at t - LAG. Each
position selects the WINDOW most recent tokens (itself included) through
``logical_indices``, in a shuffled order, so the one layer of gated sparse attention
must learn, from learned position embeddings, which selected entry to read. The
keys and values are written into a paged fused cache [pages, Hk, page, 2D] (one
request per sequence, pages in a shuffled order in the block table), so gradients
reach q, the K/V cache and the gate. A batch of sequences is ``jax.vmap``-ed.

The loss starts at log(VOCAB) = 2.77 and falls towards 0 within a few hundred
Adam steps (CPU: seconds).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import qsa_jax

VOCAB, SEQ, WINDOW, LAG = 16, 64, 8, 3
MODEL, HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 2, 1, 16, 16


def init_params(key):
    ks = jax.random.split(key, 7)
    n = lambda k, shape, s=0.3: s * jax.random.normal(k, shape, jnp.float32)  # noqa: E731
    return {"tok": n(ks[0], (VOCAB, MODEL)), "pos": n(ks[1], (SEQ, MODEL)),
            "wq": n(ks[2], (MODEL, HEADS * HEAD_DIM)), "wk": n(ks[3], (MODEL, KV_HEADS * HEAD_DIM)),
            "wv": n(ks[4], (MODEL, KV_HEADS * HEAD_DIM)), "wg": n(ks[5], (MODEL, HEADS * HEAD_DIM)),
            "wo": n(ks[6], (HEADS * HEAD_DIM, VOCAB))}


def selections(rng: np.random.Generator, batch: int):
    """Per sequence: logical_indices [SEQ, WINDOW + 1] (shuffled causal window, -1
    padded, count last) and a block table [1, SEQ // PAGE] of shuffled pages."""
    idx = np.full((batch, SEQ, WINDOW + 1), -1, np.int32)
    for t in range(SEQ):
        toks = np.arange(max(0, t - WINDOW + 1), t + 1)
        for b in range(batch):
            idx[b, t, :len(toks)] = rng.permutation(toks)
        idx[:, t, WINDOW] = len(toks)
    tables = np.stack([rng.permutation(SEQ // PAGE)[None, :] for _ in range(batch)]).astype(np.int32)
    return idx, tables


def logits_one(params, tokens, indices, table, implementation):
    x = params["tok"][tokens] + params["pos"]  # [SEQ, MODEL]
    q = (x @ params["wq"]).reshape(SEQ, HEADS, HEAD_DIM)
    k = (x @ params["wk"]).reshape(SEQ, KV_HEADS, HEAD_DIM)
    v = (x @ params["wv"]).reshape(SEQ, KV_HEADS, HEAD_DIM)
    gate = (x @ params["wg"]).reshape(SEQ, HEADS, HEAD_DIM)
    # Token t of the request is slot t % PAGE of logical page t // PAGE, which the
    # block table maps to a physical page: scatter the rows there.
    rows = jnp.concatenate([k, v], axis=-1).reshape(SEQ // PAGE, PAGE, KV_HEADS, 2 * HEAD_DIM)
    cache = jnp.zeros_like(rows).at[table[0]].set(rows).transpose(0, 2, 1, 3)
    bf = lambda a: a.astype(jnp.bfloat16)  # noqa: E731 -- the operator takes bf16
    out = qsa_jax.sparse_attention(bf(q), bf(cache), indices, table, jnp.zeros(SEQ, jnp.int32),
                                   bf(gate), implementation=implementation)
    return out.astype(jnp.float32).reshape(SEQ, HEADS * HEAD_DIM) @ params["wo"]


def loss_fn(params, tokens, indices, tables, implementation):
    logits = jax.vmap(logits_one, in_axes=(None, 0, 0, 0, None))(
        params, tokens, indices, tables, implementation)
    targets = tokens[:, :-LAG]
    logp = jax.nn.log_softmax(logits[:, LAG:], axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def train(steps: int = 300, *, batch: int = 8, lr: float = 1e-2, seed: int = 0,
          implementation: str | None = None) -> list[float]:
    """Adam on fresh batches; returns the loss of every step."""
    rng = np.random.default_rng(seed)
    params = init_params(jax.random.key(seed))
    moments = jax.tree.map(lambda p: (jnp.zeros_like(p), jnp.zeros_like(p)), params)

    @jax.jit
    def step(params, moments, count, tokens, indices, tables):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, indices, tables, implementation)
        b1, b2 = 0.9, 0.999

        def update(p, g, m):
            mu, nu = b1 * m[0] + (1 - b1) * g, b2 * m[1] + (1 - b2) * g * g
            step_size = lr * jnp.sqrt(1 - b2 ** count) / (1 - b1 ** count)
            return p - step_size * mu / (jnp.sqrt(nu) + 1e-8), (mu, nu)

        both = jax.tree.map(update, params, grads, moments, is_leaf=lambda x: isinstance(x, tuple))
        new_params = jax.tree.map(lambda pm: pm[0], both, is_leaf=lambda x: isinstance(x, tuple))
        new_moments = jax.tree.map(lambda pm: pm[1], both, is_leaf=lambda x: isinstance(x, tuple))
        return new_params, new_moments, loss

    losses = []
    for i in range(steps):
        tokens = rng.integers(0, VOCAB, (batch, SEQ)).astype(np.int32)
        indices, tables = selections(rng, batch)
        params, moments, loss = step(params, moments, jnp.float32(i + 1), tokens, indices, tables)
        losses.append(float(loss))
    return losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--implementation", default=None)
    a = ap.parse_args()
    t0 = time.perf_counter()
    losses = train(a.steps, implementation=a.implementation)
    for i in range(0, a.steps, max(1, a.steps // 10)):
        print(f"step {i:4d}  loss {np.mean(losses[i:i + 10]):.3f}")
    print(f"final loss {np.mean(losses[-10:]):.3f} (start {losses[0]:.3f}); "
          f"{time.perf_counter() - t0:.1f} s on {jax.default_backend()}")


if __name__ == "__main__":
    main()
