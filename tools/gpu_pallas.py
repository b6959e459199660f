"""Pallas kernels on the GPU: parity with the originals at the real shapes, then timing.

Run on the lent GPU machine (see tools/gpu_env.sh):
    source tools/gpu_env.sh; python3 tools/gpu_pallas.py [--quick]

Parity: TP1/TP2/TP4 at several row counts (both use_prefill_config values
where they differ), fused layout, a ~2 GB pool drawn on the GPU with torch and
imported into JAX without a copy. Timing (TP1): device time per call with fresh
index sets per call -- JAX: one jitted function running N calls; originals: a
CUDA graph of the same N calls -- plus the card's copy bandwidth. Prints a
table last.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

CONTEXT = 65536
POOL_PAGES = {"TP1": 600, "TP2": 1000, "TP4": 2000}
N_CALLS = 16


def fresh_indices(li: np.ndarray, k: int) -> np.ndarray:
    """The k-th fresh index set: same counts and layout, different tokens (no L2 reuse)."""
    out = li.copy()
    sel = out[:, :-1]
    shifted = (sel + 4 * 1031 * k) % CONTEXT
    out[:, :-1] = np.where(sel >= 0, shifted, sel)
    return out


def main():
    import jax
    import jax.numpy as jnp
    import torch

    import qsa_jax
    from qsa_jax import arg_specs
    from qsa_testing import cases as C
    from qsa_testing import originals
    from qsa_testing.agreement import assert_agrees, rel_frobenius
    from qsa_testing.torch_interop import kv_views, to_numpy, to_torch, torch_to_jax

    orig = originals.load()
    quick = "--quick" in sys.argv
    print("device:", torch.cuda.get_device_name(), "jax", jax.__version__, flush=True)

    # Copy bandwidth of the card (read + write of a 1 GiB buffer).
    a = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev0.record()
    for _ in range(10):
        b.copy_(a)
    ev1.record()
    torch.cuda.synchronize()
    copy_bw = 2 * a.numel() * 2 * 10 / (ev0.elapsed_time(ev1) * 1e-3)
    del a, b
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s", flush=True)

    results = []
    parity_rows = {"TP1": (1, 8, 64, 512, 2048), "TP2": (64, 4096), "TP4": (8, 2048)}
    if quick:
        parity_rows = {"TP1": (1, 64, 2048)}
    for gname, rows_list in parity_rows.items():
        g = arg_specs.GEOMETRIES[gname]
        gen = torch.Generator(device="cuda").manual_seed(1234)
        kv = torch.randn((POOL_PAGES[gname], g.num_kv_heads, g.page_size, 2 * g.head_dim),
                         device="cuda", dtype=torch.bfloat16, generator=gen)
        kv_jax = torch_to_jax(kv)
        k_cache, v_cache = kv_views(kv, g.head_dim)
        for rows in rows_list:
            rng = np.random.default_rng(rows * 7 + g.num_query_heads)
            case = C.sparse_attention_case(
                rng, rows=rows, num_query_heads=g.num_query_heads, num_kv_heads=g.num_kv_heads,
                head_dim=g.head_dim, page_size=g.page_size, selection_blocks=arg_specs.SELECTION_BLOCKS,
                context_tokens=CONTEXT, num_pages=kv.shape[0], make_cache=False)
            flags = (False, True) if rows * g.num_kv_heads > 2048 else (False,)
            t = {k: to_torch(v) for k, v in case.arrays().items()}
            j = {k: jnp.asarray(v) for k, v in case.arrays().items()}
            for flag in flags:
                cfg = qsa_jax.config.select_config(rows, g.num_kv_heads, flag, case.selection_width)
                out = torch.full_like(t["q"], float("nan"))
                expected = to_numpy(orig.qsa_sparse_paged_attention(
                    t["q"], k_cache, v_cache, t["logical_indices"], t["block_table"],
                    t["token_to_req"], flag, out, output_gate=t["output_gate"]))
                got = np.asarray(qsa_jax.sparse_attention(
                    j["q"], kv_jax, j["logical_indices"], j["block_table"], j["token_to_req"],
                    j["output_gate"], use_prefill_config=flag, implementation="pallas"))
                try:
                    err = assert_agrees(got, expected, what=f"{gname} rows={rows}")
                    ok = "ok"
                except AssertionError as exc:
                    err, ok = rel_frobenius(got, expected), f"FAIL {exc}"
                print(f"PARITY {gname} rows={rows} prefill={flag} cfg={tuple(cfg)} rel_err={err:.2e} {ok}",
                      flush=True)

                if gname != "TP1":
                    continue
                # ---- timing: N calls with fresh index sets
                sets = [fresh_indices(case.logical_indices, k) for k in range(N_CALLS)]
                li_t = [to_torch(s) for s in sets]
                li_j = jnp.asarray(np.stack(sets))

                def timed(config):
                    def n_calls(q, kvj, lis, bt, tr, gate):
                        return [qsa_jax.sparse_attention(q, kvj, lis[k], bt, tr, gate, use_prefill_config=flag,
                                                         config=config, implementation="pallas")
                                for k in range(N_CALLS)]

                    fn = jax.jit(n_calls)
                    jargs = (j["q"], kv_jax, li_j, j["block_table"], j["token_to_req"], j["output_gate"])
                    jax.block_until_ready(fn(*jargs))
                    reps = 5
                    # Queue several launches of the N-call function and wait once:
                    # host dispatch overlaps the GPU work, so this is device time.
                    best = float("inf")
                    for _ in range(3):
                        jax.block_until_ready(fn(*jargs))
                        t0 = time.perf_counter()
                        res = [fn(*jargs) for _ in range(reps)]
                        jax.block_until_ready(res)
                        best = min(best, (time.perf_counter() - t0) / reps)
                        del res
                    return best / N_CALLS * 1e6

                jax_us = timed(None)  # Hopper knob table (qsa_jax.config.pallas_hopper_launch)
                explicit_us = timed(tuple(cfg))  # the originals' warps exactly
                print(f"TIME pallas table={jax_us:.1f}us explicit-config={explicit_us:.1f}us", flush=True)
                reps = 5

                outs = [torch.empty_like(t["q"]) for _ in range(N_CALLS)]

                def orig_calls():
                    for k in range(N_CALLS):
                        orig.qsa_sparse_paged_attention(
                            t["q"], k_cache, v_cache, li_t[k], t["block_table"], t["token_to_req"],
                            flag, outs[k], output_gate=t["output_gate"])

                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    orig_calls()
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    orig_calls()
                graph.replay()
                torch.cuda.synchronize()
                best_o = float("inf")
                for _ in range(reps):
                    ev0.record()
                    graph.replay()
                    ev1.record()
                    torch.cuda.synchronize()
                    best_o = min(best_o, ev0.elapsed_time(ev1) * 1e-3)
                orig_us = best_o / N_CALLS * 1e6
                count = np.minimum(case.logical_indices[:, -1], case.selection_width).clip(0)
                nbytes = (int(count.sum()) * g.num_kv_heads * 2 * g.head_dim * 2
                          + 3 * rows * g.num_query_heads * g.head_dim * 2)
                results.append((gname, rows, flag, tuple(cfg), orig_us, jax_us, nbytes))
                print(f"TIME {gname} rows={rows} prefill={flag} orig={orig_us:.1f}us pallas={jax_us:.1f}us "
                      f"ratio={jax_us / orig_us:.2f} pallas_bw={nbytes / jax_us / 1e6 / (copy_bw / 1e12):.0%}",
                      flush=True)
                del graph, outs
        del kv, kv_jax, k_cache, v_cache
        torch.cuda.empty_cache()

    # compress / store parity on the GPU (quick)
    rng = np.random.default_rng(3)
    case = C.compress_case(rng, chunk_lens=list(rng.multinomial(512, [1 / 8] * 8)), ring=8, edge=True)
    tt = {k: to_torch(v) for k, v in case.arrays().items()}
    pooled, first = orig.qsa_compress_groups_with_ratio(
        tt["raw_keys"], tt["raw_positions"], tt["compressor_state_cache"], tt["compressor_state_block_table"],
        tt["token_to_req"], tt["query_start_loc"], tt["logical_positions"], tt["compressed_slots"],
        case.compress_ratio, tt["rope_cache"])
    a = case.arrays()
    gp, gf = qsa_jax.compress_groups_with_ratio(
        a["raw_keys"], a["raw_positions"].astype(np.int32), a["compressor_state_cache"],
        a["compressor_state_block_table"], a["token_to_req"], a["query_start_loc"], a["logical_positions"],
        a["compressed_slots"], case.compress_ratio, case.rope_cache.astype(np.int32), implementation="pallas")
    print("PARITY compress bit-exact:",
          np.array_equal(np.asarray(gp).view(np.uint16), to_numpy(pooled).view(np.uint16))
          and np.array_equal(np.asarray(gf).astype(np.int64), to_numpy(first)), flush=True)
    sc = C.store_case(rng, n=8192, pages=600, page_size=64)
    ct = to_torch(sc.cache)
    orig.qsa_store_cache_rows(ct, to_torch(sc.slot_mapping), to_torch(sc.rows))
    got = qsa_jax.store_cache_rows(jnp.asarray(sc.cache), sc.slot_mapping, sc.rows, donate=True,
                                   implementation="pallas")
    print("PARITY store bit-exact:", np.array_equal(np.asarray(got).view(np.uint16), to_numpy(ct).view(np.uint16)),
          flush=True)

    print(f"\ncard: {torch.cuda.get_device_name()}  copy {copy_bw / 1e12:.2f} TB/s  N={N_CALLS} fresh index sets")
    print("| TP | rows | prefill | config | original us | pallas us | ratio | pallas % copy bw |")
    print("|---|---|---|---|---|---|---|---|")
    for gname, rows, flag, cfg, o, p, nb in results:
        print(f"| {gname} | {rows} | {flag} | {cfg} | {o:.1f} | {p:.1f} | {p / o:.2f} | "
              f"{nb / p / 1e6 / (copy_bw / 1e12):.0%} |")


if __name__ == "__main__":
    main()
