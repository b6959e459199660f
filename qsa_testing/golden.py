"""Read the golden files recorded from the originals (``tools/record_goldens.py``)."""

from __future__ import annotations

import json
import pathlib

import numpy as np

from qsa_testing import cases as C

GOLDEN_DIR = pathlib.Path(__file__).resolve().parents[1] / "tests" / "golden"


def _unpack(npz) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {}
    for key in npz.files:
        case, field = key.split("/", 1)
        value = npz[key]
        if field.endswith("@bf16"):
            field, value = field[: -len("@bf16")], value.view(C.BF16)
        out.setdefault(case, {})[field] = value
    return out


def manifest() -> dict:
    return json.loads((GOLDEN_DIR / "manifest.json").read_text())


def available() -> bool:
    return (GOLDEN_DIR / "manifest.json").exists()


def sparse_attention_cases() -> list[tuple[C.SparseAttentionCase, np.ndarray]]:
    raw = _unpack(np.load(GOLDEN_DIR / "sparse_attention.npz"))
    result = []
    for name, f in raw.items():
        expected = f.pop("expected_out")
        prefill = bool(f.pop("use_prefill_config"))
        result.append((C.SparseAttentionCase(name=name, use_prefill_config=prefill, **f), expected))
    return result


def compress_cases() -> list[tuple[C.CompressCase, np.ndarray, np.ndarray]]:
    raw = _unpack(np.load(GOLDEN_DIR / "compress_groups.npz"))
    result = []
    for name, f in raw.items():
        pooled, first = f.pop("expected_pooled"), f.pop("expected_first")
        ratio = int(f.pop("compress_ratio"))
        f.setdefault("rope_cache", None)
        result.append((C.CompressCase(name=name, compress_ratio=ratio, **f), pooled, first))
    return result


def store_cases() -> list[tuple[C.StoreCase, np.ndarray]]:
    raw = _unpack(np.load(GOLDEN_DIR / "store_cache_rows.npz"))
    return [(C.StoreCase(name=name, cache=f["cache"], slot_mapping=f["slot_mapping"], rows=f["rows"]),
             f["expected_cache"]) for name, f in raw.items()]


def sparse_attention_v034_cases() -> list[tuple[C.SparseAttentionCase, np.ndarray, dict]]:
    """vLLM 0.34.0's goldens: (case, expected output, manifest entry). The entry names the
    cache kind ("e4m3", "bytes" or "bf16"), the scales and the tiling 0.34.0 chose on the
    recording card; an "e4m3" case's kv_cache is returned as float8_e4m3fn."""
    path = GOLDEN_DIR / "sparse_attention_v034.npz"
    if not path.exists():
        return []
    raw = _unpack(np.load(path))
    result = []
    for meta in manifest().get("sparse_attention_v034", []):
        f = dict(raw[meta["name"]])
        expected = f.pop("expected_out")
        prefill = bool(f.pop("use_prefill_config"))
        if meta["kv"] == "e4m3":
            f["kv_cache"] = f["kv_cache"].view(C.E4M3)
        result.append((C.SparseAttentionCase(name=meta["name"], use_prefill_config=prefill, **f), expected, meta))
    return result
