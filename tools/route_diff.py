"""Where the shim's routes differ from an original on one GPU case (a diagnosis tool).

    python3 tools/route_diff.py --tp TP2 --rows 16 [--table vllm-0.30] [--seed 28] [--version 0.30.0]

Builds the case of tests/test_shim.py's ``test_gpu_sparse_matches_original_identical_call``
(the real shapes at ``--tp``, a ~1 GB random pool, seed = rows + query heads by default), runs
the original and, at the shim's tiling table ``--table``, implementation="jax" / "pallas" /
"triton" and "triton-torch" (each twice, outputs NaN-filled first), and prints per route: the
fidelity measures against the original, NaNs, the (row, head) vectors more than 1 ulp off, and
whether its two calls agree bit for bit.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import qsa_torch_shim as S  # noqa: E402
from qsa_jax import arg_specs  # noqa: E402
from qsa_testing import cases as C  # noqa: E402
from qsa_testing import originals  # noqa: E402
from qsa_testing.agreement import bf16_ulp, fidelity  # noqa: E402
from qsa_testing.torch_interop import kv_views, random_kv_pool, to_numpy, to_torch  # noqa: E402

POOL_PAGES = {"TP1": 300, "TP2": 500, "TP4": 1000}  # tests/test_shim.py's


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", default="TP2")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--table", default="vllm-0.30")
    ap.add_argument("--version", default="0.30.0")
    ap.add_argument("--prefill", action="store_true")
    a = ap.parse_args()
    g = arg_specs.GEOMETRIES[a.tp]
    seed = a.rows + g.num_query_heads if a.seed is None else a.seed
    kv = random_kv_pool(g, POOL_PAGES[g.name], seed=7)
    case = C.sparse_attention_case(
        np.random.default_rng(seed), rows=a.rows, num_query_heads=g.num_query_heads, num_kv_heads=g.num_kv_heads,
        head_dim=g.head_dim, page_size=g.page_size, selection_blocks=512, context_tokens=65536,
        num_requests=max(1, min(a.rows, 8)), num_pages=kv.shape[0], make_cache=False)
    t = lambda x: to_torch(x, "cuda")  # noqa: E731
    k, v = kv_views(kv, g.head_dim)
    args = (t(case.q), k, v, t(case.logical_indices), t(case.block_table), t(case.token_to_req), a.prefill)
    gate = t(case.output_gate)
    orig = originals.load(a.version)
    want = to_numpy(orig.qsa_sparse_paged_attention(*args, torch.empty_like(args[0]), output_gate=gate))
    print(f"{a.tp} rows={a.rows} seed={seed} table={a.table} counts={to_numpy(t(case.logical_indices))[:, -1].tolist()}")
    S.set_tiling_table(None if a.table in ("", "None") else a.table)
    for route in ("jax", "pallas", "triton", "triton-torch"):
        outs = []
        for _ in range(2):
            out = torch.full_like(args[0], float("nan"))
            S.qsa_sparse_paged_attention(*args, out, output_gate=gate, implementation=route)
            torch.cuda.synchronize()
            outs.append(to_numpy(out))
        got = outs[0]
        res = fidelity(got, want, what=route)
        ulps = np.abs(np.nan_to_num(got.astype(np.float32)) - want.astype(np.float32)) / bf16_ulp(want)
        off = np.argwhere((ulps > 1).any(axis=-1) | np.isnan(got.astype(np.float32)).any(axis=-1))
        same = np.array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))
        print(f"{route:13s} ok={res['ok']} rel_err={res['rel_err']:.3g} ulp_frac={res['ulp_fraction']:.3g} "
              f"max_ulps={res['max_ulps']:.3g} nan={res['nan']} repeat_bits_equal={same} "
              f"vectors_off={len(off)} first={off[:8].tolist()} why={res['why']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
