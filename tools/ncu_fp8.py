"""Run each sparse-attention kernel of interest a few times, for Nsight Compute to profile.

    ncu --clock-control none --kernel-name regex:... python3 tools/ncu_fp8.py [--rows 1024]

Why (notes/pallas.md, "fp8 loads on sm_90" and session 6): on the H200 the Pallas kernel
with an fp8 cache is ~1.5x slower than vLLM 0.34.0's at the same tiling while the CPU
lowering (venv Triton) shows the same loads and a similar instruction mix. On the GPU,
XLA compiles the Pallas kernel with its own bundled Triton, so only the GPU's compiled
kernel can say where the time goes: registers, local-memory (spill) traffic, occupancy,
stall reasons, DRAM throughput. Cases, TP1 shapes, fresh random inputs, the tiling
each implementation picks by default: Pallas fp8 (e4m3 bytes, k/v scales 0.5/2.0),
Pallas bf16 and 0.34.0's fp8 original on the same cache values.
"""
from __future__ import annotations

import argparse
import sys

import jax
import numpy as np
import torch

import qsa_jax
from bench import inputs
from qsa_testing import originals


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--geometry", default="TP1")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--only", default="pallas_fp8,pallas_bf16,original034_fp8")
    ap.add_argument("--config", default=None,
                    help="block_n/splits/warps for the Pallas kernels (default: the table's tiling)")
    a = ap.parse_args()
    geo = inputs.geometry(a.geometry, cpu=False, pool_gb=1.0)
    kv_bf16_t, kv_bf16 = inputs.make_pool(geo, gpu=True, seed=5)
    kv_fp8_t = kv_bf16_t.to(torch.float8_e4m3fn)
    kv_fp8 = jax.dlpack.from_dlpack(kv_fp8_t.view(torch.uint8))
    inp = inputs.sparse_inputs(geo, a.rows, 1, seed=a.rows)
    idx = inp.idx[0]
    args = (inp.q, idx, inp.block_table, inp.token_to_req, inp.gate)
    mod = originals.load("0.34.0")
    t = torch.from_dlpack
    tq, tidx, tbt, tt2r, tg = (t(x) for x in args)
    out = torch.empty_like(tq)
    d = geo.head_dim
    k8, v8 = kv_fp8_t.transpose(1, 2).split(d, -1)

    if a.config:  # same tiling as an original's launch, to compare the kernels themselves
        bn, splits, warps = (int(x) for x in a.config.split("/"))
        tiling = dict(config=(bn, warps, -(-geo.selection_width // bn), splits))
    else:
        tiling = {}

    def pallas(kv, **kw):
        return lambda: jax.block_until_ready(qsa_jax.sparse_attention(
            inp.q, kv, idx, inp.block_table, inp.token_to_req, inp.gate, implementation="pallas", **tiling, **kw))

    def original():
        mod.qsa_sparse_paged_attention(tq, k8, v8, tidx, tbt, tt2r, False, out, 0.5, 2.0, output_gate=tg)
        torch.cuda.synchronize()

    def jax_triton(kv, **kw):  # the library's jax-triton kernels at the table's launch (session 34)
        return lambda: jax.block_until_ready(qsa_jax.sparse_attention(
            inp.q, kv, idx, inp.block_table, inp.token_to_req, inp.gate, implementation="triton", **kw))

    cases = {"pallas_fp8": pallas(kv_fp8, k_scale=0.5, v_scale=2.0), "pallas_bf16": pallas(kv_bf16),
             "triton_fp8": jax_triton(kv_fp8, k_scale=0.5, v_scale=2.0), "triton_bf16": jax_triton(kv_bf16),
             "original034_fp8": original}
    for name in a.only.split(","):
        fn = cases[name]
        for _ in range(a.repeat):
            fn()
        print(f"ran {name} x{a.repeat}", flush=True)
    cfg = qsa_jax.select_config(a.rows, geo.num_kv_heads, False, geo.selection_width, True)
    print("fp8 tiling", cfg, "bf16 tiling", qsa_jax.select_config(a.rows, geo.num_kv_heads, False,
                                                                    geo.selection_width, False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
