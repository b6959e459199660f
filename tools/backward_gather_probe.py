"""How fast can the inverted backward's dK/dV kernel gather what it needs? (issue 16)

    python tools/backward_gather_probe.py [--tp TP1] [--rows 1024] [--out DIR]   # GPU
    python tools/backward_gather_probe.py --small                                # CPU check

The Pallas backward's dK/dV kernel (``backward_pallas._inverted_kernel``, order
"inverted") walks, per block of 16 cache slots and KV head, the rows that select the
block, ``lanes`` (row, query head) pairs at a time, and gathers each pair's q and dA
(bf16 [D] each), its multiplicities, LSE and delta: at TP1, 1024 rows, about 12 GB per
call from a 25 MB working set (notes/backward.md, "Session 15"). This tool times, on the
benchmark's own selections and the kernel's own inverse index, the kernel itself and a
probe kernel that makes exactly the same gathers in the same order and only sums them
(no dots, no stores but one [D] row per program), at several lane counts and warps. Compiled
for sm_90 on the CPU machine (Triton 3.6, ptxas): lanes 32 / 2 warps 128 registers, 64 / 4
warps 96, no spills (the kernel itself: 255 registers and 8-28 bytes of spills at 2 warps).

Prediction (notes/backward.md): if the probe takes about as long as the kernel, the
kernel is bound by its gathers and the 2.5x target needs fewer gathered bytes, not
better dots; if the probe is much faster, the time goes elsewhere (dots, the loop's
dependent loads) and the kernel has headroom.

``--small``: reduced sizes, and the probe's sums checked against NumPy first (the probe
gathers what the kernel's index names); on CPU everything runs in Pallas interpret mode
and the busy-time columns stay empty (tests/test_tools.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qsa_jax.ops._pallas_support import interpret, pl, plgpu  # noqa: E402
from qsa_jax.ops.sparse_attention import backward_pallas as bp  # noqa: E402
from qsa_jax.ops.sparse_attention.base import check_sparse_attention_args  # noqa: E402

BLOCK_ROWS = 16  # the kernel's default slots per block (backward_pallas.INVERTED_BLOCK_ROWS)


def _probe_kernel(q_ref, starts_ref, ref_rows_ref, counts_ref, da_ref, delta_ref, lse_ref, out_ref, *,
                  p, lanes: int, block_rows: int):
    """The dK/dV kernel's lane walk with its gathers only: per step the lanes' q and dA rows
    ([lanes, D] bf16), multiplicities ([lanes, BR]), LSE and delta, summed into one [D] fp32
    row per (block, KV head) program (so nothing is dead code). The rows are summed by a dot
    with a [16, lanes] mask, like the kernel's own dots (an fp32 [lanes, D] sum spilled)."""
    d, g, heads = p.head_dim, p.group_size, p.num_query_heads
    block, head = pl.program_id(0), pl.program_id(1)
    start, end = starts_ref[block], starts_ref[block + 1]
    pairs = (end - start) * g
    lane = lax.broadcasted_iota(jnp.int32, (lanes,), 0)
    slots = lax.broadcasted_iota(jnp.int32, (block_rows,), 0)

    def body(step, carry):
        rows_sum, scalars = carry
        pair = step * lanes + lane
        ok = pair < pairs
        pair = jnp.minimum(pair, pairs - 1)
        ref, j = start + pair // g, pair % g
        row = ref_rows_ref[ref]
        q = q_ref[p.queries.row(row, head * g + j), :]  # [M, D] bf16
        flat = row * heads + head * g + j
        da = da_ref[flat, :]  # [M, D] bf16
        times = counts_ref[ref[:, None], slots[None, :]]  # [M, BR]
        lane_sum = jnp.sum(times.astype(jnp.float32), axis=1) + lse_ref[flat] + delta_ref[flat]
        mask = jnp.broadcast_to(ok[None, :], (16, lanes)).astype(jnp.bfloat16)  # [16, M]
        rows_sum = (rows_sum + jnp.dot(mask, q, preferred_element_type=jnp.float32)
                    + jnp.dot(mask, da, preferred_element_type=jnp.float32))  # [16, D], rows alike
        return rows_sum, scalars + jnp.sum(jnp.where(ok, lane_sum, 0.0))

    zero = (jnp.zeros((16, d), jnp.float32), jnp.float32(0))
    rows_sum, scalars = lax.fori_loop(0, (pairs + lanes - 1) // lanes, body, zero)
    out_ref[block * p.num_kv_heads + head, :] = jnp.sum(rows_sum, axis=0) * (1 / 16) + scalars


def probe(p, q, index, da16, delta, lse, *, lanes: int, num_warps: int, block_rows: int = BLOCK_ROWS):
    """[blocks * Hk, D] fp32: per (block, KV head) the sum over its lanes (see ``_probe_kernel``)."""
    starts, ref_rows, counts = index
    blocks = starts.shape[0] - 1
    kernel = functools.partial(_probe_kernel, p=p, lanes=lanes, block_rows=block_rows)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((blocks * p.num_kv_heads, p.head_dim), jnp.float32),
        grid=(blocks, p.num_kv_heads),
        in_specs=[pl.no_block_spec] * 7,
        out_specs=pl.no_block_spec,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=2),
        interpret=interpret(),
        name="qsa_backward_gather_probe",
    )(q.reshape(-1, p.head_dim), starts, ref_rows, counts, da16, delta, lse)


def probe_reference(p, q, index, da16, delta, lse) -> np.ndarray:
    """``probe``'s result in NumPy (float64), from the index as the kernel reads it."""
    starts, ref_rows, counts = (np.asarray(x) for x in index)
    g, heads, hk = p.group_size, p.num_query_heads, p.num_kv_heads
    qf = np.asarray(q, np.float64).reshape(-1, heads, p.head_dim)
    daf = np.asarray(da16, np.float64).reshape(-1, heads, p.head_dim)
    lse_f, delta_f = (np.asarray(x, np.float64).reshape(-1, heads) for x in (lse, delta))
    out = np.zeros((len(starts) - 1, hk, p.head_dim))
    for b in range(len(starts) - 1):
        for r in range(starts[b], starts[b + 1]):
            row, n = ref_rows[r], counts[r].astype(np.float64).sum()
            for h in range(hk):
                js = slice(h * g, (h + 1) * g)
                out[b, h] += (qf[row, js] + daf[row, js]).sum(axis=0)
                out[b, h] += (n + lse_f[row, js] + delta_f[row, js]).sum()  # the scalars, on every column
    return out.reshape(-1, p.head_dim)


def build(tp: str, rows: int, small: bool, seed: int = 0):
    """The benchmark's inputs (bench.inputs: its pool, one request per row, its selections) and
    what the dK/dV kernel reads: (problem, q, kv rows, compaction, acc rows, index, dA, delta, LSE)."""
    from bench import inputs

    geo = inputs.geometry(tp, cpu=small, pool_gb=0.002 if small else 1.0)
    _, kv = inputs.make_pool(geo, gpu=False, seed=3)
    inp = inputs.sparse_inputs(geo, rows, 1, seed=rows)
    li = inp.idx[0]
    p = check_sparse_attention_args(inp.q, kv, li, inp.block_table, inp.token_to_req, inp.gate,
                                    use_prefill_config=False, config=None)
    kvl = p.kv
    compaction = bp.named_pages(p, inp.block_table)
    acc_rows = kvl.num_rows if compaction is None else compaction[0].shape[0] * (kvl.num_rows // kvl.num_pages)

    @jax.jit
    def index_of(li, bt, t2r):
        _, acc, _ = bp.entry_lists(p, li, bt, t2r, "selection", compaction)
        return acc, bp.inverted_index(p, acc, acc_rows // kvl.num_kv_heads, BLOCK_ROWS)

    acc, index = index_of(li, inp.block_table, inp.token_to_req)
    key = jax.random.key(seed)
    n = rows * p.num_query_heads
    da16 = jax.random.normal(key, (n, p.head_dim), jnp.float32).astype(jnp.bfloat16)
    delta = jax.random.normal(jax.random.fold_in(key, 1), (n,), jnp.float32)
    lse = 4.0 + jax.random.normal(jax.random.fold_in(key, 2), (n,), jnp.float32)
    k_rows = kv.reshape(kvl.num_rows, 2 * p.head_dim)
    return p, inp.q, k_rows, compaction, acc, acc_rows, index, da16, delta, lse


def gathered_bytes(p, index) -> dict:
    """Bytes the lane walk gathers per call, as each lane loads them: its q and dA rows (bf16),
    its reference's row number (int32) and multiplicities ([BR]), its LSE and delta (fp32).
    Not counted (the kernel makes them, the probe does not): each program's [BR] K/V rows,
    read once (about 1 GB at TP1 1024 rows), and its dK|dV rows, written once (as many)."""
    starts, _, counts = index
    refs = int(starts[-1]) * p.num_kv_heads  # every KV head walks every block's references
    pairs = refs * p.group_size
    qda = pairs * p.head_dim * 2 * 2
    other = pairs * (4 + counts.shape[1] * counts.dtype.itemsize + 4 + 4)
    return {"references": refs, "lane_pairs": pairs, "q_dA_bytes": qda, "total_bytes": qda + other}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", default="TP1")
    ap.add_argument("--rows", type=int, default=None, help="default: 1024 on GPU, 4 with --small")
    ap.add_argument("--variants", default="32:2,32:4,64:2,64:4",
                    help="comma-separated lanes:warps of the probe")
    ap.add_argument("--small", action="store_true", help="reduced sizes; check the probe against NumPy")
    ap.add_argument("--out", help="folder for gather_probe.json and gather_probe.md")
    a = ap.parse_args(argv)
    rows = a.rows or (4 if a.small else 1024)
    p, q, k_rows, compaction, acc, acc_rows, index, da16, delta, lse = build(a.tp, rows, a.small)
    model = gathered_bytes(p, index)
    print(json.dumps({"tp": a.tp, "rows": rows, **model}), flush=True)
    variants = [tuple(int(x) for x in v.split(":")) for v in a.variants.split(",") if v]
    if a.small:
        want = probe_reference(p, q, index, da16, delta, lse)
        for lanes, warps in variants[:2]:
            got = np.asarray(probe(p, q, index, da16, delta, lse, lanes=lanes, num_warps=warps))
            err = float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))
            print(f"probe lanes {lanes} warps {warps}: max relative difference from NumPy {err:.2e}")
            if not err < 1e-5:
                return 1

    from bench import kernel_trace

    def busy(fn, *args, name):
        compiled = jax.jit(fn).lower(*args).compile()
        jax.block_until_ready(compiled(*args))
        trace = kernel_trace.trace_runs(lambda: compiled(*args), runs=5, calls_per_run=1,
                                        wait=jax.block_until_ready)
        return trace.mean_us_by_kernel.get(name) if trace else None

    results = []
    kernel_us = busy(lambda q, k, acc, da, de, ls: bp._inverted_dkv(
        p, q, k, k, acc, compaction, acc_rows, da, de, ls, (), jnp.bfloat16, BLOCK_ROWS, bp.INVERTED_LANES,
        None, interpret()), q, k_rows, acc, da16, delta, lse, name="qsa_sparse_attention_backward_inverted")
    results.append({"what": f"dK/dV kernel (lanes {bp.INVERTED_LANES}, warps {bp.INVERTED_WARPS})",
                    "busy_us": kernel_us})
    for lanes, warps in variants:
        us = busy(functools.partial(probe, p, lanes=lanes, num_warps=warps), q, index, da16, delta, lse,
                  name="qsa_backward_gather_probe")
        results.append({"what": f"gather probe (lanes {lanes}, warps {warps})", "busy_us": us})
    lines = [f"# dK/dV gathers, {a.tp} {rows} rows, {jax.devices()[0].device_kind}", "",
             f"{model['references']:,} (row, 16-slot block, KV head) references, {model['lane_pairs']:,} "
             f"lanes; gathered per call: q and dA {model['q_dA_bytes'] / 1e9:.2f} GB, all "
             f"{model['total_bytes'] / 1e9:.2f} GB.", "",
             "| kernel | busy µs | gathered TB/s |", "|---|---|---|"]
    for r in results:
        us = r["busy_us"]
        rate = f"{model['total_bytes'] / (us * 1e-6) / 1e12:.2f}" if us else "-"
        lines.append(f"| {r['what']} | {us:.1f} | {rate} |" if us else f"| {r['what']} | - | - |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gather_probe.json").write_text(json.dumps({"model": model, "results": results}, indent=1))
        (out / "gather_probe.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
