#!/usr/bin/env python3
"""Swap qsa_torch_shim in for vLLM's QSA ops module and check nothing else changes.

Runs a fixed list of calls through the originals (vLLM 0.30.0's or 0.34.0's
qsa.py, loaded by qsa_testing.originals under vLLM's module name), then puts the
shim in ``sys.modules`` under that same name with ``install(vllm_version=...)``
(the surface of that version), re-imports "the module" the way vLLM code would,
and repeats the identical calls. With 0.34.0 the list adds fp8 calls (an e4m3
view of the cache from sm_89 on, the uint8 bytes below, k_scale 0.5, v_scale
2.0) when qsa_jax takes scales. Prints one PASS/FAIL line per call and a
summary; exit status 0 only if everything passed.

Needs a CUDA GPU (the originals are Triton kernels). On the GPU machine, carry
.cache/originals or set QSA_ORIGINALS_DIR.

    python tools/swap_in_check.py [--quick] [--vllm 0.34.0]
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
import traceback
import warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import qsa_torch_shim  # noqa: E402  (first: sets XLA_PYTHON_CLIENT_PREALLOCATE before jax)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from qsa_jax import arg_specs  # noqa: E402
from qsa_testing import cases as C  # noqa: E402
from qsa_testing import golden, originals  # noqa: E402
from qsa_testing.agreement import rel_frobenius  # noqa: E402
from qsa_testing.torch_interop import kv_views, to_numpy, to_torch  # noqa: E402

MODULE = qsa_torch_shim.ORIGINAL_MODULE
RESULTS: list[tuple[str, bool, str]] = []


def report(name: str, ok: bool, detail: str = "") -> None:
    RESULTS.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}", flush=True)


def build_calls(quick: bool, fp8: bool = False):
    """[(name, fn(module) -> tensors to compare, kind)] with inputs built once."""
    calls = []
    fp8_dtype = torch.float8_e4m3fn if torch.cuda.get_device_capability() >= (8, 9) else torch.uint8
    gen = torch.Generator(device="cuda").manual_seed(0)
    pools = {"TP1": 300, "TP2": 500, "TP4": 1000}
    rows_list = (1, 64, 2049) if quick else (1, 8, 64, 256, 1024, 2049, 4096)
    for gname, pages in pools.items():
        g = arg_specs.GEOMETRIES[gname]
        kv = torch.randn((pages, g.num_kv_heads, g.page_size, 2 * g.head_dim), device="cuda",
                         dtype=torch.bfloat16, generator=gen)
        k, v = kv_views(kv, g.head_dim)  # exactly how vLLM slices its kv_cache
        # vLLM allocates an fp8 cache as bytes and hands the kernels a view of it.
        kv8 = kv.to(torch.float8_e4m3fn).view(torch.uint8) if fp8 else None
        k8, v8 = kv_views(kv8.view(fp8_dtype), g.head_dim) if fp8 else (None, None)
        for rows in rows_list:
            rng = np.random.default_rng(rows)
            case = C.sparse_attention_case(
                rng, rows=rows, num_query_heads=g.num_query_heads, num_kv_heads=g.num_kv_heads,
                head_dim=g.head_dim, page_size=g.page_size, selection_blocks=512,
                context_tokens=65536, num_requests=min(rows, 8), num_pages=pages, make_cache=False)
            t = {n: to_torch(getattr(case, n)) for n in
                 ("q", "logical_indices", "block_table", "token_to_req", "output_gate")}
            flags = (False, True) if rows * g.num_kv_heads > 2048 else (False,)
            for flag in flags:
                def new(m, t=t, k=k, v=v, flag=flag):
                    return [m.qsa_sparse_paged_attention(
                        t["q"], k, v, t["logical_indices"], t["block_table"], t["token_to_req"],
                        flag, output_gate=t["output_gate"])]

                def into(m, t=t, k=k, v=v, flag=flag):
                    out = torch.full_like(t["q"], float("nan"))
                    r = m.qsa_sparse_paged_attention(
                        t["q"], k, v, t["logical_indices"], t["block_table"], t["token_to_req"],
                        flag, out, output_gate=t["output_gate"])
                    assert r is out, "out= call did not return out"
                    return [out]

                qkv, start = C.qkv_with_query(case.q, g.num_kv_heads)  # vLLM's q: a view of qkv
                q_view = to_torch(qkv)[:, start:start + case.q.shape[1] * case.q.shape[2]].view(case.q.shape)

                def strided(m, t=t, k=k, v=v, flag=flag, q_view=q_view):
                    out = torch.full_like(t["q"], float("nan"))
                    m.qsa_sparse_paged_attention(
                        q_view, k, v, t["logical_indices"], t["block_table"], t["token_to_req"],
                        flag, out, output_gate=t["output_gate"])
                    return [out]

                if fp8:
                    def quantised(m, t=t, k8=k8, v8=v8, flag=flag):
                        out = torch.full_like(t["q"], float("nan"))
                        m.qsa_sparse_paged_attention(
                            t["q"], k8, v8, t["logical_indices"], t["block_table"],
                            t["token_to_req"], flag, out, 0.5, 2.0, output_gate=t["output_gate"])
                        return [out]

                    calls.append((f"sparse {gname} rows={rows} prefill={flag} fp8 {fp8_dtype}",
                                  quantised, "float"))
                calls.append((f"sparse {gname} rows={rows} prefill={flag} out=None", new, "float"))
                calls.append((f"sparse {gname} rows={rows} prefill={flag} out=given", into, "float"))
                calls.append((f"sparse {gname} rows={rows} prefill={flag} q=view of qkv", strided, "float"))
        block_table = to_torch(np.arange(64, dtype=np.int32).reshape(8, 8) % pages)
        calls.append((f"warmup {gname} (returned profiles)",
                      lambda m, kv=kv, bt=block_table, g=g: [torch.tensor(
                          m.warmup_qsa_sparse_paged_attention(
                              kv, bt, num_query_heads=g.num_query_heads, selection_width=2051,
                              **({"rows": [1]} if m.__name__.startswith("qsa_torch_shim") else {})))],
                      "exact"))
    for case, _ in golden.store_cases():
        def store(m, case=case):
            cache = to_torch(case.cache)
            m.qsa_store_cache_rows(cache, to_torch(case.slot_mapping.astype(np.int64)),
                                   to_torch(case.rows))
            return [cache]
        calls.append((f"store {case.name}", store, "exact"))
    rng = np.random.default_rng(1)
    compress = [c for c, _, _ in golden.compress_cases()]
    compress.append(C.compress_case(rng, name="prefill_8192", chunk_lens=[4000, 1, 700, 3491],
                                    ring=8, edge=True))
    for case in compress:
        for packed in ((False, True) if case.rope_cache is not None else (False,)):
            def comp(m, case=case, packed=packed):
                a = _compress_args(case, packed)
                return list(m.qsa_compress_groups_with_ratio(**a))
            calls.append((f"compress {case.name}{' packed-ring' if packed else ''}", comp, "exact"))
    calls.append(("_select_config grid", lambda m: [torch.tensor(
        [m._select_config(r, hk, f, w) for r in range(0, 9000, 7) for hk in (1, 2)
         for f in (False, True) for w in (35, 2051)])], "exact"))
    return calls


def _compress_args(case, packed):
    t = to_torch
    a = dict(raw_keys=t(case.raw_keys), raw_positions=t(case.raw_positions.astype(np.int64)),
             compressor_state_cache=t(case.compressor_state_cache),
             compressor_state_block_table=t(case.compressor_state_block_table),
             token_to_req=t(case.token_to_req), query_start_loc=t(case.query_start_loc),
             logical_positions=t(case.logical_positions.astype(np.int64)),
             compressed_slots=t(case.compressed_slots), compress_ratio=case.compress_ratio,
             rope_cache=None if case.rope_cache is None else t(case.rope_cache.astype(np.int64)))
    if packed:  # vLLM's ring rows: keys + 3 int64 positions in 12 bf16 slots
        bs, s, _, dk = case.compressor_state_cache.shape
        store = torch.zeros((bs, s, 1, dk + 12), dtype=torch.bfloat16, device="cuda")
        store[..., :dk] = a["compressor_state_cache"]
        rope = store[..., dk:].view(torch.int64)
        rope.copy_(a["rope_cache"])
        a["compressor_state_cache"], a["rope_cache"] = store[..., :dk], rope
    return a


def compare(kind, want, got):
    if len(want) != len(got):
        return False, f"{len(got)} outputs, expected {len(want)}"
    details = []
    for w, g in zip(want, got):
        if w.shape != g.shape or w.dtype != g.dtype:
            return False, f"shape/dtype {tuple(g.shape)} {g.dtype} != {tuple(w.shape)} {w.dtype}"
        if kind == "exact" or w.dtype not in (torch.bfloat16, torch.float32):
            same = torch.equal(w.view(torch.int16), g.view(torch.int16)) if w.dtype == torch.bfloat16 \
                else torch.equal(w, g)
            if not same:
                return False, "not bit-identical"
            details.append("bit-identical")
        else:
            a, e = to_numpy(g).astype(np.float64), to_numpy(w).astype(np.float64)
            if np.isnan(a).any():
                return False, "NaN in output"
            if ((e == 0) & (a != 0)).any():
                return False, "nonzero where the original is exactly 0"
            err = rel_frobenius(a, e)
            if err > 1e-3:
                return False, f"relative Frobenius error {err:.2e} > 1e-3"
            details.append(f"rel.err {err:.1e}")
    return True, ", ".join(details)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer row counts")
    parser.add_argument("--vllm", default=originals.VLLM_VERSION, choices=originals.VERSIONS,
                        help="which originals to swap the shim in for")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("FAIL  needs a CUDA GPU (the originals are Triton kernels)")
        return 2
    try:
        orig = originals.load(args.vllm)
    except originals.OriginalsUnavailable as exc:
        print(f"FAIL  originals unavailable: {exc}")
        return 2

    # vLLM imports the ops by module name: make that name the originals first.
    sys.modules[MODULE] = orig
    before = importlib.import_module(MODULE)
    import qsa_torch_shim

    # Compared element by element with the originals: run the shim on their version's
    # tiling (its default on a GPU with a measured table is another, equally accurate one).
    qsa_torch_shim.set_tiling_table("vllm-" + args.vllm.rsplit(".", 1)[0])

    fp8 = args.vllm != "0.30.0"
    calls = build_calls(args.quick, fp8)
    reference = {}
    for name, fn, _ in calls:
        try:
            reference[name] = [x.clone() for x in fn(before)]
        except Exception:  # noqa: BLE001
            reference[name] = traceback.format_exc(limit=2)
    torch.cuda.synchronize()

    replaced = qsa_torch_shim.install(MODULE, vllm_version=args.vllm)
    after = importlib.import_module(MODULE)
    assert replaced is orig and after is qsa_torch_shim.surface_module(args.vllm), \
        "install() did not swap the module"
    report("install() swaps the module name", True, f"{MODULE} -> {after.__name__}")
    for name, fn, kind in calls:
        want = reference[name]
        if isinstance(want, str):
            report(name, False, "the ORIGINAL failed: " + want.strip().splitlines()[-1])
            continue
        try:
            with warnings.catch_warnings():
                # A drop-in must not copy large tensors: a copy fails the call.
                warnings.simplefilter("error", qsa_torch_shim.ShimCopyWarning)
                got = fn(after)
            torch.cuda.synchronize()
            ok, detail = compare(kind, want, got)
        except Exception:  # noqa: BLE001
            ok, detail = False, traceback.format_exc(limit=3).strip().splitlines()[-1]
        report(name, ok, detail)

    # Host latency of one small eager call, through the same module name.
    g = arg_specs.TP1
    rng = np.random.default_rng(0)
    case = C.sparse_attention_case(rng, rows=1, num_query_heads=g.num_query_heads,
                                   num_kv_heads=g.num_kv_heads, head_dim=g.head_dim,
                                   page_size=g.page_size, selection_blocks=512,
                                   context_tokens=65536, num_pages=300, make_cache=False)
    kv = torch.randn((300, g.num_kv_heads, g.page_size, 2 * g.head_dim), device="cuda",
                     dtype=torch.bfloat16)
    k, v = kv_views(kv, g.head_dim)
    t = {n: to_torch(getattr(case, n)) for n in
         ("q", "logical_indices", "block_table", "token_to_req", "output_gate")}
    out = torch.empty_like(t["q"])
    for label, m in (("original", orig), ("shim", after)):
        res = qsa_torch_shim.measure_eager_latency(
            lambda m=m: m.qsa_sparse_paged_attention(
                t["q"], k, v, t["logical_indices"], t["block_table"], t["token_to_req"], False,
                out, output_gate=t["output_gate"]), device="cuda")
        print(f"INFO  eager call TP1 rows=1 out=given [{label}]: {res['per_call_us']:.1f} us/call "
              f"(host {res['host_us']:.1f} us)")

    failed = [n for n, ok, _ in RESULTS if not ok]
    print(f"\nSUMMARY: {len(RESULTS) - len(failed)}/{len(RESULTS)} PASS"
          + (f"; FAILED: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
