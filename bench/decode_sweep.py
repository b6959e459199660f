"""GPU busy time of the sparse-attention call's launch knobs at decode sizes.

    python -m bench.decode_sweep [--cases TP1:1,TP4:1,TP1:4] [--impl pallas|triton]
                                 [--kv bf16|fp8] [--variants all|merge] [--n-calls 10] [--out FILE]

Every variant keeps the tiling (block_n, tiles, splits: the numerics) and changes
only how it is launched (``launch=qsa_jax.PallasLaunch(...)`` or ``TritonLaunch`` of the
public call, for ``--impl``): the split kernel's warps, the merge's D chunk and warps
(``--variants merge``: the merge's alone). ``--kv fp8`` runs an e4m3 cache with scales.
Each is timed by a profiler trace (``bench.kernel_trace``: the sum of the GPU's
kernel durations per call; wall clocks at these sizes measure XLA's launcher) in
one process on the same inputs, with the default first. Whether each variant's
output has the default's bits is reported: the arithmetic is the same, but
another warp count or block shape can change how Triton associates a reduction
(the split warps change the dot layouts; the merge's block shape its sum over
splits), which moves last bits. Where the bits differ, the variant is held to the
fidelity contract (``qsa_testing.agreement``) against the default's output, which the
GPU parity tests hold to the originals and exact attention: "NO (rel 1.2e-06, ok)".
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

# (split warps or None = default, merge block_d or None, merge warps or None)
VARIANTS = ((None, None, None), (2, None, None), (8, None, None), (None, 32, None), (None, 32, 4),
            (None, 64, 1), (None, 64, 4), (None, 128, 2), (None, 256, 2))
# The split merge's layouts alone: D in 32 / 64 / 128-wide chunks or whole (one program per
# (row, head), as the originals' merge), at 1, 2 and 4 warps (1 warp since session 30).
MERGE_VARIANTS = ((None, None, None), (None, 32, 1), (None, 64, 1), (None, 64, 2), (None, 64, 4),
                  (None, 128, 1), (None, 128, 2), (None, 128, 4), (None, 256, 1), (None, 256, 2),
                  (None, 256, 4))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="TP1:1,TP4:1,TP1:4")
    ap.add_argument("--n-calls", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3, help="runs of the chain under the profiler")
    ap.add_argument("--impl", choices=("pallas", "triton"), default="pallas")
    ap.add_argument("--kv", choices=("bf16", "fp8"), default="bf16")
    ap.add_argument("--variants", choices=("all", "merge"), default="all")
    ap.add_argument("--out")
    a = ap.parse_args()

    import qsa_jax
    from bench import inputs, kernel_trace, report
    from bench.timing import sequential_calls
    from qsa_testing.agreement import fidelity

    gpu = jax.default_backend() == "gpu"
    n = a.n_calls
    fp8 = a.kv == "fp8"
    launch_type = qsa_jax.PallasLaunch if a.impl == "pallas" else qsa_jax.TritonLaunch
    scales = dict(k_scale=0.5, v_scale=2.0) if fp8 else {}
    lines = ["| where | kv | rows | tiling | split warps | merge block_d | merge warps | busy µs/call "
             "| kernels: mean µs | same bits as default |", "|" + "---|" * 10]
    for case in a.cases.split(","):
        tp, rows = case.split(":")
        rows = int(rows)
        geo = inputs.geometry(tp, cpu=not gpu, pool_gb=1.0)
        _, kv = inputs.make_pool(geo, gpu=False, seed=3, fp8=fp8)
        inp = inputs.sparse_inputs(geo, rows, n, seed=rows)
        args = (inp.q, kv, inp.block_table, inp.token_to_req, inp.gate, tuple(inp.idx))
        tiling = tuple(qsa_jax.select_config(rows, geo.num_kv_heads, False, geo.selection_width, fp8))
        default_bits = None
        for split_warps, block_d, merge_warps in (MERGE_VARIANTS if a.variants == "merge" else VARIANTS):
            if block_d is not None and geo.head_dim % block_d:
                continue
            launch = launch_type(num_warps=split_warps, merge_block_d=block_d, merge_warps=merge_warps)

            def chain(q, kv, bt, t2r, gate, idx_sets, launch=launch):
                return sequential_calls(lambda i: qsa_jax.sparse_attention(
                    q, kv, i, bt, t2r, gate, implementation=a.impl, launch=launch, **scales), idx_sets)

            fn = jax.jit(chain)
            first = np.asarray(fn(*args)[0]).view(np.uint16)
            if default_bits is None:
                default_bits = first
            summary = kernel_trace.trace_runs(lambda: fn(*args), runs=a.runs, calls_per_run=n,
                                              wait=jax.block_until_ready)
            busy = f"{summary.busy_us_per_call:.2f}" if summary else ""
            kernels = summary.describe() if summary else ""
            same = "yes"
            if not np.array_equal(first, default_bits):
                f = fidelity(first.view(jnp.bfloat16).astype(np.float32),
                             default_bits.view(jnp.bfloat16).astype(np.float32))
                same = f"NO (rel {f['rel_err']:.2g}, {'ok' if f['ok'] else 'FAILS: ' + str(f['why'])})"
            show = lambda v: "default" if v is None else str(v)  # noqa: E731
            lines.append(f"| {tp} | {a.kv} | {rows} | {tiling} | {show(split_warps)} | {show(block_d)} | "
                         f"{show(merge_warps)} | {busy} | {kernels} | {same} |")
            print(lines[-1], flush=True)
        del kv
    card = jax.devices()[0].device_kind
    text = (f"# {a.impl} decode launch knobs — {card}\n\nN = {n} calls per chain, {a.runs} traced runs; busy = "
            f"sum of kernel durations per call.\n\n" + "\n".join(lines) + "\n")
    report.print_and_write(text, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
