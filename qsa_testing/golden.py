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


def _rebuilt_caches() -> dict[str, C.SparseAttentionCase]:
    from qsa_testing.golden_cases import sparse_golden_cases

    return {case.name: case for case in sparse_golden_cases()}


def _checked(cache: np.ndarray, meta: dict) -> np.ndarray:
    from qsa_testing.golden_cases import sha256

    if sha256(cache) != meta["kv_sha256"]:
        raise RuntimeError(
            f"golden {meta['name']}: the rebuilt cache pages differ from the recorded ones (SHA-256); "
            "qsa_testing.golden_cases or NumPy's generator changed: re-record with tools/record_goldens.py")
    return cache


def sparse_attention_cases() -> list[tuple[C.SparseAttentionCase, np.ndarray]]:
    """vLLM 0.30.0's goldens: (case, expected output). The cache pages are rebuilt from the
    recording's seeds and checked against its digest; the rest is read from the file."""
    raw = _unpack(np.load(GOLDEN_DIR / "sparse_attention.npz"))
    rebuilt = _rebuilt_caches()
    result = []
    for meta in manifest()["sparse_attention"]:
        f = dict(raw[meta["name"]])
        expected = f.pop("expected_out")
        prefill = bool(f.pop("use_prefill_config"))
        f["kv_cache"] = _checked(rebuilt[meta["name"]].kv_cache, meta)
        result.append((C.SparseAttentionCase(name=meta["name"], use_prefill_config=prefill, **f), expected))
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
    0.30.0 case whose inputs it shares (``base``), the cache kind ("e4m3", "bytes" or
    "bf16"), the scales and the tiling 0.34.0 chose on the recording card; the cache is
    rebuilt in that kind's storage (float8_e4m3fn for "e4m3") and checked against its digest."""
    path = GOLDEN_DIR / "sparse_attention_v034.npz"
    if not path.exists():
        if manifest().get("sparse_attention_v034"):
            raise FileNotFoundError(f"{path}: the manifest lists vLLM 0.34.0 goldens but the file is missing")
        return []
    from qsa_testing.golden_cases import v034_cache

    raw = _unpack(np.load(path))
    bases = _rebuilt_caches()
    result = []
    for meta in manifest().get("sparse_attention_v034", []):
        base = bases[meta["base"]]
        inputs = {k: v for k, v in base.arrays().items() if k != "kv_cache"}
        kv = _checked(v034_cache(base, meta["kv"]), meta)
        case = C.SparseAttentionCase(name=meta["name"], use_prefill_config=base.use_prefill_config,
                                     kv_cache=kv, **inputs)
        result.append((case, raw[meta["name"]]["expected_out"], meta))
    return result
