"""First-call (compile) cost of sparse attention in a fresh process, cold or warm.

    python -m bench.compile_cost --impl pallas --cache-dir /tmp/qsa_xla --rows 3,24,96

Times, per row count, the first call (trace + lowering + compile or cache load + run)
and the second call (dispatch + run) of ``qsa_jax.sparse_attention`` at a real
geometry, with JAX's persistent compilation cache at ``--cache-dir``. Run it twice
with the same folder: the first process fills the cache (cold), the second loads
from it (warm). jax-triton compiles its Triton kernels while lowering, which JAX's
cache does not skip, so the warm ``triton`` number keeps that part.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", required=True, choices=("pallas", "triton", "xla"))
    ap.add_argument("--cache-dir", help="JAX persistent cache folder (omit: no persistent cache)")
    ap.add_argument("--rows", default="3,24,96")
    ap.add_argument("--tp", default="TP1")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    t_import = time.perf_counter()
    import jax

    import qsa_jax
    from bench import inputs

    if args.cache_dir:
        qsa_jax.enable_persistent_cache(args.cache_dir)
    gpu = jax.default_backend() == "gpu"
    geo = inputs.geometry(args.tp, cpu=not gpu, pool_gb=0.25)
    _, kv = inputs.make_pool(geo, gpu=False, seed=0)
    setup_s = time.perf_counter() - t_import
    res = {"impl": args.impl, "label": args.label, "tp": args.tp, "backend": jax.default_backend(),
           "device": str(jax.devices()[0].device_kind), "cache_dir": args.cache_dir,
           "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"), "setup_s": round(setup_s, 3),
           "rows": {}}
    for rows in [int(r) for r in args.rows.split(",")]:
        inp = inputs.sparse_inputs(geo, rows, 2, seed=rows)
        times = []
        for i in range(2):
            t0 = time.perf_counter()
            out = qsa_jax.sparse_attention(inp.q, kv, inp.idx[i], inp.block_table, inp.token_to_req,
                                           inp.gate, implementation=args.impl)
            jax.block_until_ready(out)
            times.append(time.perf_counter() - t0)
        res["rows"][rows] = {"first_s": round(times[0], 4), "second_s": round(times[1], 5)}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
