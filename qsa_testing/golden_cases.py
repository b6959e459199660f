"""The sparse-attention golden cases, rebuilt bit for bit from fixed seeds.

The golden files keep the originals' outputs and the small inputs; the cache pages
(most of the bytes, random bf16 that does not compress) are rebuilt here at load time
and checked against the SHA-256 the recording stored (``qsa_testing.golden``), so a
change in NumPy's generator fails loudly instead of silently testing other inputs.
``tools/record_goldens.py`` records from the same builders.
"""

from __future__ import annotations

import hashlib

import numpy as np

from qsa_testing import cases as C


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


def sha256(array: np.ndarray) -> str:
    """Digest of an array's bytes (with its shape and dtype), as stored in the manifest."""
    a = np.ascontiguousarray(array)
    h = hashlib.sha256(f"{a.shape}|{a.dtype}|".encode())
    h.update(a.view(np.uint8).tobytes())
    return h.hexdigest()
