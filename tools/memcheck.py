"""Out-of-bounds check of every GPU implementation on adversarial metadata.

    bash tools/gpu_memcheck_parts.sh      # on the GPU: every part, its own process

which runs, per part, ``compute-sanitizer --tool memcheck --error-exitcode 3 python3
tools/memcheck.py --impl I --part P`` with the XLA flags the sanitizer needs (see there).

``XLA_PYTHON_CLIENT_ALLOCATOR=platform`` makes JAX call cudaMalloc for each
buffer instead of carving them out of one pool, so a read past the end of the
cache lands outside any allocation and memcheck reports it. The cache is sized
exactly (no spare pages) and the metadata points everywhere it must not be
followed: tokens past the block table, physical pages -1 / NB / huge, request
ids -1 / NR / huge, counts far above W, negative tokens and counts. Every
cache row no valid entry reads is poisoned (``cases.poison_unreferenced``: large
finite K, NaN V, so a stray read shows in the output), and each kernel's output
is also compared with the XLA reference under the fidelity contract of
docs/spec.md §6 (stores and pooling bit-exact). The kernels run their default
route; while its tiling is the originals' (the jax-triton Hopper table only
re-deals the last tile to its own split at <= 24 programs), fidelity applies.

``--plant`` runs only a control instead: a Pallas kernel that reads 1 Mi
elements past the end of its input. memcheck must report it (a non-zero error
summary); if it does not, a clean report of the real kernels proves nothing.
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import qsa_jax  # noqa: E402
from qsa_testing import cases as C  # noqa: E402
from qsa_testing.agreement import assert_fidelity  # noqa: E402


def adversarial_sparse_case(rng, rows, heads, kv_heads, d, page, width):
    nb, nr, btw = 5, 3, 4
    tokens = rng.integers(-(2**31), 2**31 - 1, (rows, width), dtype=np.int64).astype(np.int32)
    near = rng.integers(-3, btw * page + 3 * page, (rows, width)).astype(np.int32)
    tokens = np.where(rng.random((rows, width)) < 0.7, near, tokens)
    counts = rng.choice([-(2**31), -1, 0, 1, width, width + 1, 2**31 - 1], rows).astype(np.int32)
    table = rng.choice([-(2**31), -1, 0, 1, nb - 1, nb, nb + 1, 2**31 - 1], (nr, btw)).astype(np.int32)
    req = rng.choice([-(2**31), -1, 0, 1, nr - 1, nr, 2**31 - 1], rows).astype(np.int32)
    return C.poison_unreferenced(C.SparseAttentionCase(
        name="adversarial", q=C.bf16_random(rng, (rows, heads, d)),
        kv_cache=C.bf16_random(rng, (nb, kv_heads, page, 2 * d)),
        logical_indices=np.concatenate([tokens, counts[:, None]], 1), block_table=table,
        token_to_req=req, output_gate=C.bf16_random(rng, (rows, heads, d))))


# (rows, query heads, KV heads, W): split (64, 16) and one-split configs, both flags. Shape 4
# (session 32): 384 (row, head) pairs, where the Pallas merge runs 128-wide D chunks on 1 warp
# (config.PALLAS_MERGE_LAYOUTS; shapes 0 and 1 hold its 32- and 64-wide rows).
SPARSE_SHAPES = ((1, 24, 2, 2051), (16, 12, 1, 2051), (300, 6, 1, 259), (1100, 24, 2, 67),
                 (32, 12, 1, 2051))


def _agrees(out, ref) -> bool:
    try:
        res = assert_fidelity(out, ref)
        print(f"     rel_err={res['rel_err']:.2e} ulp_fraction={res['ulp_fraction']:.2e}")
        return True
    except AssertionError as exc:
        print(f"MISMATCH {exc}")
        return False


def _record(results, name, ok):
    """Print each launch as it is checked: if the sanitizer dies, the log shows where."""
    results.append((name, ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}", flush=True)


def _impls(op: str, only: str | None) -> list[str]:
    return [i for i in qsa_jax.available_implementations(op)
            if i != "xla" and (only is None or i == only)]


# Extra parts on shapes 0 (1 row, W 2051: many splits) and 2 (300 rows, W 259): fp8
# caches with scales, the single-launch merge, and the Pallas backward (its default walk on
# these 16-slot pages is the inverted one since session 10: the dq walk's split-K atomic adds
# and the token-major dK/dV kernel's writes, where a stray address writes, not just reads).
# backward_fp8: the same through vLLM 0.34's arithmetic (an e4m3 cache, k/v scales; session 18),
# where the kernels decode fp8 tiles after the masked load and take a scale operand.
# fp8_gluon (session 20): the Gluon fp8 split kernel (config.triton_fp8_gluon_split forced on) at
# one-warp tilings (32-wide with 2 splits, 16-wide with 1), V straight into registers and through
# shared memory (config.triton_fp8_gluon_values_shared); each launch also checks that the plan
# named the Gluon kernel.
# bf16_bands (session 37): the sm_90 bf16 table's split counts past one wave of its 2-warp kernel
# (session 36: 3 splits at 529-660 programs, 2 at 661-792) forced on these shapes, fused and split
# caches: on W 2051 a split holds 22 or 33 tiles, on W 259 three or five, so a split's partial last
# tile and the merge's masked rows are both exercised.
EXTRA_PARTS = ("fp8", "fused", "backward", "backward_fp8", "fp8_gluon", "bf16_bands")
# fp8 also through jax-triton (the fp8 default on Hopper where the table names it, sessions 8-10); the
# fused merge and the backward exist in Pallas only; bf16_bands runs both (the table is shared).
EXTRA_PART_IMPLS = {"fp8": ("pallas", "triton"), "fused": ("pallas",), "backward": ("pallas",),
                    "backward_fp8": ("pallas",), "fp8_gluon": ("triton",), "bf16_bands": ("pallas", "triton")}
EXTRA_SHAPES = (0, 2)


def _fp8_caches(case):
    """e4m3 values (3x spread, like the GPU parity test) and the same bytes as uint8. The
    poison survives: NaN V stays NaN, the large K saturates to e4m3 NaN -- either way a
    stray read makes the output NaN or takes the softmax (so it shows)."""
    e4m3 = (case.kv_cache.astype(np.float32) * 3.0).astype(C.E4M3)
    return {"e4m3": e4m3, "bytes": e4m3.view(np.uint8)}


def _extra_part(name, case, impl, args, results, label):
    if name == "fp8":
        from qsa_jax import config

        # The default launch, then the sm_90 fp8 table's 25-32-program tiling (session 26:
        # jax-triton at one warp, 16 splits) forced on this shape: the kernel and its constants
        # are what memcheck checks, not the program count (session 27). Pallas too (there the
        # table keeps 2 warps), which lets the CPU smoke test run it in interpret mode.
        # Session 36: also the wave-filling counts of session 35 that are not powers of two
        # (6 splits at 133-176 programs, 3 at 265-352), where jax-triton's merge masks a split
        # block of 8 / 4 rows down to 6 / 3 and Pallas (one warp there) deals tiles to them.
        # Session 37: and the 4 splits past one wave (1057-1260 programs; 560 rows at 2 KV heads).
        # (Shape 2's own default launch, 600 programs, takes the 3 splits of 529-704 since then.)
        width = case.logical_indices.shape[1] - 1
        forced = [tuple(config.select_config(rows, 2, False, width, True, capability=(9, 0)))
                  for rows in (16, 75, 150, 560)]
        for tiling in (None, *forced):
            for fmt, kv in _fp8_caches(case).items():
                fp8_args = (args[0], kv) + args[2:]
                out, ref = (np.asarray(qsa_jax.sparse_attention(*fp8_args, k_scale=0.5, v_scale=2.0, config=tiling,
                                                                implementation=i)) for i in (impl, "xla"))
                _record(results, f"{label} fp8 {fmt}" + (f" tiling {tiling}" if tiling else ""), _agrees(out, ref))
    elif name == "fp8_gluon":
        from qsa_jax import config
        from qsa_jax.ops.sparse_attention import triton as stri
        from qsa_jax.ops.sparse_attention.api import _run as jitted

        width = case.logical_indices.shape[1] - 1
        saved = config.triton_fp8_gluon_split, config.triton_fp8_gluon_values_shared
        try:
            config.triton_fp8_gluon_split = lambda: True
            for shared in (False, True):
                config.triton_fp8_gluon_values_shared = lambda shared=shared: shared
                jitted.clear_cache()
                stri._launch_plan.cache_clear()
                for bn, splits in ((32, 2), (16, 1)):
                    tiling = (bn, 1, -(-width // bn), splits)
                    for fmt, kv in _fp8_caches(case).items():
                        fp8_args = (args[0], kv) + args[2:]
                        out, ref = (np.asarray(qsa_jax.sparse_attention(*fp8_args, k_scale=0.5, v_scale=2.0,
                                                                        config=tiling, implementation=i))
                                    for i in (impl, "xla"))
                        # The part checks the Gluon kernel only if the plan launched it (it falls
                        # back to the Triton kernel where _gluon_support cannot route it).
                        _record(results, f"{label} fp8 gluon {fmt} bn{bn} s{splits} v_shared={shared}",
                                _agrees(out, ref) and _launched_gluon(case, kv, tiling))
        finally:
            config.triton_fp8_gluon_split, config.triton_fp8_gluon_values_shared = saved
            jitted.clear_cache()
            stri._launch_plan.cache_clear()
    elif name == "bf16_bands":
        from qsa_jax import config

        width = case.logical_indices.shape[1] - 1
        # 300 and 360 rows at 2 KV heads: 600 and 720 programs, one count inside each band.
        forced = [config.select_config(rows, 2, False, width, False, capability=(9, 0)) for rows in (300, 360)]
        assert [t.num_splits for t in forced] == [3, 2], forced  # the bands this part exists for
        for tiling in forced:
            for layout in ("fused", "split"):
                kv = case.kv_cache if layout == "fused" else case.split_caches()
                bf16_args = (args[0], kv) + args[2:]
                out, ref = (np.asarray(qsa_jax.sparse_attention(*bf16_args, config=tuple(tiling), implementation=i))
                            for i in (impl, "xla"))
                _record(results, f"{label} bf16 {layout} tiling {tuple(tiling)}", _agrees(out, ref))
    elif name == "fused":
        out = np.asarray(qsa_jax.sparse_attention(*args, implementation=impl,
                                                  launch=qsa_jax.PallasLaunch(merge="fused")))
        ref = np.asarray(qsa_jax.sparse_attention(*args, implementation="xla"))
        _record(results, f"{label} fused merge", _agrees(out, ref))
    elif name == "backward":
        _record(results, f"{label} backward", _backward_agrees(case, args, impl))
    elif name == "backward_fp8":
        for fmt, kv in _fp8_caches(case).items():  # uint8 bytes: no cache cotangent (float0)
            _record(results, f"{label} backward {fmt} k0.5 v2",
                    _backward_agrees(case, (args[0], kv) + args[2:], impl, scales=(0.5, 2.0)))


def _launched_gluon(case, kv, tiling) -> bool:
    """Whether the jax-triton launch plan for this call names the Gluon split kernel."""
    from qsa_jax.ops.sparse_attention import base as sbase
    from qsa_jax.ops.sparse_attention import triton as stri

    problem = sbase.check_sparse_attention_args(
        case.q, kv, case.logical_indices, case.block_table, case.token_to_req, case.output_gate,
        use_prefill_config=False, config=tiling, scales_given=(True, True))
    named = stri.launch_plan(problem).split_kernel
    print(f"     split kernel: {named}")
    return named == "gluon"


def _backward_agrees(case, args, impl, scales=(None, None)) -> bool:
    """jax.vjp through ``impl`` against the XLA backward on the same adversarial inputs:
    every gradient finite, within 5% (Frobenius) of XLA's, and exactly zero on every cache
    row no valid entry reads (those hold the NaN poison). ``scales``: k_scale, v_scale. A uint8
    cache has no cotangent to compare (its dq and dgate still are)."""
    import jax
    import jax.numpy as jnp

    q, kv, li, bt, tr, gate = (jnp.asarray(a) for a in args)
    ct = jnp.asarray(C.bf16_random(np.random.default_rng(5), case.q.shape))

    def grads(name):
        f = lambda q, kv, g: qsa_jax.sparse_attention(q, kv, li, bt, tr, g, k_scale=scales[0],
                                                      v_scale=scales[1], implementation=name)
        # A uint8 cache (e4m3 bytes) gets no cotangent (float0): None here.
        return [None if x.dtype == jax.dtypes.float0 else np.asarray(x, np.float64)
                for x in jax.vjp(f, q, kv, gate)[1](ct)]

    ok = True
    got = grads(impl)
    for which, mine, want in zip(("dq", "dkv", "dgate"), got, grads("xla")):
        if mine is None:
            continue
        rel = np.linalg.norm(mine - want) / max(np.linalg.norm(want), 1e-30)
        finite = bool(np.isfinite(mine).all())
        print(f"     {which}: rel_err={rel:.2e} finite={finite}")
        ok &= finite and rel <= 0.05
    if got[1] is None:
        return ok
    stray = ~C.referenced_rows(case)  # [NB, P]; dkv is [NB, Hk, P, 2D]
    zero = bool((got[1][np.broadcast_to(stray[:, None, :, None], got[1].shape)] == 0).all())
    print(f"     unreferenced rows' dkv all zero: {zero}")
    return ok and zero


def main(only: str | None = None, part: str | None = None) -> int:
    """``part``: None (everything), "sparse<i>" (shape i of SPARSE_SHAPES), "indexer", or one
    of EXTRA_PARTS (the implementations of EXTRA_PART_IMPLS; shapes EXTRA_SHAPES, fused cache)."""
    rng = np.random.default_rng(0)
    results = []
    for i, (rows, heads, kv_heads, width) in enumerate(SPARSE_SHAPES):
        case = adversarial_sparse_case(rng, rows, heads, kv_heads, 256, 16, width)
        if part in EXTRA_PARTS:
            if i in EXTRA_SHAPES:
                args = (case.q, case.kv_cache, case.logical_indices, case.block_table,
                        case.token_to_req, case.output_gate)
                for impl in _impls("sparse_attention", only):
                    if impl in EXTRA_PART_IMPLS[part]:
                        _extra_part(part, case, impl, args, results, f"{impl} rows={rows} W={width}")
            continue
        if part is not None and part != f"sparse{i}":
            continue  # (the case is still drawn: every part sees the same inputs)
        # XLA's gather clamps indices itself; the kernels are what is checked.
        for impl in _impls("sparse_attention", only):
            for layout in ("fused", "split"):
                kv = case.kv_cache if layout == "fused" else case.split_caches()
                for flag in (False, True):
                    args = (case.q, kv, case.logical_indices, case.block_table, case.token_to_req,
                            case.output_gate)
                    out = np.asarray(qsa_jax.sparse_attention(*args, use_prefill_config=flag,
                                                              implementation=impl))
                    ref = np.asarray(qsa_jax.sparse_attention(*args, use_prefill_config=flag,
                                                              implementation="xla"))
                    _record(results, f"sparse {impl} {layout} rows={rows} W={width} prefill={flag}",
                            _agrees(out, ref))

    if part is not None and part != "indexer":
        return _summary(results)  # (an extra part ends here too)
    comp = C.compress_case(rng, chunk_lens=[1, 5, 40, 2, 9], edge=True)
    comp.compressor_state_block_table[:] = rng.choice([-(2**31), -1, 10**6, 2**31 - 1], (5, 1))
    comp.token_to_req[:] = rng.choice([-(2**31), -1, 0, 4, 5, 2**31 - 1], comp.token_to_req.size)
    comp.logical_positions[:] = rng.choice([-(2**31), -1, 0, 3, 2**31 - 1], comp.logical_positions.size)
    for impl in _impls("compress_groups_with_ratio", only):
        for rope in (comp.rope_cache.astype(np.int32), None):
            pooled, first = qsa_jax.compress_groups_with_ratio(
                comp.raw_keys, comp.raw_positions.astype(np.int32), comp.compressor_state_cache,
                comp.compressor_state_block_table, comp.token_to_req, comp.query_start_loc,
                comp.logical_positions, comp.compressed_slots, comp.compress_ratio, rope,
                implementation=impl)
            ref = qsa_jax.compress_groups_with_ratio(
                comp.raw_keys, comp.raw_positions.astype(np.int32), comp.compressor_state_cache,
                comp.compressor_state_block_table, comp.token_to_req, comp.query_start_loc,
                comp.logical_positions, comp.compressed_slots, comp.compress_ratio, rope,
                implementation="xla")
            same = all(np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
                       for a, b in zip((pooled, first), ref))
            _record(results, f"compress {impl} rope={rope is not None}", same)

    # 640 slots >= 500 rows: the valid slots are distinct (with duplicates the GPU's
    # winner is unspecified, as in the originals, and a comparison would mean nothing).
    store = C.store_case(rng, n=500, pages=40, page_size=16, invalid_fraction=0.9)
    store.slot_mapping[::7] = 2**31 - 1
    store.slot_mapping[1::7] = -(2**31)
    for impl in _impls("store_cache_rows", only):
        got = np.asarray(qsa_jax.store_cache_rows(store.cache, store.slot_mapping, store.rows,
                                                  implementation=impl))
        ref = np.asarray(qsa_jax.store_cache_rows(store.cache, store.slot_mapping, store.rows,
                                                  implementation="xla"))
        _record(results, f"store {impl}", np.array_equal(got.view(np.uint16), ref.view(np.uint16)))

    return _summary(results)


def _summary(results) -> int:
    print(f"memcheck driver: {len(results)} launches, "
          f"{sum(not ok for _, ok in results)} disagree with the XLA reference")
    return 0 if all(ok for _, ok in results) else 1


def planted_out_of_bounds() -> int:
    """Control: a kernel with a deliberate read past the end of its (exactly sized) input."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    n = 4096

    def kernel(x_ref, start_ref, o_ref):
        # The start is a runtime value, so no trace-time bound check sees it; no mask.
        o_ref[...] = x_ref[pl.ds(start_ref[0], 128)]

    x = jnp.asarray(np.random.default_rng(1).standard_normal(n, dtype=np.float32))
    start = jnp.asarray([n + (1 << 20)], jnp.int32)
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128,), jnp.float32), grid=(1,),
                          in_specs=[pl.no_block_spec] * 2, out_specs=pl.no_block_spec)
    jax.block_until_ready(call(x, start))
    print("planted out-of-bounds kernel ran (memcheck must have reported it)")
    return 0


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="memcheck driver (run under compute-sanitizer)")
    ap.add_argument("--plant", action="store_true", help="run only the planted out-of-bounds control")
    ap.add_argument("--impl", choices=("pallas", "triton"), help="check one implementation only")
    ap.add_argument("--part", help="sparse0..sparse%d (one sparse shape), indexer, or one of %s"
                    % (len(SPARSE_SHAPES) - 1, ", ".join(EXTRA_PARTS)))
    a = ap.parse_args()
    sys.exit(planted_out_of_bounds() if a.plant else main(a.impl, a.part))
