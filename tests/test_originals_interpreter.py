"""The originals (vLLM 0.30.0) themselves, run live on CPU by Triton's interpreter.

The golden files hold the originals' outputs for fixed inputs recorded on a GPU; this runs the
originals' own kernels and wrappers on fresh random inputs at reduced sizes and compares them
with the XLA implementation and the float64 oracle (docs/spec.md §6.1):

* sparse attention: a split-K case (2 splits and the merge kernel) and a single-split case
  (gate applied in the split kernel), every degenerate row kind of docs/spec.md §4, finite-K /
  NaN-V poison in every cache row no valid entry reads, NaN in ``out`` before the call;
* group compression: ring 4 with ``rope_cache`` and ring 8 without, invalid rows of every kind;
  ratios 3 and 7 with fp32 keys (the mean a true division, as the originals' ``/``: XLA's
  reciprocal multiply was an fp32 ulp off), xla and pallas bit for bit;
* the row store: bf16 and fp32 rows into a 140-wide bf16 cache, invalid slots.

Triton's interpreter must be on before triton is first imported (its library functions are
made interpretable at import), so the work runs in one subprocess,
``python tests/test_originals_interpreter.py``, whose verdicts the tests below read.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SKIP_EXIT = 3  # the subprocess could not obtain the originals

SPARSE_CASES = ("splitk_merge", "single_split", "splitk_merge_fp32_gate", "single_split_fp16_gate")
COMPRESS_CASES = ("ring4_rope", "ring8_norope", "ring5_ratio3_fp32", "ring8_ratio7_fp32")
STORE_CASES = ("bf16_rows", "fp32_rows")

if __name__ != "__main__":
    import pytest

    @pytest.fixture(scope="module")
    def verdicts() -> dict[tuple[str, str], str]:
        pytest.importorskip("torch")
        pytest.importorskip("triton")
        done = subprocess.run([sys.executable, __file__], cwd=REPO, capture_output=True, text=True,
                              timeout=900, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        if done.returncode == SKIP_EXIT:
            why = done.stdout.strip().splitlines()[-1]
            if os.environ.get("CI"):  # under CI the originals must run (originals.load_or_skip)
                pytest.fail(why)
            pytest.skip(why)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        found = {}
        for line in done.stdout.splitlines():
            if line.startswith("RESULT "):
                _, op, name, verdict = line.split(" ", 3)
                found[(op, name)] = verdict
        return found

    @pytest.mark.parametrize("op,name", [("sparse_attention", n) for n in SPARSE_CASES]
                             + [("compress_groups_with_ratio", n) for n in COMPRESS_CASES]
                             + [("store_cache_rows", n) for n in STORE_CASES])
    def test_originals_agree_with_xla_and_oracle(verdicts, op, name):
        assert verdicts.get((op, name)) == "ok", verdicts.get((op, name), "case did not run")


# ---------------------------------------------------------------------------------
# The subprocess.


def _check(op, name, fn):
    try:
        fn()
        print(f"RESULT {op} {name} ok", flush=True)
    except AssertionError as exc:
        print(f"RESULT {op} {name} FAIL: {' '.join(str(exc).split())}", flush=True)


def _sparse(orig, rng, name, blocks, splits, gate_dtype=None):
    import torch

    import qsa_jax
    from qsa_jax.config import SparseAttentionConfig
    from qsa_testing import cases as C
    from qsa_testing import oracle
    from qsa_testing.agreement import assert_fidelity
    from qsa_testing.torch_interop import kv_views, to_numpy, to_torch

    rows = 10  # one of each degenerate row kind
    case = C.small_edge_case(rng, name, rows=rows, selection_blocks=blocks)
    if gate_dtype is not None:  # a gate bf16 cannot hold: the originals read it as fp32, as must we
        case.output_gate = C.off_grid_gate(rng, case.output_gate, gate_dtype)
    # The config the originals pick for themselves (their own table, not ours).
    cfg = SparseAttentionConfig(*orig._select_config(rows, case.num_kv_heads, False, case.selection_width))
    assert cfg.num_splits == splits, f"{name}: the originals chose {tuple(cfg)}, not {splits} split(s)"
    t = lambda x: to_torch(x, device="cpu")  # noqa: E731
    k, v = kv_views(t(case.kv_cache), case.head_dim)
    q = t(case.q)
    out = torch.full_like(q, float("nan"))  # every element must be written
    orig.qsa_sparse_paged_attention(q, k, v, t(case.logical_indices), t(case.block_table), t(case.token_to_req),
                                    False, out, output_gate=t(case.output_gate))
    got = to_numpy(out)
    kk, vv = case.split_caches()
    ref = oracle.sparse_attention_oracle(case.q, kk, vv, case.logical_indices, case.block_table,
                                         case.token_to_req, case.output_gate, block_n=cfg.block_n,
                                         num_tiles=cfg.num_tiles, num_splits=cfg.num_splits)
    assert_fidelity(got, ref, what=f"originals/{name} vs oracle")
    for impl in ("xla",) if gate_dtype is None else ("xla", "pallas"):
        mine = qsa_jax.sparse_attention(case.q, case.kv_cache, case.logical_indices, case.block_table,
                                        case.token_to_req, case.output_gate, implementation=impl)
        assert_fidelity(np.asarray(mine), got, what=f"{impl}/{name} vs originals")
        if gate_dtype is not None:  # the gate read at full width: not the output of its bf16 rounding
            rounded = qsa_jax.sparse_attention(case.q, case.kv_cache, case.logical_indices, case.block_table,
                                               case.token_to_req, case.output_gate.astype(C.BF16),
                                               implementation=impl)
            assert not np.array_equal(np.asarray(mine).view(np.uint16), np.asarray(rounded).view(np.uint16)), \
                f"{impl}/{name}: the {gate_dtype.__name__} gate gave the bf16-rounded gate's output"
    assert (ref == 0).any(), f"{name}: no empty row, the edge rows did not take"


def _compress(orig, rng, name, ring, with_rope, ratio=4, fp32_keys=False):
    import qsa_jax
    from qsa_testing import cases as C
    from qsa_testing import oracle
    from qsa_testing.torch_interop import to_numpy, to_torch
    from qsa_testing.triton_interpreter import on_device

    case = C.compress_case(rng, name=name, chunk_lens=[3, 6, 1, 5], head_dim=32, ring=ring, ratio=ratio,
                           with_rope=with_rope, edge=True)
    if fp32_keys:  # the pooled mean unrounded: a one-ulp fp32 difference shows
        case.raw_keys = (case.raw_keys.astype(np.float32) * rng.uniform(0.5, 2, case.raw_keys.shape)).astype(
            np.float32)
        case.compressor_state_cache = case.compressor_state_cache.astype(np.float32) * np.float32(1.7)
    arrays = [case.raw_keys, case.raw_positions, case.compressor_state_cache, case.compressor_state_block_table,
              case.token_to_req, case.query_start_loc, case.logical_positions, case.compressed_slots]
    dev = lambda x: None if x is None else on_device(to_torch(x, device="cpu"))  # noqa: E731
    pooled, first = orig.qsa_compress_groups_with_ratio(*map(dev, arrays), case.compress_ratio,
                                                        dev(case.rope_cache))
    pooled, first = to_numpy(pooled), to_numpy(first)
    ref_pooled, ref_first = oracle.compress_groups_oracle(*arrays, case.compress_ratio, case.rope_cache)
    if not fp32_keys:  # the oracle's pooled keys are bf16 values
        np.testing.assert_array_equal(pooled.astype(np.float64), ref_pooled, err_msg=f"originals/{name} pooled")
    np.testing.assert_array_equal(first, ref_first, err_msg=f"originals/{name} first positions")
    # JAX without x64: positions travel as int32.
    jax_arrays = list(arrays)
    jax_arrays[1] = case.raw_positions.astype(np.int32)
    rope = None if case.rope_cache is None else case.rope_cache.astype(np.int32)
    for impl in ("xla", "pallas") if fp32_keys else ("xla",):
        x_pooled, x_first = qsa_jax.compress_groups_with_ratio(*jax_arrays, case.compress_ratio, rope,
                                                               implementation=impl)
        bits = np.uint32 if fp32_keys else np.uint16
        np.testing.assert_array_equal(np.asarray(x_pooled).view(bits), pooled.view(bits),
                                      err_msg=f"{impl}/{name} pooled")
        np.testing.assert_array_equal(np.asarray(x_first).astype(np.int64), first, err_msg=f"{impl}/{name} first")
    assert (ref_pooled == 0).all(axis=(1, 2)).any(), f"{name}: no invalid row, the edge rows did not take"


def _store(orig, rng, name, rows_dtype):
    import qsa_jax
    from qsa_testing import cases as C
    from qsa_testing import oracle
    from qsa_testing.torch_interop import to_numpy, to_torch
    from qsa_testing.triton_interpreter import on_device

    pages, page_size = 5, 8
    total = pages * page_size
    case = C.store_case(rng, name=name, n=24, pages=pages, page_size=page_size, width=140, rows_dtype=rows_dtype)
    slots = case.slot_mapping
    # Each kind of invalid slot in every run, and the last slot never validly targeted: a -1
    # that wrapped around like a NumPy index would land there and show.
    slots[slots == total - 1] = total
    slots[:4] = [-1, total, total + 1, -(2**20)]
    cache = to_torch(case.cache, device="cpu")
    orig.qsa_store_cache_rows(on_device(cache), on_device(to_torch(case.slot_mapping, device="cpu")),
                              on_device(to_torch(case.rows, device="cpu")))
    got = to_numpy(cache).view(np.uint16)
    ref = oracle.store_cache_rows_oracle(case.cache, case.slot_mapping, case.rows).view(np.uint16)
    np.testing.assert_array_equal(got, ref, err_msg=f"originals/{name} vs oracle")
    xla = qsa_jax.store_cache_rows(case.cache, case.slot_mapping, case.rows, implementation="xla")
    np.testing.assert_array_equal(np.asarray(xla).view(np.uint16), got, err_msg=f"xla/{name} vs originals")
    assert (got != case.cache.view(np.uint16)).any(), f"{name}: nothing was stored"


def main() -> int:
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from qsa_testing.originals import OriginalsUnavailable
    from qsa_testing.triton_interpreter import interpreted_originals

    try:
        orig = interpreted_originals()
    except OriginalsUnavailable as exc:
        print(f"vLLM 0.30.0 originals unavailable: {exc}")
        return SKIP_EXIT
    # Fresh inputs every run; the seed is printed so that a failure can be replayed.
    seed = int(os.environ.get("QSA_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"seed {seed} (QSA_SEED={seed} replays it)", flush=True)
    rng = np.random.default_rng(seed)
    # 10 rows x 2 KV heads pick BLOCK_N 32 and 64 splits, capped at the tile count: W = 35 gives
    # 2 tiles, so 2 splits and the merge kernel; W = 31 one tile, so one split that applies the
    # gate itself (the table's own single-split rows, > 512 programs, are too slow to interpret).
    for name, blocks, splits in (("splitk_merge", 8, 2), ("single_split", 7, 1)):
        _check("sparse_attention", name, lambda: _sparse(orig, rng, name, blocks, splits))
    # An fp32 / fp16 gate, which the originals accept (and read as fp32): the merge kernel's
    # gate and the one-split kernel's.
    for name, blocks, splits, dtype in (("splitk_merge_fp32_gate", 8, 2, np.float32),
                                        ("single_split_fp16_gate", 7, 1, np.float16)):
        _check("sparse_attention", name, lambda: _sparse(orig, rng, name, blocks, splits, dtype))
    for name, ring, with_rope in (("ring4_rope", 4, True), ("ring8_norope", 8, False)):
        _check("compress_groups_with_ratio", name, lambda: _compress(orig, rng, name, ring, with_rope))
    for name, ring, ratio in (("ring5_ratio3_fp32", 5, 3), ("ring8_ratio7_fp32", 8, 7)):
        _check("compress_groups_with_ratio", name,
               lambda: _compress(orig, rng, name, ring, True, ratio=ratio, fp32_keys=True))
    from qsa_testing.cases import BF16

    for name, dtype in (("bf16_rows", BF16), ("fp32_rows", np.float32)):
        _check("store_cache_rows", name, lambda: _store(orig, rng, name, dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
