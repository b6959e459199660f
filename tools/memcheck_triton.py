"""Run the compiled Triton kernels on adversarial metadata, for compute-sanitizer.

    source tools/gpu_env.sh
    compute-sanitizer --tool memcheck python3 tools/memcheck_triton.py

Every kernel of implementation="triton" runs once on metadata that points
everywhere it must not be followed: token indices past the block table,
physical pages past the pool and -1, request ids -1 and >= NR, counts far
above W and negative, slots past the cache and negative, ring blocks out of
range. The caches are sized exactly (no slack), so any unmasked access past a
buffer shows up as an invalid global read/write. Outputs are checked against
the XLA reference as well (NaN in every cache row must not leak).
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402


def main() -> int:
    import jax.numpy as jnp

    import qsa_jax
    from qsa_testing import cases as C
    from qsa_testing.agreement import assert_agrees

    reason = qsa_jax._implementations.REGISTRIES["sparse_attention"].why_not("triton")
    if reason:
        print(f"triton implementation unavailable: {reason}")
        return 2
    rng = np.random.default_rng(11)
    d, p, hk, h = 64, 16, 2, 8
    nb, nr, btw, w = 5, 3, 4, 70
    rows = 24
    bits = np.full((nb, hk, p, 2 * d), C.BF16_NAN_BITS, np.uint16)
    kv = bits.view(C.BF16)
    kv[1:3] = C.bf16_random(rng, (2, hk, p, 2 * d))  # only pages 1 and 2 hold numbers
    bt = np.array([[1, 2, -1, nb], [2, 1, 2**30, -(2**31)], [1, 1, 1, 1]], np.int32)
    idx = rng.integers(0, 2 * p, (rows, w + 1)).astype(np.int32)  # logical pages 0..1: valid
    idx[0::4, : w // 2] = btw * p + rng.integers(0, 10**6, (len(idx[0::4]), w // 2))  # past the table
    idx[1::4, 3:9] = 2 * p + rng.integers(0, 2 * p, (len(idx[1::4]), 6))  # table entries -1 / NB / huge
    idx[2::4, :5] = -1
    idx[3::4, 10:12] = 2**31 - 1
    idx[:, w] = np.resize(np.array([w, 10**9, -7, 0, 2**31 - 1, 33], np.int32), rows)
    req = np.resize(np.array([0, 1, 2, -1, nr, 2**31 - 1, -(2**31)], np.int32), rows)
    # Pages past the table also reach NaN rows through page 0/3/4 when not masked.
    q = C.bf16_random(rng, (rows, h, d))
    gate = C.bf16_random(rng, (rows, h, d))
    for splits_cfg in (None, (16, 2, 5, 1), (16, 4, 5, 5), (32, 1, 3, 2)):
        for layout in ("fused", "split"):
            kv_arg = kv if layout == "fused" else tuple(
                np.ascontiguousarray(x) for x in (kv.transpose(0, 2, 1, 3)[..., :d], kv.transpose(0, 2, 1, 3)[..., d:]))
            got = qsa_jax.sparse_attention(q, kv_arg, idx, bt, req, gate, config=splits_cfg, implementation="triton")
            ref = qsa_jax.sparse_attention(q, kv_arg, idx, bt, req, gate, config=splits_cfg, implementation="xla")
            err = assert_agrees(np.asarray(got), np.asarray(ref), what=f"sparse {layout} {splits_cfg}")
            print(f"sparse_attention {layout} config={splits_cfg}: ok (rel err vs xla {err:.1e})")

    # store_cache_rows: slots -1, past the end, huge, int32 extremes.
    cache = C.bf16_random(rng, (6, 8, 1, 140))
    slots = np.array([0, 47, 48, -1, 2**31 - 1, -(2**31), 5, 1000, 47], np.int32)
    vals = C.bf16_random(rng, (slots.size, 140))
    got = qsa_jax.store_cache_rows(jnp.asarray(cache), slots, vals, implementation="triton")
    ref = qsa_jax.store_cache_rows(cache, slots[:-1], vals[:-1], implementation="xla")  # duplicate slot 47 dropped
    diff = np.asarray(got).view(np.uint16) != np.asarray(ref).view(np.uint16)
    assert not diff[:, :, :, :].reshape(48, -1)[np.arange(48) != 47].any(), "store touched a slot it must not"
    print("store_cache_rows: ok")

    # compress_groups_with_ratio: bad requests, ring blocks out of range, positions too early.
    r = 16
    raw = C.bf16_random(rng, (r, 1, 128))
    pos = rng.integers(0, 50, (r, 1, 3)).astype(np.int32)
    ring = C.bf16_random(rng, (3, 4, 1, 128))
    rope = rng.integers(0, 2**30, (3, 4, 1, 3)).astype(np.int32)
    table = np.array([[0], [7], [-1], [2]], np.int32)
    qsl = np.array([0, 4, 8, 12, 16], np.int32)
    t2r = np.resize(np.array([0, 1, 2, 3, -1, 4, 2**31 - 1], np.int32), r)
    lpos = np.resize(np.array([0, 2, 3, 9, 2**31 - 1, -(2**31), 40], np.int32), r)
    cslots = np.resize(np.array([1, -1, 3, 4], np.int32), r)
    for rope_arg in (rope, None):
        gp, gf = qsa_jax.compress_groups_with_ratio(raw, pos, ring, table, t2r, qsl, lpos, cslots, 4, rope_arg,
                                                    implementation="triton")
        rp, rf = qsa_jax.compress_groups_with_ratio(raw, pos, ring, table, t2r, qsl, lpos, cslots, 4, rope_arg,
                                                    implementation="xla")
        np.testing.assert_array_equal(np.asarray(gp).view(np.uint16), np.asarray(rp).view(np.uint16))
        np.testing.assert_array_equal(np.asarray(gf), np.asarray(rf))
    print("compress_groups_with_ratio: ok")
    print("MEMCHECK RUN DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
