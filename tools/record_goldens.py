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

from qsa_testing import cases as C  # noqa: E402
from qsa_testing.torch_interop import to_numpy as _numpy, to_torch as _torch  # noqa: E402


def sparse_golden_cases() -> list[C.SparseAttentionCase]:
    """Every split count the table produces, the three TP head geometries, every edge kind."""
    rng = np.random.default_rng(20261202)
    out = []

    def add(name, rows, heads, kv_heads, d, page, blocks, context, nreq, edge=False, prefill=False,
            width=None):
        case = C.sparse_attention_case(
            rng, name=name, rows=rows, num_query_heads=heads, num_kv_heads=kv_heads, head_dim=d,
            page_size=page, selection_blocks=blocks, context_tokens=context, num_requests=nreq,
            use_prefill_config=prefill, selection_width=width or (2051 if blocks == 512 else None))
        if edge:
            C.add_edge_rows(rng, case)
        out.append(C.poison_unreferenced(case))

    # W = 2051 (the real selection) at reduced head dim: splits 64/16/8/4 with
    # BLOCK_N 32. One case selects the full 2048 + 3 tokens; the others are
    # early-context rows (fewer visible blocks than W), which also leaves
    # trailing splits empty.
    add("tp1_r3_s64_full", 3, 24, 2, 32, 64, 512, 2300, 1)     # 6 programs
    add("tp2_r12_s64", 12, 12, 1, 32, 64, 512, 900, 2)         # 12 programs
    add("tp1_r16_s16", 16, 24, 2, 32, 64, 512, 700, 2)         # 32 programs
    add("tp4_r40_s8", 40, 6, 1, 32, 64, 512, 500, 3)           # 40 programs
    add("tp1_r33_s4", 33, 24, 2, 32, 64, 512, 600, 3)          # 66 programs
    add("tp1_r65_s8", 65, 8, 2, 16, 32, 512, 400, 4)          # 130 programs
    # Smaller W: BLOCK_N 64 tables and splits capped by the tile count. Many-row
    # cases use fewer heads and D = 16 to keep the files small.
    add("tp1_r200_w259_s4", 200, 4, 2, 16, 64, 64, 300, 8, width=259)   # 400 programs, 5 tiles
    add("tp4_r600_w259_s1", 600, 6, 1, 16, 64, 64, 300, 8, width=259)   # 600 programs
    add("tp1_r1100_w67_prefill", 1100, 4, 2, 16, 32, 16, 100, 16, prefill=True)
    add("tp1_r1100_w67_decode", 1100, 4, 2, 16, 32, 16, 100, 16, prefill=False)
    add("tp1_r5_w83_s3", 5, 24, 2, 64, 32, 20, 200, 2)         # 3 tiles -> 3 splits
    add("tp4_r8_w131_d256", 8, 6, 1, 256, 32, 32, 180, 2)      # real head dim
    add("tp4_r20_w63_d256_s2", 20, 6, 1, 256, 16, 15, 80, 3)  # 2 tiles -> 2 splits, D=256
    # Every degenerate row kind, in split and one-split configs.
    add("edge_tp1_r12_w35", 12, 24, 2, 64, 16, 8, 80, 3, edge=True)
    add("edge_tp1_r30_w2051", 30, 24, 2, 32, 64, 512, 600, 3, edge=True)
    add("edge_tp4_r700_w35", 700, 6, 1, 16, 16, 8, 60, 6, edge=True)
    add("edge_tp1_r1030_w35_prefill", 1030, 4, 2, 16, 16, 8, 60, 6, edge=True, prefill=True)
    add("empty_batch", 0, 24, 2, 32, 16, 8, 60, 2)
    return out


# vLLM 0.34.0's goldens: a subset of the cases above (every split regime of its tables,
# D = 256, the degenerate rows, the empty batch), each with the cache stored as e4m3
# ("e4m3": the float8_e4m3fn view vLLM hands over from sm_89 on), as its bytes ("bytes":
# the uint8 storage, which 0.34.0 decodes in registers) and as bf16 with scales ("bf16":
# 0.34.0 ignores the scales there but normalises its own way). Scales other than 1 so a
# dropped or swapped scale shows.
V034_CASES = ("tp1_r3_s64_full", "tp2_r12_s64", "tp4_r40_s8", "tp1_r65_s8", "tp4_r8_w131_d256",
              "edge_tp1_r12_w35", "edge_tp1_r30_w2051", "empty_batch")
V034_KINDS = ("e4m3", "bytes", "bf16")
V034_SCALES = (0.5, 2.0)


def v034_cache(case: C.SparseAttentionCase, kind: str) -> np.ndarray:
    """The case's fused cache in ``kind``'s storage (the e4m3 rounding of its bf16 values;
    the poison's large K and NaN V survive it)."""
    if kind == "bf16":
        return case.kv_cache
    e4m3 = case.kv_cache.astype(np.float32).astype(C.E4M3)
    return e4m3.view(np.uint8) if kind == "bytes" else e4m3


def compress_golden_cases() -> list[C.CompressCase]:
    rng = np.random.default_rng(7)
    out = []
    for ring in (4, 8):
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
        _pack(case.name, {**case.arrays(), "expected_out": res}, data)
        data[f"{case.name}/use_prefill_config"] = np.array(case.use_prefill_config)
        manifest["sparse_attention"].append({"name": case.name, "config": list(cfg),
                                             "shape": list(case.q.shape),
                                             "width": case.selection_width})
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
            arrays = {**case.arrays(), "expected_out": res}
            arrays["kv_cache"] = cache.view(np.uint8) if kind == "e4m3" else cache
            _pack(name, arrays, data)
            data[f"{name}/use_prefill_config"] = np.array(case.use_prefill_config)
            manifest["sparse_attention_v034"].append(
                {"name": name, "kv": kind, "k_scale": V034_SCALES[0], "v_scale": V034_SCALES[1],
                 "config": [int(x) for x in cfg], "shape": list(case.q.shape), "width": case.selection_width})
            print(f"sparse 0.34 {name:36s} q={case.q.shape} cfg={tuple(cfg)}")
    np.savez_compressed(out / "sparse_attention_v034.npz", **data)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for f in sorted(out.iterdir()):
        print(f"{f.name}: {f.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
