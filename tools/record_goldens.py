"""Record golden files from the Triton originals (needs a CUDA GPU and torch).

    python tools/record_goldens.py [--out tests/golden]

Builds the cases of ``golden_cases()`` (deterministic), runs vLLM 0.30.0's
operators on them and saves inputs and outputs as compressed npz files, one
per operator, plus ``manifest.json`` naming the card, driver, versions and
date.

Unreferenced cache rows are poisoned before the originals run
(``cases.poison_unreferenced``: K scaled up, V NaN), so the goldens also prove
that nothing reads them: a stray read turns an output NaN or visibly wrong.
The poison draws no random numbers, so every case's referenced values (and so
its expected output) are the same as under the earlier all-NaN poison.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import subprocess
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from qsa_jax.arg_specs import INDEXER_RING, INDEXER_RING_SPECULATIVE  # noqa: E402
from qsa_testing import cases as C  # noqa: E402
from qsa_testing.golden_cases import (  # noqa: E402,F401  (re-exported for tests)
    V034_CASES, V034_KINDS, V034_SCALES, sha256, sparse_golden_cases, v034_cache)
from qsa_testing.torch_interop import to_numpy as _numpy, to_torch as _torch  # noqa: E402


def compress_golden_cases() -> list[C.CompressCase]:
    rng = np.random.default_rng(7)
    out = []
    for ring in (INDEXER_RING, INDEXER_RING_SPECULATIVE):
        for rope in (True, False):
            tag = f"s{ring}_{'rope' if rope else 'norope'}"
            out.append(C.compress_case(rng, name=f"decode_{tag}", chunk_lens=[1] * 9, ring=ring,
                                       with_rope=rope))
            out.append(C.compress_case(rng, name=f"prefill_{tag}", chunk_lens=[37, 5, 1, 80, 2],
                                       ring=ring, with_rope=rope))
            out.append(C.compress_case(rng, name=f"edge_{tag}", chunk_lens=[3, 9, 1, 30, 2, 7],
                                       ring=ring, with_rope=rope, edge=True))
    out.append(C.compress_case(rng, name="big_positions", chunk_lens=[4, 6], with_rope=True,
                               position_base=2**31 - 200))
    out.append(C.compress_case(rng, name="empty", chunk_lens=[0, 0], with_rope=True))
    return out


def store_golden_cases() -> list[C.StoreCase]:
    rng = np.random.default_rng(11)
    return [
        C.store_case(rng, name="indexer_bf16", n=77, pages=6, page_size=16),
        C.store_case(rng, name="indexer_3d", n=20, pages=3, page_size=8, three_d=True),
        C.store_case(rng, name="fp32_rows_into_bf16", n=33, pages=4, page_size=16,
                     rows_dtype=np.float32),
        C.store_case(rng, name="all_invalid", n=9, pages=2, page_size=4, invalid_fraction=1.0),
        C.store_case(rng, name="empty", n=0, pages=2, page_size=4),
    ]


# ------------------------------------------------------------------------------


def run_original_sparse(orig, case: C.SparseAttentionCase, device="cuda", kv_cache=None, scales=()):
    import torch

    kv = _torch(case.kv_cache if kv_cache is None else kv_cache, device)
    d = case.head_dim
    k_cache, v_cache = kv.transpose(1, 2).split(d, dim=-1)  # vLLM's strided views
    out = torch.full_like(_torch(case.q, device), float("nan"))  # poison: every element must be written
    res = orig.qsa_sparse_paged_attention(
        _torch(case.q, device), k_cache, v_cache, _torch(case.logical_indices, device),
        _torch(case.block_table, device), _torch(case.token_to_req, device),
        case.use_prefill_config, out, *scales, output_gate=_torch(case.output_gate, device))
    torch.cuda.synchronize()
    return _numpy(res)


def run_original_compress(orig, case: C.CompressCase, device="cuda"):
    import torch

    t = {k: _torch(v, device) for k, v in case.arrays().items()}
    pooled, first = orig.qsa_compress_groups_with_ratio(
        t["raw_keys"], t["raw_positions"], t["compressor_state_cache"],
        t["compressor_state_block_table"], t["token_to_req"], t["query_start_loc"],
        t["logical_positions"], t["compressed_slots"], case.compress_ratio, t.get("rope_cache"))
    torch.cuda.synchronize()
    return _numpy(pooled), _numpy(first)


def run_original_store(orig, case: C.StoreCase, device="cuda"):
    import torch

    cache = _torch(case.cache, device)
    orig.qsa_store_cache_rows(cache, _torch(case.slot_mapping, device), _torch(case.rows, device))
    torch.cuda.synchronize()
    return _numpy(cache)


def _pack(prefix: str, arrays: dict, into: dict):
    for k, v in arrays.items():
        if v is None:
            continue
        if v.dtype == C.BF16:  # npz has no bf16: store the bit pattern
            into[f"{prefix}/{k}@bf16"] = v.view(np.uint16)
        else:
            into[f"{prefix}/{k}"] = v


def environment() -> dict:
    import torch
    import triton

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    return {
        "card": torch.cuda.get_device_name(), "nvidia_smi": smi,
        "date": datetime.date.today().isoformat(), "torch": torch.__version__,
        "triton": triton.__version__, "python": platform.python_version(),
        "originals": "vllm==0.30.0 vllm/models/qwen4_exp/nvidia/ops/qsa.py",
    }


def main():
    from qsa_testing import originals

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/golden")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    orig = originals.load()
    manifest = {"environment": environment(), "sparse_attention": [], "compress_groups": [],
                "store_cache_rows": []}

    data = {}
    for case in sparse_golden_cases():
        res = run_original_sparse(orig, case)
        assert not np.isnan(res.astype(np.float32)).any(), f"{case.name}: NaN in the originals' output"
        cfg = case.config()
        # The cache pages are not stored: qsa_testing.golden rebuilds them and checks the digest.
        arrays = {k: v for k, v in case.arrays().items() if k != "kv_cache"}
        _pack(case.name, {**arrays, "expected_out": res}, data)
        data[f"{case.name}/use_prefill_config"] = np.array(case.use_prefill_config)
        manifest["sparse_attention"].append({"name": case.name, "config": list(cfg),
                                             "shape": list(case.q.shape),
                                             "width": case.selection_width,
                                             "kv_sha256": sha256(case.kv_cache)})
        print(f"sparse {case.name:32s} q={case.q.shape} W={case.selection_width} cfg={tuple(cfg)}")
    np.savez_compressed(out / "sparse_attention.npz", **data)


    data = {}
    for case in compress_golden_cases():
        pooled, first = run_original_compress(orig, case)
        _pack(case.name, {**case.arrays(), "expected_pooled": pooled, "expected_first": first}, data)
        data[f"{case.name}/compress_ratio"] = np.array(case.compress_ratio)
        manifest["compress_groups"].append({"name": case.name, "rows": int(case.raw_keys.shape[0])})
        print(f"compress {case.name:24s} rows={case.raw_keys.shape[0]}")
    np.savez_compressed(out / "compress_groups.npz", **data)

    data = {}
    for case in store_golden_cases():
        res = run_original_store(orig, case)
        _pack(case.name, {**case.arrays(), "expected_cache": res}, data)
        manifest["store_cache_rows"].append({"name": case.name, "rows": int(case.slot_mapping.size)})
        print(f"store {case.name:24s} n={case.slot_mapping.size}")
    np.savez_compressed(out / "store_cache_rows.npz", **data)

    # vLLM 0.34.0 last: its files join the 0.30.0 set (compress/store are unchanged in 0.34).
    orig034 = originals.load("0.34.0")
    manifest["environment"]["originals_v034"] = "vllm==0.34.0 vllm/models/qwen4_exp/nvidia/ops/qsa.py"
    manifest["sparse_attention_v034"] = []
    data = {}
    by_name = {case.name: case for case in sparse_golden_cases()}
    for base_name in V034_CASES:
        case = by_name[base_name]
        for kind in V034_KINDS:
            name = f"{base_name}_{kind}"
            cache = v034_cache(case, kind)
            res = run_original_sparse(orig034, case, kv_cache=cache, scales=V034_SCALES)
            assert not np.isnan(res.astype(np.float32)).any(), f"{name}: NaN in 0.34.0's output"
            # The tiling 0.34.0 chose on this card (its table depends on the capability).
            cfg = orig034._select_config(case.q.shape[0], case.num_kv_heads, case.use_prefill_config,
                                         case.selection_width, kind != "bf16")
            # Inputs are those of the 0.30.0 case ``base_name`` (the cache in ``kind``'s storage):
            # only the output is stored; qsa_testing.golden rebuilds and checks the cache.
            _pack(name, {"expected_out": res}, data)
            manifest["sparse_attention_v034"].append(
                {"name": name, "base": base_name, "kv": kind, "k_scale": V034_SCALES[0],
                 "v_scale": V034_SCALES[1], "config": [int(x) for x in cfg], "shape": list(case.q.shape),
                 "width": case.selection_width, "kv_sha256": sha256(cache)})
            print(f"sparse 0.34 {name:36s} q={case.q.shape} cfg={tuple(cfg)}")
    np.savez_compressed(out / "sparse_attention_v034.npz", **data)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for f in sorted(out.iterdir()):
        print(f"{f.name}: {f.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
