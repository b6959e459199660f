"""One call of vLLM 0.30.0's sparse attention and of the shim's triton-torch route on the same
inputs, for a profiler to look at (GPU).

    python3 tools/split_kernel_probe.py [--tp TP4] [--rows 512] [--pages 512,4000] [--calls 2]

Why (session 13): at TP4 512 rows on 0.30.0's tiling (block_n 64, 4 splits, 2 warps) the
jax-triton split kernel took 374 µs against 0.30.0's 268 µs for the same bits (session 13
call b, uniformly random tokens over a 512-page pool, 34 MB at TP4: inside the H200's L2),
although both compile for sm_90 to the same registers, shared memory and tile loop on the
CPU (``tools/sm90_split_kernel_ab.py``). Run under Nsight Compute (``ncu -k regex:...``), this
gives each kernel's launch statistics, occupancy and memory traffic; ``--pages`` repeats the
pair on a pool of each size (512 pages: in L2; 4000: 262 MB at TP4, not), printing the busy
time per call of each kernel from a profiler trace first (``bench.kernel_trace``) unless
``--no-trace`` (under ncu). ``--jax`` adds qsa_jax's ``implementation="triton"`` called through
JAX at 0.30.0's tiling (``jax_triton.triton_call`` compiles its own specialisation; the kernel
trace then also holds the result's copy into torch, a few µs).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from triton_torch_ab import _inputs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", default="TP4")
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--pages", default="512,4000")
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--no-trace", action="store_true")
    ap.add_argument("--jax", action="store_true", help="also qsa_jax's 'triton' through JAX at 0.30.0's tiling")
    a = ap.parse_args()

    import torch

    import qsa_torch_shim as S
    from bench import kernel_trace
    from qsa_jax import arg_specs
    from qsa_testing import originals

    orig = originals.load("0.30.0")
    geo = arg_specs.GEOMETRIES[a.tp]
    d, w = geo.head_dim, 2051
    for nb in (int(p) for p in a.pages.split(",")):
        kv = torch.randn((nb, geo.num_kv_heads, geo.page_size, 2 * d), device="cuda",
                         generator=torch.Generator(device="cuda").manual_seed(nb)).to(torch.bfloat16)
        # triton_torch_ab's inputs: one request, W = 2051 uniformly random tokens per row
        (q, k, v, li, bt, t2r, _, _), gate = _inputs(geo, a.rows, kv, seed=nb)
        outs = {}
        calls = {
            "original 0.30.0": lambda out: orig.qsa_sparse_paged_attention(
                q, k, v, li, bt, t2r, False, out, output_gate=gate),
            "triton-torch": lambda out: S.qsa_sparse_paged_attention(
                q, k, v, li, bt, t2r, False, out, output_gate=gate, implementation="triton-torch"),
        }
        if a.jax:  # qsa_jax's "triton" through JAX (jax_triton.triton_call) at 0.30.0's tiling
            import jax
            import qsa_jax

            cfg = tuple(qsa_jax.select_config(a.rows, geo.num_kv_heads, False, w, table="vllm-0.30"))
            jargs = [jax.dlpack.from_dlpack(x) for x in (q, kv, li, bt, t2r, gate)]
            fn = jax.jit(lambda *x: qsa_jax.sparse_attention(*x, use_prefill_config=False, config=cfg,
                                                             implementation="triton"))

            def via_jax(out, fn=fn, jargs=jargs):
                out.copy_(torch.from_dlpack(jax.block_until_ready(fn(*jargs))))
            calls["jax triton"] = via_jax
        for name, fn in calls.items():
            out = torch.full_like(q, float("nan"))
            for _ in range(a.calls):
                fn(out)
            torch.cuda.synchronize()
            outs[name] = out.float()
            if not a.no_trace:
                s = kernel_trace.trace_runs(lambda: fn(out), runs=30, calls_per_run=1,
                                            wait=lambda _: torch.cuda.synchronize())
                print(f"{a.tp} rows={a.rows} pages={nb} {name}: busy {s.busy_us_per_call:.1f} us "
                      f"{ {k_: round(v_, 1) for k_, v_ in s.mean_us_by_kernel.items()} }", flush=True)
        ref = outs["original 0.30.0"]
        for name, got in outs.items():
            if name != "original 0.30.0":
                print(f"  pages={nb} {name}: relative difference {((got - ref).norm() / ref.norm()).item():.1e}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
