"""The bandwidth a sparse selection's K/V gather can reach at all, against the library's kernels.

    python3 tools/gather_roofline.py [--programs 2048,4096] [--geometries TP1,TP4]
        [--variants 16/1/0,32/4/1,...] [--n-sets 6] [--runs 2] [--out DIR]

Why (issue 13, session 34): on the H200 the one-warp fp8 kernel reads its K/V at 82-89% of
the copy bandwidth (session 32), short of the issue's 95%, where the H100 reached 90-97%. The
copy bandwidth is a streaming copy; the kernel reads the rows of a top-k selection: 4-token
blocks at random positions, one token's K and V of one KV head 2 x D bytes together (fp8:
512 B per token, 2 KB per block; bf16 twice that). Whether such a gather can reach 95% of a
streaming copy on this card at all is a property of the access pattern and the memory, not
of the attention kernel; this measures it. ``gather_read_kernel`` reads exactly the bytes
the attention kernel reads -- every valid entry's K and V row, through the library's own
row and page decisions (``triton_kernels._row_tiles`` / ``_selected_pages``), one program per
(row, KV head) as the one-split launch -- and does almost nothing with them (an int32 XOR per
word, one XOR per program stored so that no load is dead). Its best busy time over a few
tilings (``block_n/warps/prefetch``) is the ceiling for this pattern; the library's calls
(``implementation=None``: the launch it picks) and the copy are timed in the same process,
all from one profiler trace per case.

Reports per case: busy µs per call, GB/s of K/V bytes (``inputs.sparse_bytes``'s ``kv``: the
valid entries' K and V rows), % of the copy bandwidth measured at the start, and the fp8 over
bf16 throughput ratio of the library and of the best gather. Writes ``roofline.json`` to
--out. Needs a GPU (torch, Triton); no originals. ``--check`` (no GPU): the kernel in Triton's
interpreter against a NumPy XOR of the same rows, fp8 and bf16 bytes, with and without the
prefetch, on a small pool with an invalid request, a row past its count's end and -1 entries.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
if "--check" in sys.argv:  # Triton reads this when it is imported
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from qsa_jax.ops.sparse_attention.triton_kernels import _row_tiles, _selected_pages  # noqa: E402


@triton.jit(do_not_specialize=["last_request"])
def gather_read_kernel(kv_ptr,  # int32 words of the [NB, Hk, P, 2D] cache (fp8 bytes or bf16)
                       idx_ptr,  # int32 [R, W + 1]: selection, count
                       bt_ptr,  # int32 [requests, BTW]
                       req_ptr,  # int32 [R]
                       out_ptr,  # int32 [R, Hk]: one XOR per program (keeps the loads live)
                       last_request, num_pages,
                       W: tl.constexpr, PAGE: tl.constexpr, BTW: tl.constexpr, HK: tl.constexpr,
                       STRIDE_PAGE: tl.constexpr, STRIDE_TOKEN: tl.constexpr, STRIDE_HEAD: tl.constexpr,
                       ROW_WORDS: tl.constexpr, BLOCK_N: tl.constexpr, NUM_TILES: tl.constexpr,
                       PREFETCH: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)
    req_ok, bt_row_offset, idx_row_offset, n_tiles = _row_tiles(req_ptr, idx_ptr, row, last_request, W, BTW,
                                                                 BLOCK_N, NUM_TILES)
    words = tl.arange(0, ROW_WORDS)
    acc = tl.zeros([ROW_WORDS], tl.int32)
    # PREFETCH: the next tile's pages and K/V words are loaded before this tile's are reduced, so
    # one tile per program is always in flight (Triton's pipeliner issues no asynchronous copy
    # for a load that feeds no dot: num_stages changes nothing here). Past the last tile,
    # _selected_pages selects nothing and the load reads nothing.
    values = _tile_words(kv_ptr, idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, 0, req_ok, n_tiles, num_pages,
                         head, words, W, PAGE, BTW, STRIDE_PAGE, STRIDE_TOKEN, STRIDE_HEAD, BLOCK_N)
    for tile in range(0, n_tiles):
        if PREFETCH:
            upcoming = _tile_words(kv_ptr, idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, tile + 1, req_ok,
                                   n_tiles, num_pages, head, words, W, PAGE, BTW, STRIDE_PAGE, STRIDE_TOKEN,
                                   STRIDE_HEAD, BLOCK_N)
        # XOR-reduced over the tile's tokens at once: in-thread (each thread's words span the
        # tile's tokens), and no [BLOCK_N, ROW_WORDS] accumulator to hold.
        acc ^= tl.xor_sum(values, axis=0)
        if PREFETCH:
            values = upcoming
        else:
            values = _tile_words(kv_ptr, idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, tile + 1, req_ok,
                                 n_tiles, num_pages, head, words, W, PAGE, BTW, STRIDE_PAGE, STRIDE_TOKEN,
                                 STRIDE_HEAD, BLOCK_N)
    tl.store(out_ptr + row * HK + head, tl.xor_sum(acc, axis=0))


@triton.jit
def _tile_words(kv_ptr, idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, tile, req_ok, n_tiles, num_pages, head,
                words, W: tl.constexpr, PAGE: tl.constexpr, BTW: tl.constexpr, STRIDE_PAGE: tl.constexpr,
                STRIDE_TOKEN: tl.constexpr, STRIDE_HEAD: tl.constexpr, BLOCK_N: tl.constexpr):
    """The K/V words ``[BLOCK_N, ROW_WORDS]`` of one tile's valid entries (0 elsewhere)."""
    tok_in_page, page, ok = _selected_pages(idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, tile, req_ok,
                                            n_tiles, num_pages, W, PAGE, BTW, BLOCK_N)
    # 64-bit: page * STRIDE_PAGE overflows int32 past 2**31 words.
    base = tl.maximum(page, 0).to(tl.int64) * STRIDE_PAGE + tok_in_page * STRIDE_TOKEN + head * STRIDE_HEAD
    return tl.load(kv_ptr + (base[:, None] + words[None, :]), mask=ok[:, None], other=0)


def check() -> int:
    """``--check``: the kernel in Triton's interpreter against NumPy (exit 1 on a mismatch)."""
    import jax
    import numpy as np
    import torch

    from bench import inputs
    from qsa_testing.triton_interpreter import patch_interpreter

    patch_interpreter()
    geo = inputs.geometry("TP4", cpu=True, pool_gb=0.01)
    rows, w = 5, geo.selection_width
    inp = inputs.sparse_inputs(geo, rows, 1, seed=7)
    idx, bt, req = (torch.from_numpy(np.array(x)) for x in (inp.idx[0], inp.block_table, inp.token_to_req))
    req[1] = -1  # an invalid request: nothing read
    idx[2, w] = min(int(idx[2, w]), 37)  # a count that ends inside a tile
    idx[3, 5:40] = -1  # entries the selection leaves empty
    failures = 0
    for fp8 in (True, False):
        _, kv = inputs.make_pool(geo, gpu=False, seed=3, fp8=fp8)
        words = torch.from_numpy(np.array(kv.view(jax.numpy.uint8 if fp8 else jax.numpy.uint16))).view(torch.int32)
        for bn, prefetch in ((16, False), (16, True), (32, True)):
            # As the attention kernel: every entry of the tiles the count reaches (its last tile's
            # entries past the count included), but -1.
            want = np.zeros((rows, geo.num_kv_heads), np.int32)
            for r in range(rows):
                if req[r] < 0:
                    continue
                for tok in idx[r, :min(-(-int(idx[r, w]) // bn) * bn, w)].tolist():
                    if tok >= 0:
                        want[r] ^= np.bitwise_xor.reduce(
                            words[bt[req[r], tok // geo.page_size], :, tok % geo.page_size].numpy(), axis=-1)
            out = torch.full((rows, geo.num_kv_heads), -7, dtype=torch.int32)
            gather_read_kernel[(rows, geo.num_kv_heads)](
                words, idx, bt, req, out, bt.shape[0] - 1, words.shape[0], W=w, PAGE=geo.page_size,
                BTW=bt.shape[1], HK=geo.num_kv_heads, STRIDE_PAGE=words.stride(0), STRIDE_TOKEN=words.stride(2),
                STRIDE_HEAD=words.stride(1), ROW_WORDS=words.shape[3], BLOCK_N=bn, NUM_TILES=-(-w // bn),
                PREFETCH=prefetch)
            same = np.array_equal(out.numpy(), want)
            failures += not same
            print(f"{'ok' if same else 'MISMATCH'} {'fp8' if fp8 else 'bf16'} block_n {bn} prefetch {prefetch}",
                  flush=True)
    return 1 if failures else 0


def main() -> int:
    if "--check" in sys.argv:
        return check()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", default="2048,4096")
    ap.add_argument("--geometries", default="TP1,TP4")
    ap.add_argument("--variants", default="16/1/0,32/1/0,32/1/1,32/4/0,32/4/1,64/8/1",
                    help="gather tilings block_n/warps/prefetch (1: the next tile loaded ahead)")
    ap.add_argument("--n-sets", type=int, default=6)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import jax
    import torch

    import qsa_jax
    from bench import inputs, machine
    from bench.hopper_sweep import FP8_SCALES, traced_job_bursts
    from bench.timing import sequential_calls

    variants = [tuple(int(x) for x in v.split("/")) for v in a.variants.split(",")]
    copy = machine.copy_bandwidth(True)
    card = torch.cuda.get_device_name()
    print(f"{card}: copy bandwidth {copy['gbps']:,.0f} GB/s", flush=True)
    results = []
    for geo_name in a.geometries.split(","):
        geo = inputs.geometry(geo_name, cpu=False, pool_gb=2.0)
        pools = {dt: inputs.make_pool(geo, gpu=True, seed=21, fp8=dt == "fp8") for dt in ("fp8", "bf16")}
        for programs in (int(x) for x in a.programs.split(",")):
            rows = programs // geo.num_kv_heads
            inp = inputs.sparse_inputs(geo, rows, a.n_sets, seed=programs + geo.num_kv_heads)
            t = torch.from_dlpack
            tidx = [t(x) for x in inp.idx]
            tbt, tt2r = t(inp.block_table), t(inp.token_to_req)
            valid = sum(inp.valid_entries) / len(inp.valid_entries)
            jobs = []  # (label, kv dtype, run, wait)
            for dt, (kv_t, kv) in pools.items():
                scales = dict(zip(("k_scale", "v_scale"), FP8_SCALES)) if dt == "fp8" else {}

                def chain(q, kv, idx_sets, bt, t2r, gate, scales=scales):
                    return sequential_calls(lambda i: qsa_jax.sparse_attention(q, kv, i, bt, t2r, gate, **scales),
                                            idx_sets)
                fn = jax.jit(chain).lower(inp.q, kv, tuple(inp.idx), inp.block_table, inp.token_to_req,
                                          inp.gate).compile()
                args = (inp.q, kv, tuple(inp.idx), inp.block_table, inp.token_to_req, inp.gate)
                jobs.append((f"library {dt}", dt, lambda fn=fn, args=args: fn(*args), jax.block_until_ready))
                words = (kv_t.view(torch.uint8) if dt == "fp8" else kv_t).view(torch.int32)  # [NB, Hk, P, words]
                out = torch.empty((rows, geo.num_kv_heads), dtype=torch.int32, device="cuda")
                for bn, warps, prefetch in variants:
                    meta = dict(W=geo.selection_width, PAGE=geo.page_size, BTW=tbt.shape[1], HK=geo.num_kv_heads,
                                STRIDE_PAGE=words.stride(0), STRIDE_TOKEN=words.stride(2),
                                STRIDE_HEAD=words.stride(1), ROW_WORDS=words.shape[3], BLOCK_N=bn,
                                NUM_TILES=-(-geo.selection_width // bn), PREFETCH=bool(prefetch), num_warps=warps)

                    def run(meta=meta, words=words, out=out):
                        for idx in tidx:
                            gather_read_kernel[(rows, geo.num_kv_heads)](
                                words, idx, tbt, tt2r, out, tbt.shape[0] - 1, words.shape[0], **meta)
                        return out
                    jobs.append((f"gather {dt} {bn}/{warps}/{prefetch}", dt, run, lambda _: torch.cuda.synchronize()))
            for _, _, run, wait in jobs:  # warm: compile, first launch
                wait(run())

            bursts = traced_job_bursts([(run, wait) for _, _, run, wait in jobs], a.runs)
            calls = a.runs * a.n_sets
            if bursts is None:
                print(f"{geo_name} {programs}: the trace did not split into {len(jobs)} bursts", flush=True)
                continue
            print(f"{geo_name} {programs} programs ({rows} rows, {valid:,.0f} valid entries per call):", flush=True)
            case = dict(geometry=geo_name, programs=programs, rows=rows, valid_entries=valid, card=card,
                        copy_gbps=copy["gbps"], jobs={})
            for (label, dt, _, _), burst in zip(jobs, bursts):
                us = sum(k.duration_ns for k in burst) / calls / 1e3
                kv_bytes = inputs.sparse_bytes(geo, rows, valid, kv_bytes=1 if dt == "fp8" else 2)["kv"]
                gbps = kv_bytes / (us * 1e-6) / 1e9
                case["jobs"][label] = dict(us=us, gbps=gbps, pct_copy=100 * gbps / copy["gbps"])
                print(f"  {label:22s} {us:9.1f} us  {gbps:7,.0f} GB/s  {100 * gbps / copy['gbps']:5.1f}% of copy",
                      flush=True)
            best = {dt: min((v["us"], k) for k, v in case["jobs"].items() if k.startswith(f"gather {dt}"))
                    for dt in ("fp8", "bf16")}
            lib = {dt: case["jobs"][f"library {dt}"]["us"] for dt in ("fp8", "bf16")}
            case.update(best_gather={dt: b[1] for dt, b in best.items()},
                        fp8_over_bf16_library=lib["bf16"] / lib["fp8"],
                        fp8_over_bf16_best_gather=best["bf16"][0] / best["fp8"][0],
                        library_fp8_of_best_gather=best["fp8"][0] / lib["fp8"])
            print(f"  fp8/bf16 throughput: library {case['fp8_over_bf16_library']:.2f}x, best gather "
                  f"{case['fp8_over_bf16_best_gather']:.2f}x; library fp8 at {case['library_fp8_of_best_gather']:.2f}x "
                  f"of the best fp8 gather's rate ({best['fp8'][1]})", flush=True)
            results.append(case)
            if a.out:  # after every case: a run cut short keeps what it measured
                os.makedirs(a.out, exist_ok=True)
                with open(os.path.join(a.out, "roofline.json"), "w") as f:
                    json.dump(dict(copy_bandwidth=copy, cases=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
