"""The main job: on a GPU the cross-framework benchmark, on CPU a reduced demo.

    python tools/demo.py            # what tools/demo.sh runs
    python tools/demo.py --cpu      # force the CPU demo

The CPU demo builds realistic inputs at the TP1 head geometry of
Qwen3.8-Flash-Next (24 query heads, 2 KV heads, D = 256) with a reduced page
size and selection width, runs every implementation that can run here
(interpret-mode Pallas included), and prints agreement with the float64
oracle and timings. It is not a GPU measurement and says so.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import qsa_jax  # noqa: E402
from qsa_jax import arg_specs  # noqa: E402
from qsa_testing import cases as C  # noqa: E402
from qsa_testing import oracle  # noqa: E402
from qsa_testing.agreement import fidelity  # noqa: E402


def has_gpu() -> bool:
    return any(d.platform == "gpu" for d in jax.devices())


def cpu_demo(rows_list=(1, 8, 64), width_blocks=64, page_size=64) -> int:
    g = arg_specs.TP1
    print("qsa-jax CPU demo — NOT a GPU measurement: JAX runs on the host CPU at a reduced size")
    print(f"geometry {g.name}: H={g.num_query_heads} Hk={g.num_kv_heads} D={g.head_dim}; "
          f"reduced: page size {page_size} (real {g.page_size}), "
          f"W={4 * width_blocks + 3} (real {arg_specs.SELECTION_WIDTH})")
    rng = np.random.default_rng(int(time.time()))
    failures = 0
    header = f"{'rows':>5} {'impl':8} {'config':22} {'rel err vs oracle':>18} {'first call s':>13} {'steady ms':>10}"
    print(header)
    print("-" * len(header))
    for rows in rows_list:
        case = C.sparse_attention_case(
            rng, rows=rows, num_query_heads=g.num_query_heads, num_kv_heads=g.num_kv_heads,
            head_dim=g.head_dim, page_size=page_size, selection_blocks=width_blocks,
            context_tokens=4 * width_blocks * 4, num_requests=max(1, rows // 4))
        C.poison_unreferenced(case)  # large K, NaN V wherever no valid entry reads
        cfg = case.config()
        k, v = case.split_caches()
        ref = oracle.sparse_attention_oracle(
            case.q, k, v, case.logical_indices, case.block_table, case.token_to_req,
            case.output_gate, block_n=cfg.block_n, num_tiles=cfg.num_tiles, num_splits=cfg.num_splits)
        args = [jax.device_put(x) for x in (case.q, case.kv_cache, case.logical_indices,
                                            case.block_table, case.token_to_req, case.output_gate)]
        for impl in qsa_jax.available_implementations("sparse_attention"):
            if impl == "pallas" and rows > 8:
                continue  # the interpreter is slow; the GPU runs the real kernel
            t0 = time.perf_counter()
            # The oracle's tiling, explicitly: the default elsewhere may be a measured table's.
            out = qsa_jax.sparse_attention(*args, config=cfg, implementation=impl).block_until_ready()
            first = time.perf_counter() - t0
            reps = 3
            t0 = time.perf_counter()
            for _ in range(reps):
                out = qsa_jax.sparse_attention(*args, config=cfg, implementation=impl)
            out.block_until_ready()
            steady = (time.perf_counter() - t0) / reps * 1e3
            check = fidelity(np.asarray(out), ref)  # same tiling as the oracle: fidelity
            err, ok = check["rel_err"], check["ok"]
            failures += not ok
            label = "pallas-i" if impl == "pallas" else impl  # the Pallas interpreter, not a kernel
            print(f"{rows:5d} {label:8} {str(tuple(cfg)):22} {err:18.2e} {first:13.2f} {steady:10.2f}"
                  f"{'' if ok else '  FAIL'}")
    print("\npallas-i = Pallas in interpret mode (a CPU emulation of the kernel: correct, not fast).")
    print("Correctness (fidelity): relative Frobenius error <= 3e-4 vs the float64 oracle of the same "
          "tiling, <= 1% of elements more than one bf16 ulp off, no NaN (unreferenced cache rows "
          "hold NaN V).")
    print("For speed, run this on a CUDA GPU: it then runs the benchmark (bench/run.py).")
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="run the CPU demo even when a GPU is present")
    args, rest = ap.parse_known_args()
    if args.cpu:  # before any backend starts: every array and kernel on the host
        jax.config.update("jax_platforms", "cpu")
    elif has_gpu():
        from bench import run as bench_run

        return bench_run.main(rest)
    return cpu_demo()


if __name__ == "__main__":
    sys.exit(main())
