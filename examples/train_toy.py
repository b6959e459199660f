"""Train a toy model through ``qsa_jax.sparse_attention`` (gradients: issue 16).

    python examples/train_toy.py [--steps 300] [--implementation xla|pallas] [--mesh 2x2 [--shard-map]]

Task: sequences of random tokens; at position t predict the token at t - LAG. Each
position selects the WINDOW most recent tokens (itself included) through
``logical_indices``, in a shuffled order, so the one layer of gated sparse attention
must learn, from learned position embeddings, which selected entry to read. A batch is
laid out as vLLM lays out a step: the sequences' positions are the rows (one request per
sequence), and their keys and values are written into one paged fused cache [pages, Hk,
page, 2D] whose block table maps each request's pages to shuffled physical pages, so
gradients reach q, the K/V cache and the gate.

``--mesh DxM`` trains on a mesh of D x M devices: rows (data parallelism) over D, query
heads and the cache's KV heads (tensor parallelism) over M. Without GPUs, force host devices:
``XLA_FLAGS=--xla_force_host_platform_device_count=4 python examples/train_toy.py --mesh 2x2``.
The attention and its backward then run per shard; the cache is built whole on every device
from the rows' keys and values (XLA gathers them), and its cotangent is summed over the row
shards by one all-reduce inside the backward. With ``--shard-map`` the attention runs inside
the model's own ``jax.shard_map`` over the same mesh instead (local arrays, JAX's default
``check_vma=True``): the same per-shard calls, the cache (replicated over "data") getting the
row shards' cotangents summed in fp32 the same way.

The loss starts at log(VOCAB) = 2.77 and falls towards 0 within a few hundred
Adam steps (CPU: seconds).
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

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
    padded, count last) and its block table row [SEQ // PAGE] of shuffled pages."""
    idx = np.full((batch, SEQ, WINDOW + 1), -1, np.int32)
    for t in range(SEQ):
        toks = np.arange(max(0, t - WINDOW + 1), t + 1)
        for b in range(batch):
            idx[b, t, :len(toks)] = rng.permutation(toks)
        idx[:, t, WINDOW] = len(toks)
    tables = np.stack([rng.permutation(SEQ // PAGE) for _ in range(batch)]).astype(np.int32)
    return idx, tables


def logits(params, tokens, indices, tables, implementation, mesh=None, shard_map=False):
    """[B, SEQ, VOCAB] for B sequences: rows = B * SEQ positions, request b = sequence b."""
    batch = tokens.shape[0]
    rows, pages = batch * SEQ, SEQ // PAGE
    x = (params["tok"][tokens] + params["pos"]).reshape(rows, MODEL)
    q = (x @ params["wq"]).reshape(rows, HEADS, HEAD_DIM)
    kv = jnp.concatenate([(x @ params["wk"]).reshape(rows, KV_HEADS, HEAD_DIM),
                          (x @ params["wv"]).reshape(rows, KV_HEADS, HEAD_DIM)], axis=-1)
    gate = (x @ params["wg"]).reshape(rows, HEADS, HEAD_DIM)
    # Token t of sequence b is slot t % PAGE of its logical page t // PAGE, which the block
    # table maps to a physical page of one shared pool: scatter the rows there.
    table = tables + pages * jnp.arange(batch, dtype=jnp.int32)[:, None]  # [B, pages]
    rows_by_page = kv.reshape(batch * pages, PAGE, KV_HEADS, 2 * HEAD_DIM)
    cache = jnp.zeros_like(rows_by_page).at[table.reshape(-1)].set(rows_by_page).transpose(0, 2, 1, 3)
    token_to_req = jnp.repeat(jnp.arange(batch, dtype=jnp.int32), SEQ)
    bf = lambda a: a.astype(jnp.bfloat16)  # noqa: E731 -- the operator takes bf16
    q, cache, gate = bf(q), bf(cache), bf(gate)
    li = indices.reshape(rows, WINDOW + 1)
    if mesh is not None:
        model = mesh.shape["model"]
        if model > KV_HEADS:  # each head shard holds a copy of the KV head its query heads read
            cache = qsa_jax.repeat_kv_heads(cache, model // KV_HEADS)
        on = lambda a, *spec: jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P(*spec)))  # noqa: E731
        q, gate = on(q, "data", "model"), on(gate, "data", "model")
        cache, li, token_to_req = on(cache, None, "model"), on(li, "data"), on(token_to_req, "data")
        table = on(table)
    attention = functools.partial(qsa_jax.sparse_attention, implementation=implementation)
    if shard_map:  # the same layout, written as the model's own shard_map
        rows_heads = P("data", "model")
        attention = jax.shard_map(attention, mesh=mesh, out_specs=rows_heads, in_specs=(
            rows_heads, P(None, "model"), P("data"), P(), P("data"), rows_heads))
    out = attention(q, cache, li, table, token_to_req, gate)
    return (out.astype(jnp.float32).reshape(rows, HEADS * HEAD_DIM) @ params["wo"]).reshape(batch, SEQ, VOCAB)


def loss_fn(params, tokens, indices, tables, implementation, mesh=None, shard_map=False):
    targets = tokens[:, :-LAG]
    logp = jax.nn.log_softmax(logits(params, tokens, indices, tables, implementation, mesh, shard_map)[:, LAG:],
                              axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def train(steps: int = 300, *, batch: int = 8, lr: float = 1e-2, seed: int = 0,
          implementation: str | None = None, mesh=None, shard_map: bool = False) -> list[float]:
    """Adam on fresh batches; returns the loss of every step. ``mesh``: a Mesh with axes
    ("data", "model"), or None (one device); ``shard_map``: the attention inside a shard_map."""
    rng = np.random.default_rng(seed)
    params = init_params(jax.random.key(seed))
    moments = jax.tree.map(lambda p: (jnp.zeros_like(p), jnp.zeros_like(p)), params)

    @jax.jit
    def step(params, moments, count, tokens, indices, tables):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, indices, tables, implementation, mesh, shard_map)
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
    ap.add_argument("--mesh", default=None, help="DxM: rows over D devices, heads over M (M <= HEADS)")
    ap.add_argument("--shard-map", action="store_true", help="with --mesh: the attention inside a jax.shard_map")
    a = ap.parse_args()
    if a.shard_map and not a.mesh:
        ap.error("--shard-map needs --mesh")
    mesh = None
    if a.mesh:
        d, m = (int(x) for x in a.mesh.split("x"))
        if d * m > jax.device_count():
            ap.error(f"--mesh {a.mesh} needs {d * m} devices; {jax.device_count()} here (without GPUs: "
                     f"XLA_FLAGS=--xla_force_host_platform_device_count={d * m})")
        mesh = Mesh(np.array(jax.devices()[:d * m]).reshape(d, m), ("data", "model"))
    t0 = time.perf_counter()
    losses = train(a.steps, implementation=a.implementation, mesh=mesh, shard_map=a.shard_map)
    for i in range(0, a.steps, max(1, a.steps // 10)):
        print(f"step {i:4d}  loss {np.mean(losses[i:i + 10]):.3f}")
    where = (f"a {a.mesh} mesh of {jax.default_backend()} devices" + (" (shard_map)" if a.shard_map else "")
             if mesh else jax.default_backend())
    print(f"final loss {np.mean(losses[-10:]):.3f} (start {losses[0]:.3f}); "
          f"{time.perf_counter() - t0:.1f} s on {where}")


if __name__ == "__main__":
    main()
