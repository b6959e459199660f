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
