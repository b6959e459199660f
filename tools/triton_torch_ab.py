"""The shim's ``implementation="triton-torch"`` against the originals: kernel time and eager call.

    python3 tools/triton_torch_ab.py [--rows 1,8,64,512,2048] [--tp TP1,TP4] [--kv bf16,fp8] [--out DIR]

Why (session 11): session 10 measured triton-torch's eager call at 1.05-1.24x vLLM 0.30.0's
(TP1, call + sync) without separating the host from the kernels. This tool times, in one
process, on the same inputs (one request, 2051 selected tokens per row, a fresh ``[NB, Hk, P, 2D]``
pool; fp8: e4m3 with scales 0.5 / 2.0, where only 0.34.0 has a path):

* busy time per call (``bench.kernel_trace``: the sum of kernel durations from a profiler trace)
  of each original and of triton-torch with each tiling table (``qsa_torch_shim.set_tiling_table``:
  None = the library's measured table, "vllm-0.30", "vllm-0.34"): which tiling the jax-triton
  kernels want;
* the eager call (call + ``torch.cuda.synchronize``) and the host's enqueue alone (no sync), µs per
  call, as the median of 7 rounds in which every column takes its turn (round-robin, so drift in
  the machine's state lands on every column alike).

``--summarize JSON``: one line per case of a written ``triton_torch_ab.json`` (no GPU needed).

``--prefetch-on``: a second pass per row count with ``qsa_jax.config.triton_prefetch``
forced True (the jax-triton kernels' next-tile index prefetch, off by default since session
11; 0.34.0's kernel has none), the originals timed again in that pass. ``--f16-dot on|off``:
likewise with ``config.triton_fp8_keys_f16_dot`` forced on or off (fp8's q.K^T as an fp16
dot; session 14; on by default where G <= 8 since session 17, and at G <= 16 where the
launch has one split since session 23), for fp8 caches only (a bf16
cache has no such path). Each pass's columns are compared with
the first original of that pass (``diff``, the same inputs in both passes): where the default
pass shows diff 0 against 0.34.0, the knob pass's diff 0 means bit-identical to it too;
elsewhere equal diffs are only a hint. A variant line says which pass it is.

Writes ``triton_torch_ab.json`` to --out and prints one table per geometry and cache dtype.
Needs the GPU and the originals (QSA_ORIGINALS_DIR).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

TABLES = (None, "vllm-0.30", "vllm-0.34")
SCALES = (0.5, 2.0)


def _inputs(geo, rows, pool, seed):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    d, h = geo.head_dim, geo.num_query_heads
    kv = pool
    nb, p = kv.shape[0], kv.shape[2]
    k, v = kv.transpose(1, 2).split(d, -1)
    q = torch.randn((rows, h, d), device="cuda", generator=g).to(torch.bfloat16)
    w = 2051
    li = torch.randint(0, nb * p, (rows, w + 1), device="cuda", dtype=torch.int32, generator=g)
    li[:, -1] = w
    bt = torch.randperm(nb, device="cuda", dtype=torch.int32, generator=g)[None, :].contiguous()
    t2r = torch.zeros((rows,), device="cuda", dtype=torch.int32)
    gate = torch.randn((rows, h, d), device="cuda", generator=g).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    return (q, k, v, li, bt, t2r, False, out), gate


def _rounds(calls: dict, n: int, sync: bool, rounds: int = 7) -> dict:
    import torch

    for fn in calls.values():
        for _ in range(10):
            fn()
    torch.cuda.synchronize()
    samples = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
                if sync:
                    torch.cuda.synchronize()
            if not sync:
                torch.cuda.synchronize()  # the enqueue's samples end before this
            samples[name].append((time.perf_counter() - t0) / n * 1e6)
    return {name: statistics.median(s) for name, s in samples.items()}


def _measure(S, kernel_trace, mods, geo, pools, tp, kv, rows):
    import torch

    args, gate = _inputs(geo, rows, pools[kv], seed=rows + 7)
    extra = {} if kv == "bf16" else dict(k_scale=SCALES[0], v_scale=SCALES[1])
    calls = {}
    for version, mod in mods.items():
        if kv == "fp8" and version == "0.30.0":
            continue
        calls[f"original {version}"] = (
            lambda mod=mod: mod.qsa_sparse_paged_attention(*args, output_gate=gate, **extra))
    for table in TABLES:
        def call(table=table):
            S.set_tiling_table(table)
            return S.qsa_sparse_paged_attention(*args, output_gate=gate, implementation="triton-torch", **extra)
        # None: the shim's default table, which for a bf16 cache triton-torch turns into 0.30.0's
        # (_direct.effective_table, since session 11; call a-c's "library" bf16 columns predate it)
        calls[f"triton-torch {table or 'default'}"] = call
    ref = None
    line = dict(tp=tp, kv=kv, rows=rows, columns={})
    for name, fn in calls.items():
        args[7].fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        got = args[7].float()
        if ref is None:
            ref = got.clone()  # the first original: the rest agree to one kernel's rounding
        rel = ((got - ref).norm() / ref.norm()).item()
        s = kernel_trace.trace_runs(fn, runs=30, calls_per_run=1, wait=lambda _: torch.cuda.synchronize())
        line["columns"][name] = dict(busy_us=s and s.busy_us_per_call, by_kernel=s and s.mean_us_by_kernel,
                                     rel_diff_vs_first=rel, finite=bool(torch.isfinite(got).all()))
    n = 200 if rows <= 64 else 30
    for key, sync in (("eager_us", True), ("enqueue_us", False)):
        for name, us in _rounds(calls, n, sync).items():
            line["columns"][name][key] = us
    S.set_tiling_table(None)
    return line


def _print(line):
    cols = line["columns"]
    originals_ = [c for c in cols if c.startswith("original")]
    best_busy = min(cols[c]["busy_us"] or float("inf") for c in originals_)
    best_eager = min(cols[c]["eager_us"] for c in originals_)
    variant = line.get("variant") or ("prefetch off" if line.get("prefetch_off") else None)
    tag = f" ({variant})" if variant else ""
    for name, c in cols.items():
        xb = (c["busy_us"] or float("nan")) / best_busy
        xe = c["eager_us"] / best_eager
        print(f"| {line['rows']} | {name}{tag} | {c['busy_us'] or float('nan'):.1f} | {c['eager_us']:.1f} | "
              f"{c['enqueue_us']:.1f} | {xb:.2f} | {xe:.2f} |" + ("" if c["finite"] else " NaN!")
              + f" diff {c['rel_diff_vs_first']:.1e}", flush=True)
    print(f"  triton launches: {line.get('triton_launches')}", flush=True)


def summarize(path: str) -> int:
    """One line per case of ``path``: the default route's split kernel against the original's
    (0.30.0's for bf16, 0.34.0's for fp8), busy and eager ratios, difference from the first."""
    import json

    with open(path) as f:
        lines = json.load(f)
    for e in lines:
        c = e["columns"]
        base = c["original 0.30.0"] if e["kv"] == "bf16" else c["original 0.34.0"]
        tt = c["triton-torch default"]

        def split(col):
            return next((v for k, v in col["by_kernel"].items() if "split" in k), float("nan"))
        variant = e.get("variant") or ("prefetch off" if e.get("prefetch_off") else None)
        print(f'{e["tp"]} {e["kv"]} {e["rows"]}{f" ({variant})" if variant else ""}: split {split(tt):.1f} vs original {split(base):.1f} us, '
              f'busy x{tt["busy_us"] / base["busy_us"]:.2f}, eager x{tt["eager_us"] / base["eager_us"]:.2f}, '
              f'diff {tt["rel_diff_vs_first"]:.1e}')
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8,64,512,2048")
    ap.add_argument("--tp", default="TP1,TP4")
    ap.add_argument("--kv", default="bf16,fp8")
    ap.add_argument("--out", default=None)
    ap.add_argument("--prefetch-on", action="store_true")
    ap.add_argument("--f16-dot", choices=("on", "off"), default=None)
    ap.add_argument("--summarize", metavar="JSON", default=None,
                    help="print one line per case of a written triton_torch_ab.json (split kernel, busy and "
                         "eager ratios of the default route against the case's original) and exit")
    a = ap.parse_args()
    if a.summarize:
        return summarize(a.summarize)

    import torch

    import qsa_torch_shim as S
    from bench import kernel_trace, records
    from qsa_jax import arg_specs, config
    from qsa_jax.ops.sparse_attention import triton as jt
    from qsa_torch_shim import _direct
    from qsa_torch_shim import _private_api as P

    # Each pass: its name (None: the defaults) and the config functions it replaces.
    passes = [(None, {})]
    if a.prefetch_on:
        passes.append(("prefetch on", dict(triton_prefetch=lambda *_: True)))
    if a.f16_dot:
        on = a.f16_dot == "on"
        passes.append((f"fp16 q.K^T {a.f16_dot}", dict(triton_fp8_keys_f16_dot=lambda *_, on=on: on)))
    defaults = {name: getattr(config, name) for _, knobs in passes for name in knobs}

    def set_pass(knobs: dict):
        for name, default in defaults.items():
            setattr(config, name, knobs.get(name, default))
        _direct._SIGNATURES.clear()  # plans (and their cached launches) hold the knobs
        jt._launch_plan.cache_clear()
    from qsa_testing import originals

    mods = {v: originals.load(v) for v in ("0.30.0", "0.34.0")}
    results = []
    for tp in a.tp.split(","):
        geo = arg_specs.GEOMETRIES[tp]
        nb = 512
        base = torch.randn((nb, geo.num_kv_heads, geo.page_size, 2 * geo.head_dim), device="cuda")
        pools = {"bf16": base.to(torch.bfloat16), "fp8": (base * 2).to(torch.float8_e4m3fn)}
        for kv in a.kv.split(","):
            print(f"\n{tp} {kv}: busy µs per call (kernels) | eager call + sync µs | host enqueue µs; "
                  "x = over the faster original's busy / eager", flush=True)
            print("| rows | column | busy | eager | enqueue | x busy | x eager |")
            print("|---|---|---|---|---|---|---|")
            for rows in (int(r) for r in a.rows.split(",")):
                for variant, knobs in passes:
                    if variant and variant.startswith("fp16 q.K^T") and kv != "fp8":
                        continue
                    set_pass(knobs)
                    P.TRITON_PATHS.reset()
                    line = _measure(S, kernel_trace, mods, geo, pools, tp, kv, rows)
                    line.update(variant=variant, triton_launches=dict(fast=P.TRITON_PATHS.fast, jit=P.TRITON_PATHS.jit,
                                                                      reason=P.TRITON_PATHS.last_reason))
                    _print(line)
                    results.append(line)
                set_pass({})
                records.dump_json(a.out, "triton_torch_ab.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
