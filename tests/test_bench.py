"""Smoke test of the benchmark's CPU mode on a tiny subset (seconds)."""

from __future__ import annotations

import json

import pytest


def test_bench_cpu_mode_tiny(tmp_path):
    from bench import run, summarize

    out = tmp_path / "res"
    rc = run.main(["--cpu", "--tp", "TP4", "--rows", "1,4", "--indexer-rows", "3", "--ring", "4",
                   "--n-calls", "2", "--eager-calls", "2", "--no-progress", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["mode"] == "cpu" and res["not_a_gpu_measurement"] is True
    assert "NOT a GPU measurement" in res["machine"]["warning"]
    assert "NOT a GPU measurement" in (out / "results.md").read_text()
    recs = res["results"]
    assert {r["op"] for r in recs} == {"sparse_attention", "compress_groups_with_ratio", "store_cache_rows"}
    for r in recs:
        assert not r.get("error"), r.get("traceback")
        assert r["impl"] == "xla"
        assert r["device_s"] > 0 and r["eager_s"] > 0 and r["gbps"] > 0
        assert r["check"]["ok"], r["check"]
    sparse = [r for r in recs if r["op"] == "sparse_attention"]
    assert [r["rows"] for r in sparse] == [1, 4]
    assert all(r["config"] and r["bytes_per_call"]["total"] > 0 for r in sparse)
    assert res["copy_bandwidth"]["gbps"] > 0
    table = summarize.summary_table(res)
    assert "sparse_attention — TP4" in table and "NOT a GPU measurement" in table
    pytest.importorskip("matplotlib")
    assert (out / "sparse_attention.png").stat().st_size > 0
    assert (out / "indexer_ops.png").stat().st_size > 0


def test_bench_index_sets_follow_the_selection_layout():
    import numpy as np

    from bench import inputs as I

    geo = I.geometry("TP1", cpu=True, pool_gb=1)
    w = geo.selection_width
    for x in I.index_sets(5, 2, 8, geo):
        x = np.asarray(x)
        assert x.shape == (8, w + 1) and x.dtype == np.int32
        for row in x:
            count = row[w]
            sel = row[:count]
            assert 4 * geo.selection_blocks <= count <= w
            assert (row[count:w] == -1).all() and (sel >= 0).all() and (sel < geo.context_tokens).all()
            blocks = sel[: 4 * geo.selection_blocks].reshape(-1, 4)
            assert (blocks == blocks[:, :1] + np.arange(4)).all() and (blocks[:, 0] % 4 == 0).all()
            assert len(set(blocks[:, 0].tolist())) == geo.selection_blocks  # distinct blocks
            tail = sel[4 * geo.selection_blocks:]
            if tail.size:  # causal tail of the open group, consecutive
                assert (np.diff(tail) == 1).all() and tail[0] % 4 == 0


def test_compile_cost_cold_then_warm(tmp_path):
    """bench.compile_cost in two fresh processes sharing a cache: the second loads, the first compiles."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "bench.compile_cost", "--impl", "xla", "--cache-dir",
           str(tmp_path / "cache"), "--rows", "3"]
    env = {**__import__("os").environ, "JAX_PLATFORMS": "cpu"}
    runs = [json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                      env=env).stdout.splitlines()[-1]) for _ in range(2)]
    assert any((tmp_path / "cache").iterdir()), "the first process wrote nothing to the cache"
    for r in runs:
        assert r["backend"] == "cpu" and r["rows"]["3"]["first_s"] > r["rows"]["3"]["second_s"] > 0


def test_decode_floor_cpu_smoke(tmp_path, capsys, monkeypatch):
    """bench.decode_floor runs end to end on CPU (interpret mode) and writes its table."""
    import sys

    from bench import decode_floor

    out = tmp_path / "floor.md"
    monkeypatch.setattr(sys, "argv", ["decode_floor", "--tp", "TP4", "--rows", "1", "--n-calls", "2",
                                      "--out", str(out)])
    assert decode_floor.main() == 0
    decomposed, variants = out.read_text().split("## Variants")
    row = [line for line in decomposed.splitlines() if line.startswith("| TP4 | 1 |")]
    assert len(row) == 1
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    assert float(cells[4]) > 0 and float(cells[5]) > 0 and float(cells[7]) > 0  # pallas, kernel, floor
    row = [line for line in variants.splitlines() if line.startswith("| TP4 | 1 |")]
    assert len(row) == 1
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    assert float(cells[4]) > 0 and float(cells[7]) > 0  # prefetch, strided q
    # Prefetch and strided q are bit-identical to the default kernel.
    assert cells[8].split(" / ")[0] == "0.0e+00" and cells[8].split(" / ")[-1] == "0.0e+00"
