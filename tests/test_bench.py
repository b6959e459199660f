"""Smoke test of the benchmark's CPU mode on a tiny subset (seconds), and its records."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

from bench.records import Case, CaseResult, Check, Rates, RunResult, Timing, Workload

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "bench" / "results"
# The newest committed grid: its results.md was rendered by bench.report from its results.json.
NEWEST_GRID = RESULTS / "nvidia-h200_2026-12-03" / "grid_d6687c8"


def _result(impl, *, rows=1, op="sparse_attention", **timing):
    return CaseResult(Case(op, rows, impl, tp="TP1", kv_dtype="bf16", use_prefill_config=False),
                      Workload({"total": 1000}), Timing(**timing))


def _run(results, **header):
    return RunResult(**{"machine": {"card": "card", "date": "d"}, "mode": "gpu", "not_a_gpu_measurement": False,
                        "copy_bandwidth": {"gbps": 4000.0}, "settings": {"n_calls": 20}, "implementations": {},
                        "byte_model": {}, "method": {}, **header}, results=tuple(results))


def test_bench_cpu_mode_tiny(tmp_path):
    from bench import run, summarize

    out = tmp_path / "res"
    rc = run.main(["--cpu", "--tp", "TP4", "--rows", "1,4", "--indexer-rows", "3", "--ring", "4",
                   "--n-calls", "2", "--eager-calls", "2", "--no-progress", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    run = RunResult.from_json(res)
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
    # sparse attention is held to the accuracy contract (any tiling), fidelity recorded beside
    assert all(r["check"]["contract"] == "accuracy" and r["check"]["fidelity_ok"] for r in sparse)
    assert res["copy_bandwidth"]["gbps"] > 0
    table = summarize.summary_table(run)
    assert "sparse_attention — TP4" in table and "NOT a GPU measurement" in table
    import matplotlib  # noqa: F401  (a test dependency: the plot must be drawn, not skipped)
    assert (out / "sparse_attention.png").stat().st_size > 0
    assert (out / "indexer_ops.png").stat().st_size > 0


def test_bench_cold_l2_sets(tmp_path, monkeypatch):
    """--cold-l2: every set of a timed unit reads rows of its own requests (set i: requests
    i*rows ..), the checked call is set 0's, and the set count grows to 4x the L2 over the K/V
    one call reads (capped): here a pretend 1 MiB L2 on CPU."""
    import numpy as np

    from bench import inputs as I
    from bench import measure_sparse, run

    made = []
    real = I.sparse_inputs

    def spy(geo, rows, n, seed, **kw):
        made.append((rows, n, kw))
        return real(geo, rows, n, seed, **kw)

    monkeypatch.setattr(I, "sparse_inputs", spy)
    monkeypatch.setattr(measure_sparse, "l2_bytes", lambda gpu: 1 << 20)
    out = tmp_path / "res"
    rc = run.main(["--cpu", "--op", "sparse", "--tp", "TP4", "--rows", "1,4", "--n-calls", "2", "--eager-calls", "2",
                   "--cold-l2", "--no-progress", "--no-plot", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["settings"]["cold_l2"] is True
    assert all(r["check"]["ok"] and not r.get("error") for r in res["results"]), res["results"]
    geo = I.geometry("TP4", cpu=True, pool_gb=4.0)
    assert [rows for rows, _, _ in made] == [1, 4]
    for rows, n, kw in made:
        assert kw == {"own_requests": True}
        per_call = I.sparse_bytes(geo, rows, rows * geo.selection_width)["total"]
        assert n == min(measure_sparse.COLD_L2_MAX_SETS, max(2, -(-4 * (1 << 20) // per_call))), (rows, n)
        assert n > 2  # the pretend L2 needs more than --n-calls sets at these sizes
    inp = real(geo, 4, 3, 0, own_requests=True)
    assert [np.asarray(t).tolist() for t in inp.t2r] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert inp.block_table.shape[0] == 12 and inp.token_to_req is inp.t2r[0]
    plain = real(geo, 4, 3, 0)
    assert all(t is plain.token_to_req for t in plain.t2r) and plain.block_table.shape[0] == 4
    # The timed calls read each set's own requests: set 1's call equals the call with its
    # token_to_req, and differs from the same selections on set 0's requests.
    import qsa_jax

    _, kv = I.make_pool(geo, gpu=False, seed=3)
    calls = measure_sparse._jax_calls(kv, inp, False, "xla", scales={})
    args = (inp.q, kv, inp.idx[1], inp.block_table)
    want = qsa_jax.sparse_attention(*args, inp.t2r[1], inp.gate, implementation="xla")
    other = qsa_jax.sparse_attention(*args, inp.t2r[0], inp.gate, implementation="xla")
    got = calls.calls[1]()
    assert np.array_equal(np.asarray(got), np.asarray(want)) and not np.array_equal(np.asarray(want), np.asarray(other))
    many = calls.many(*calls.args)
    assert np.array_equal(np.asarray(many[1]), np.asarray(want))


def test_bench_trace_path_on_cpu(tmp_path):
    """--trace-rows runs the traced re-runs (chained store included) without error; on CPU the
    trace holds no kernels, so no busy time is recorded."""
    from bench import run

    out = tmp_path / "res"
    rc = run.main(["--cpu", "--tp", "TP4", "--rows", "1", "--indexer-rows", "3", "--ring", "4", "--impl", "pallas",
                   "--n-calls", "2", "--eager-calls", "2", "--no-progress", "--no-plot", "--trace-rows", "64",
                   "--out", str(out)])
    assert rc == 0
    recs = json.loads((out / "results.json").read_text())["results"]
    assert len(recs) == 3
    for r in recs:
        assert not r.get("error"), r.get("traceback")
        assert r["device_s"] > 0 and "busy_s" not in r


def test_busy_table_from_records():
    from bench import report

    def rec(impl, dev, busy):
        return _result(impl, device_s=dev, busy_s=busy)

    res = [rec("original", 10e-6, 9e-6), rec("original034", 8e-6, 7.5e-6), rec("pallas", 19e-6, 8.1e-6),
           rec("xla", 40e-6, None)]
    text = report.busy_table(res)
    row = [line for line in text.splitlines() if line.startswith("| sparse_attention | TP1 | 1 |")]
    assert len(row) == 1
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    # 0.30 graph, 0.30 busy, 0.34 busy, pallas wall, pallas busy, x 0.30, x 0.34, x the faster original
    assert cells[3:11] == ["10.0", "9.0", "7.5", "19.0", "8.1", "0.90", "1.08", "1.08"] and cells[11] == ""
    assert len(cells) == 13  # no auto traced: no auto columns
    assert report.busy_table([rec("pallas", 1e-6, None)]) == ""
    # The library's default (--impl auto) traced: its busy time and ratio to the faster original.
    text = report.busy_table([*res, rec("auto", 15e-6, 7.0e-6)])
    head, rule, row = text.splitlines()[:3]
    assert head.count("|") - 1 == rule.count("|") - 1 == 15 and head.split("|")[-3:-1] == [
        " auto busy µs ", " auto busy × faster original "]
    assert [c.strip() for c in row.strip("|").split("|")][13:] == ["7.0", "0.93"]
    # A traced shim (session 27: the same kernels under torch's launch) adds its own pair after
    # auto's; a shim traced in no case adds none.
    text = report.busy_table([*res, rec("auto", 15e-6, 7.0e-6), rec("shim-tt", 16e-6, 7.7e-6),
                              rec("shim-jax", 30e-6, None)])
    head, rule, row = text.splitlines()[:3]
    assert head.count("|") - 1 == rule.count("|") - 1 == 17 and head.split("|")[-3:-1] == [
        " shim-tt busy µs ", " shim-tt busy × faster original "]
    assert [c.strip() for c in row.strip("|").split("|")][13:] == ["7.0", "0.93", "7.7", "1.03"]


@pytest.mark.parametrize("impl, shim_graph, capture_ok, want", [
    ("shim-tt", False, True, "loop"),  # no --shim-graph: the eager loop is traced
    ("shim-tt", True, True, "graph"),  # captured: the graph's replays, once
    ("shim-tt", True, False, "loop"),  # capture failed: the loop's time, and the loop traced
    ("original", False, True, "graph"),  # an original: always its graph, never the loop
])
def test_torch_side_busy_time_is_traced_once(monkeypatch, impl, shim_graph, capture_ok, want):
    """torch_measure traces each traced torch-side case exactly once (session 27): the graph it
    timed, or, for a shim not in a graph, its eager loop (every call once, in order), even when
    the graph's trace comes back empty; the device time keeps its own method. Untraced rows take
    no trace."""
    pytest.importorskip("torch")
    from bench import measure

    traced = []

    def fake_record_busy(draft, run_once, calls_per_run, wait):
        before = len(made)
        run_once()
        kind = "graph" if run_once == replay else "loop"
        traced.append((kind, made[before:], calls_per_run))
        if kind == "loop":  # a graph's trace finds no kernel here (as without CUPTI): no busy time
            draft.timing["busy_s"] = 1e-6

    def graph_time(calls):
        if not capture_ok:
            raise RuntimeError("capture refused")
        return {"device_s": 1e-6, "method": "graph"}

    replay = lambda: made.extend(["replay"])  # noqa: E731
    monkeypatch.setattr(measure, "record_busy", fake_record_busy)
    monkeypatch.setattr(measure.timing, "eager_latency", lambda calls, sync, count: {"eager_s": 1e-5})
    monkeypatch.setattr(measure.timing, "torch_loop_time", lambda calls, reason: {"device_s": 2e-6, "method": "loop"})
    monkeypatch.setattr(measure.timing, "torch_graph_time", graph_time)
    monkeypatch.setattr(measure.timing, "torch_graph", lambda calls: type("G", (), {"replay": staticmethod(replay)}))
    monkeypatch.setattr("torch.cuda.synchronize", lambda: None)
    made = []
    calls = [lambda i=i: made.append(i) for i in range(3)]
    ctx = measure.Context(gpu=True, n_calls=3, eager_calls=1, trace_rows=8, shim_graph=shim_graph, copy_gbps=1.0,
                          seed=0, geometries={}, torch_modules={}, say=print)
    for rows, traced_want in ((8, True), (9, False)):
        traced.clear()
        draft = measure.Draft()
        case = Case("sparse_attention", rows, impl, tp="TP1", kv_dtype="fp8", use_prefill_config=False)
        measure.torch_measure(ctx, case, draft, calls, fetch=lambda x: x)
        assert draft.timing["method"] == want
        if not traced_want:
            assert traced == []
        elif want == "graph":
            assert traced == [("graph", ["replay"], 3)]
        else:
            assert traced == [("loop", [0, 1, 2], 3)]


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
    assert float(cells[6]) > 0 and float(cells[10]) > 0 and float(cells[11]) > 0  # pallas wall, floors
    assert cells[7] == ""  # no GPU, no kernel trace
    row = [line for line in variants.splitlines() if line.startswith("| TP4 | 1 |")]
    assert len(row) == 1
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    assert float(cells[4]) > 0 and float(cells[7]) > 0  # prefetch, strided q
    # Prefetch and strided q are bit-identical to the default kernel.
    assert cells[8].split(" / ")[0] == "0.0e+00" and cells[8].split(" / ")[-1] == "0.0e+00"


def test_sequential_calls_keeps_every_call():
    """All N chained calls survive compilation (XLA drops a call whose result only feeds a
    barrier, so the helper must return every result)."""
    import re

    import jax
    import jax.numpy as jnp

    from bench.timing import sequential_calls

    def f(x):
        return jnp.sin(x) @ jnp.cos(x).T

    for n in (2, 5):
        xs = tuple(jnp.full((32, 32), float(i)) for i in range(n))
        text = jax.jit(lambda xs: sequential_calls(f, xs)).lower(xs).compile().as_text()
        assert len(re.findall(r" dot\(", text)) == n


def test_kernel_trace_summary_and_cpu_trace():
    import jax
    import jax.numpy as jnp

    from bench import kernel_trace
    from bench.kernel_trace import Kernel

    ks = [Kernel("split", 0, 4000), Kernel("merge", 5000, 1000), Kernel("split", 9000, 6000),
          Kernel("merge", 16000, 1000)]
    s = kernel_trace.summarize(ks, 2)
    assert s.busy_us_per_call == 6.0
    assert s.median_gap_us == 1.0  # gaps 1, 3, 1 µs
    assert s.mean_us_by_kernel == {"split": 5.0, "merge": 1.0}
    assert kernel_trace.summarize(ks, 2, only=("merge",)).busy_us_per_call == 1.0
    assert kernel_trace.summarize([], 2) is None
    f = jax.jit(lambda x: x * 2)
    x = jnp.ones((4,))
    assert kernel_trace.gpu_kernels(lambda: jax.block_until_ready(f(x))) == []


@pytest.mark.parametrize("kv,variants", [("bf16", "all"), ("fp8", "merge")])
def test_decode_sweep_cpu_smoke(tmp_path, monkeypatch, kv, variants):
    """bench.decode_sweep runs every launch-knob variant on CPU; all give the default's bits."""
    import sys

    from bench import decode_sweep

    out = tmp_path / "sweep.md"
    monkeypatch.setattr(sys, "argv", ["decode_sweep", "--cases", "TP4:1", "--n-calls", "2", "--runs", "1",
                                      "--kv", kv, "--variants", variants, "--out", str(out)])
    assert decode_sweep.main() == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith(f"| TP4 | {kv} | 1 |")]
    assert len(rows) == len(decode_sweep.VARIANTS if variants == "all" else decode_sweep.MERGE_VARIANTS)
    assert all(line.rstrip().endswith("| yes |") for line in rows)


def test_summary_marks_host_bound_cells():
    from bench import summarize

    def rec(impl, dev, busy=None):
        return dataclasses.replace(_result(impl, device_s=dev, busy_s=busy),
                                   rates=Rates(pct_copy_bw=5.0, ratio_to_original=dev / 10e-6))

    res = _run([rec("original", 10e-6, 20e-6), rec("pallas", 19e-6, 8e-6), rec("triton", 11e-6, 10e-6)])
    table = summarize.summary_table(res)
    row = [line for line in table.splitlines() if line.startswith("| 1 |")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert "‡ (GPU busy 8.0 µs)" in cells[2]  # pallas: 19 > 1.2 x 8
    assert "‡" not in cells[1] and "‡" not in cells[3]  # original never; triton 11 < 1.2 x 10
    assert "‡ wall clock more than" in table


def test_summary_ratio_is_to_the_faster_original():
    """The summary's × is the device time over the faster original's (0.34.0 where it beat
    0.30.0, the only one for fp8); the shim's torch routes are never marked host-bound."""
    from bench import summarize

    def rec(impl, dev, busy=None, o30=None, o34=None):
        return dataclasses.replace(_result(impl, device_s=dev, busy_s=busy), rates=Rates(
            pct_copy_bw=5.0, ratio_to_original=dev / o30 if o30 else None,
            ratio_to_original034=dev / o34 if o34 else None))

    res = _run([rec("original", 10e-6), rec("original034", 8e-6), rec("pallas", 9e-6, o30=10e-6, o34=8e-6),
                rec("shim-tt", 30e-6, 10e-6, o30=10e-6, o34=8e-6)])
    table = summarize.summary_table(res)
    assert "| rows | original | original034 | pallas | shim-tt |" in table
    row = [line for line in table.splitlines() if line.startswith("| 1 |")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert "×" not in cells[1] and "×" not in cells[2]  # the originals carry no ratio
    assert "×1.12" in cells[3]  # 9 / 8, not 9 / 10
    assert "×3.75" in cells[4] and "‡" not in cells[4]
    fp8 = _run([rec("original034", 8e-6), rec("triton", 6e-6, o34=8e-6)])
    assert "×0.75" in summarize.summary_table(fp8)


def test_hopper_sweep_pieces_on_cpu(tmp_path):
    """bench.hopper_sweep's GPU-free parts: the candidate tilings, the exact-attention check it
    gates configs with (against qsa_testing.exact), and the attribution of trace kernels to
    configs by idle gaps."""
    import numpy as np
    import torch

    from bench import hopper_sweep as HS
    from bench.kernel_trace import Kernel
    from qsa_testing import cases as C
    from qsa_testing.exact import exact_attention

    for programs in (1, 16, 256, 4096):
        variants = HS.stage1_variants(programs, 2051)
        assert variants and all(v.splits <= -(-2051 // v.block_n) for v in variants)
        assert programs <= 64 or all(v.block_n != 16 for v in variants)
    assert HS.Variant(32, 65, 2) in HS.stage1_variants(1, 2051)  # one tile per split, at 2 warps

    rng = np.random.default_rng()
    case = C.poison_unreferenced(C.add_edge_rows(rng, C.sparse_attention_case(
        rng, rows=6, num_query_heads=4, num_kv_heads=2, head_dim=16, page_size=8, selection_blocks=6,
        context_tokens=64, num_requests=3)))
    t = lambda x: torch.from_numpy(np.asarray(x, np.float32) if x.dtype == C.BF16 else np.asarray(x))  # noqa: E731
    got = HS.exact_attention_torch(t(case.q), t(case.kv_cache), t(case.logical_indices), t(case.block_table),
                                   t(case.token_to_req), t(case.output_gate), 6)
    want = exact_attention(case.q, case.kv_cache, case.logical_indices, case.block_table,
                           case.token_to_req, case.output_gate)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    # The fp8 sweep's exact attention: an e4m3 cache (poisoned rows stay NaN-free in fp8 only
    # as bytes the kernel never reads) gathered as bytes, with scales that are not 1.
    kv8 = torch.from_numpy(np.nan_to_num(np.asarray(case.kv_cache, np.float32), nan=1.0)).to(torch.float8_e4m3fn)
    ks, vs = HS.FP8_SCALES
    got8 = HS.exact_attention_torch(t(case.q), kv8, t(case.logical_indices), t(case.block_table),
                                    t(case.token_to_req), t(case.output_gate), 6, ks, vs)
    want8 = exact_attention(case.q, kv8.double().numpy(), case.logical_indices, case.block_table,
                            case.token_to_req, case.output_gate, k_scale=ks, v_scale=vs)
    np.testing.assert_allclose(got8.numpy(), want8, rtol=1e-12, atol=1e-12)
    assert not np.allclose(want8, exact_attention(case.q, kv8.double().numpy(), case.logical_indices,
                                                  case.block_table, case.token_to_req, case.output_gate))

    ms = 1_000_000
    kernels = [Kernel("a", 0, 5), Kernel("a", 10, 5), Kernel("b", 50 * ms, 5), Kernel("c", 120 * ms, 5)]
    bursts = HS.split_bursts(kernels, 3)
    assert [len(b) for b in bursts] == [2, 1, 1]
    assert HS.split_bursts(kernels, 2) is None  # a miscount is reported, not guessed


def test_traced_job_bursts_runs_each_job_in_order(monkeypatch):
    """``traced_job_bursts`` runs each job ``runs`` times then waits on its last result, pass by
    pass, under one trace, and hands the trace's kernels to ``split_bursts`` (a fake trace
    here: one kernel per run, each wait a gap that starts a new burst)."""
    from bench import hopper_sweep as HS
    from bench import kernel_trace
    from bench.kernel_trace import Kernel

    log = []

    def job(name):
        def run():
            log.append(name)
            return name + str(len(log))

        def wait(last):
            log.append("wait " + last)
        return run, wait

    def fake_trace(traced):
        start = len(log)
        traced()
        t, kernels = 0, []
        for entry in log[start:]:
            t += 30_000_000 if entry.startswith("wait") else 1000  # a wait: past GAP_SPLIT_NS
            if not entry.startswith("wait"):
                kernels.append(Kernel(entry, t, 500))
        return kernels

    monkeypatch.setattr(kernel_trace, "gpu_kernels", fake_trace)
    monkeypatch.setattr(HS, "GAP_S", 0.0)
    bursts = HS.traced_job_bursts([job("a"), job("b")], runs=2, rounds=2)
    assert log == ["a", "a", "wait a2", "b", "b", "wait b5", "a", "a", "wait a8", "b", "b", "wait b11"]
    assert [[k.name for k in b] for b in bursts] == [["a"] * 2, ["b"] * 2, ["a"] * 2, ["b"] * 2]
    assert HS.traced_job_bursts([job("a")], runs=1, rounds=1) is not None


def test_hopper_sweep_report_by_cache_dtype():
    """The sweep's report names its comparators: both originals for bf16 (and for sweeps
    written before fp8 existed), 0.34.0 alone for fp8, with the winner's ratio to the faster."""
    from bench import hopper_sweep as HS

    def sweep(kv_dtype, versions):
        orig = {f"{v}/prefill=False": {"busy_us": 10.0 + i, "config": [], "err_exact": 2e-3}
                for i, v in enumerate(versions)}
        m = {"geometry": "TP4", "key": "bn32/s4/w2/st2", "busy_us": 8.0, "err_exact": 2.1e-3,
             "variant": {"block_n": 32, "splits": 4, "warps": 2, "stages": 2}}
        r = {"card": "X", "date": "d", "n_sets": 1, "runs": 1, "exact_rows": 4, "accuracy_factor": 1.1,
             "buckets": [{"programs": 4, "seconds": 1.0, "winner": {"key": m["key"]}, "measured": [m],
                          "cases": [{"geometry": "TP4", "rows": 4, "originals": orig}]}]}
        if kv_dtype:
            r.update(kv_dtype=kv_dtype, scales=[0.5, 2.0])
        return r

    old = HS.markdown(sweep(None, ("0.30.0", "0.34.0")))
    assert "0.30.0 µs | 0.34.0 µs" in old and "| 0.80x |" in old and "bf16 cache" in old
    fp8 = HS.markdown(sweep("fp8", ("0.34.0",)))
    assert "0.30.0" not in fp8 and "| 0.34.0 µs |" in fp8 and "fp8 cache" in fp8
    row = [r for r in fp8.splitlines() if r.startswith("| 4 |")][0]
    assert "| 8.0 | 10.0 | 0.80x |" in row
    assert all(len(line.split("|")) == len(fp8.splitlines()[4].split("|")) for line in fp8.splitlines()[4:6])


def test_bench_exit_status_reports_a_failed_case(tmp_path, monkeypatch):
    """bench.run exits nonzero when a case fails its check (here: the XLA output perturbed)."""
    import jax
    import jax.numpy as jnp

    from bench import run
    from bench.records import load
    from qsa_jax.ops.sparse_attention import xla as sxla

    real = sxla.run

    def off_by_a_lot(*args, **kwargs):
        out = real(*args, **kwargs)
        return (out.astype(jnp.float32) * 1.01).astype(out.dtype)

    monkeypatch.setattr(sxla, "run", off_by_a_lot)
    jax.clear_caches()  # no earlier trace of the same call may stand in for the patched one
    rc = run.main(["--cpu", "--op", "sparse", "--tp", "TP4", "--rows", "3", "--n-calls", "2", "--eager-calls", "2",
                   "--impl", "xla", "--no-plot", "--no-progress", "--out", str(tmp_path)])
    jax.clear_caches()
    assert rc == 1
    # The failing case is kept, measured and flagged, in every output.
    res = load(tmp_path / "results.json")
    [r] = res.results
    assert r.failed and not r.check.ok and r.error is None and r.timing.device_s > 0
    assert res.summary["check_failures"] == 1
    assert "**FAIL**" in (tmp_path / "results.md").read_text()


def test_sparse_check_sees_the_rows_the_accuracy_sample_skips():
    """``measure_sparse.check`` passes on the accuracy contract over up to 16 sampled rows; a
    NaN, a written empty row or a garbage row elsewhere in the output must still fail it."""
    import numpy as np

    from bench.measure_sparse import check
    from qsa_testing import cases as C

    rng = np.random.default_rng()
    exact = rng.standard_normal((64, 4, 32))
    exact[5] = 0.0  # an empty row: exactly zero in every result
    ref = exact.astype(C.BF16).astype(np.float64)  # "the original": exact rounded once
    ours = (exact + 1e-3 * rng.standard_normal(exact.shape)).astype(C.BF16).astype(np.float64)
    ours[5] = 0.0
    sampled = np.array([0, 21, 42, 63])
    ours[sampled] = ref[sampled]  # the sampled rows at the original's error: accuracy passes there
    good = check(ours, ref, "original", (sampled, exact[sampled]))
    assert good.ok and good.why is None, good
    for name, spoil in (("NaN", lambda x: x.__setitem__((7, 1, 3), np.nan)),
                        ("empty row", lambda x: x.__setitem__((5, 0, 0), 1.0)),
                        ("garbage row", lambda x: x.__setitem__(9, rng.standard_normal((4, 32)) * 10))):
        bad = ours.copy()
        spoil(bad)
        got = check(bad, ref, "original", (sampled, exact[sampled]))
        assert not got.ok and got.why, (name, got)


def test_committed_results_load_and_render_unchanged():
    """Every committed results.json loads into records that write the same JSON back (nothing
    left over in ``extra``); the newest grid's markdown renders exactly as committed."""
    from bench import report
    from bench.records import _clean, load

    files = sorted(RESULTS.glob("**/results.json"))
    assert NEWEST_GRID / "results.json" in files
    for path in files:
        raw = json.loads(path.read_text())
        run = load(path)
        assert json.loads(json.dumps(_clean(run.to_json()))) == raw, path
        assert not any(r.extra for r in run.results), path
        assert run.with_summary().summary == raw["summary"], path
    md = report.markdown(load(NEWEST_GRID / "results.json"))
    assert md == (NEWEST_GRID / "results.md").read_text()


def test_report_names_the_default_tiling_tables():
    """The results header names the default tables where the run recorded them (which table ran
    depends on the card's SM count); results without the field render as before."""
    from bench import report
    from bench.records import load

    repo = pathlib.Path(__file__).resolve().parents[1]
    run = load(repo / "bench/results/nvidia-h100_2026-12-06/session29/call_c/decode_fp8/results.json")
    assert "default tiling tables" not in report.markdown(run)
    machine = {**run.machine, "default_tiling_tables": {"bf16": "sm90-bf16", "fp8": "sm90-fp8"}}
    md = report.markdown(dataclasses.replace(run, machine=machine))
    assert "- default tiling tables (`config.default_table_names`): bf16 sm90-bf16, fp8 sm90-fp8" in md


def test_report_says_when_the_l2_was_cold():
    """A --cold-l2 run says so in its header (its busy times are not comparable with a warm
    run's at 1-4 rows: H200, session 32 call d, up to +16%); a warm run's header has no such line."""
    from bench import report
    from bench.records import load

    repo = pathlib.Path(__file__).resolve().parents[1]
    cold = load(repo / "bench/results/nvidia-h200_2026-12-06/session32/call_d/standing_cold/results.json")
    assert cold.settings["cold_l2"] is True
    assert "- L2: **cold** (`--cold-l2`)" in report.markdown(cold)
    warm = load(repo / "bench/results/nvidia-h200_2026-12-06/session32/call_c/nvidia-h200_2026-12-06_decode/results.json")
    assert warm.settings["cold_l2"] is False
    assert "L2: **cold**" not in report.markdown(warm)


def test_records_round_trip_and_flags(tmp_path):
    """A record of every part survives to_json -> JSON text -> from_json; unset fields are
    left out of the JSON; ``failed`` is an error or a failed check."""
    from bench.records import load, write_json

    sparse = CaseResult(
        Case("sparse_attention", 64, "pallas", tp="TP4", kv_dtype="fp8", use_prefill_config=True),
        Workload({"total": 123, "kv": 100}, config=(32, 4, 2, 8), config_fields=("block_n", "num_warps", "a", "b"),
                 valid_entries_per_call=2049.5),
        Timing(first_call_s=1.5, eager_s=2e-5, device_s=1e-5, method="m", busy_kernels_us={"k": 3.0}, wall_s=2.0),
        Check(ok=False, reference="original034", contract="accuracy", rel_err=float("nan"), exact_ratio=1.2),
        Rates(gbps=12.3, ratio_to_original034=0.9), warnings=("UserWarning: w",))
    store = CaseResult(Case("store_cache_rows", 3, "xla", ring=8), Workload({"total": 5}),
                       Timing(device_s=1e-6), Check(ok=False, reference="float64 oracle", exact=(True, False),
                                                    mismatches={1: 7}, output_rel_err={1: 0.5}),
                       error="ValueError: boom\n", traceback="tb")
    clean = _result("xla", device_s=1e-6)
    flat = sparse.to_json()
    assert flat["geometry"] == "TP4 fp8" and "ring" not in flat and "busy_s" not in flat
    assert store.to_json()["geometry"] == "ring8"
    assert {"exact_0", "exact_1", "mismatches_1", "rel_err_1"} <= set(store.to_json()["check"])
    assert [r.failed for r in (sparse, store, clean)] == [True, True, False]
    write_json(_run([sparse, store, clean], wall_s=3.0), tmp_path / "r.json")
    back = load(tmp_path / "r.json")
    assert back.results[1:] == (store, clean) and back.wall_s == 3.0
    assert back.results[0].check.rel_err == "nan"  # JSON has no NaN: written as a string
    assert dataclasses.replace(back.results[0], check=sparse.check) == sparse
    assert len(back.failures) == 2
    with pytest.raises(ValueError, match="geometry"):
        CaseResult.from_json({**clean.to_json(), "kv_dtype": "fp8"})  # an fp8 case is labelled "TP1 fp8"


def test_measure_impls_keeps_a_raising_case():
    """An implementation that raises gives a result with its error and the numbers taken before;
    ratios are taken against the original measured first in the same case."""
    from bench.measure import Context, measure_impls

    ctx = Context(gpu=False, n_calls=2, eager_calls=2, trace_rows=0, shim_graph=False, copy_gbps=10.0, seed=0,
                  geometries={}, torch_modules={}, say=print)
    cases = [Case("sparse_attention", 1, impl, tp="TP1", use_prefill_config=False)
             for impl in ("original", "xla", "pallas")]

    def measure_one(case, draft):
        draft.timing.update(device_s={"original": 2e-6, "xla": 1e-6, "pallas": 4e-6}[case.impl], eager_s=1e-5)
        if case.impl == "pallas":
            raise RuntimeError("kernel failed")
        return Check(ok=True, reference="itself" if case.impl == "original" else "original")

    orig, xla, pallas = measure_impls(ctx, cases, Workload({"total": 2000}), measure_one)
    assert orig.rates.ratio_to_original == 1.0 and xla.rates.ratio_to_original == 0.5
    assert xla.rates.gbps == pytest.approx(2.0) and xla.rates.pct_copy_bw == pytest.approx(20.0)
    assert not orig.failed and not xla.failed
    assert pallas.failed and "RuntimeError: kernel failed" in pallas.error and "measure_one" in pallas.traceback
    assert pallas.timing.device_s == 4e-6 and pallas.timing.wall_s >= 0 and pallas.check is None


def test_plan_cases_order_and_fp8_comparator():
    """Cases come grouped by the inputs they share, the originals first; 0.30.0 (no fp8 path)
    is left out of fp8 cases; use_prefill_config True is added only where it changes the config."""
    from bench import inputs, plan, run

    args = run.parse_args(["--tp", "TP1", "--rows", "1,2048", "--kv-dtype", "bf16,fp8", "--op", "sparse,store",
                           "--indexer-rows", "3", "--ring", "4"])
    s = plan.Settings.from_args(args, gpu=True)
    avail = {name: "available" for name in ("original", "original034", "pallas")}
    status = {op: {**dict.fromkeys(plan.IMPLS, "unavailable: x"), **avail} for op in s.ops}
    status["store_cache_rows"]["original034"] = "unavailable: same kernels"
    geos = {"TP1": inputs.geometry("TP1", cpu=True, pool_gb=1)}  # Hk 2: 2048 rows x 2 > 2048
    got = [(c.kv_dtype, c.rows, c.use_prefill_config, c.impl) for c in plan.cases(s, status, geos)
           if c.op == "sparse_attention"]
    bf16 = [("bf16", 1, False), ("bf16", 2048, False), ("bf16", 2048, True)]
    fp8 = [("fp8", 1, False), ("fp8", 2048, False), ("fp8", 2048, True)]
    assert got == ([(*k, i) for k in bf16 for i in ("original", "original034", "pallas")]
                   + [(*k, i) for k in fp8 for i in ("original034", "pallas")])
    store = [c for c in plan.cases(s, status, geos) if c.op == "store_cache_rows"]
    assert [(c.ring, c.rows, c.impl) for c in store] == [(4, 3, "original"), (4, 3, "pallas")]
    with pytest.raises(SystemExit, match="--kv-dtype"):
        plan.Settings.from_args(run.parse_args(["--kv-dtype", "fp16"]), gpu=True)
    with pytest.raises(SystemExit, match="--op"):
        plan.Settings.from_args(run.parse_args(["--op", "gemm"]), gpu=True)


def test_bench_auto_row_is_the_librarys_choice(tmp_path):
    """``--impl auto`` times sparse_attention(implementation=None) (on CPU: the XLA
    reference, so its check against the float64 oracle is the xla row's to the last digit); the
    indexer operators have no auto row, with the reason recorded."""
    from bench import run

    out = tmp_path / "res"
    rc = run.main(["--cpu", "--tp", "TP4", "--rows", "2", "--indexer-rows", "3", "--ring", "4", "--op", "sparse,store",
                   "--impl", "xla,auto", "--n-calls", "2", "--eager-calls", "1", "--no-progress", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    sparse = {r["impl"]: r for r in res["results"] if r["op"] == "sparse_attention"}
    assert set(sparse) == {"xla", "auto"}
    checks = {k: r["check"] for k, r in sparse.items()}
    assert checks["auto"]["ok"] and checks["auto"]["reference"] == checks["xla"]["reference"], checks
    assert checks["auto"]["rel_err"] == checks["xla"]["rel_err"] > 0, checks
    assert not [r for r in res["results"] if r["op"] == "store_cache_rows" and r["impl"] == "auto"]
    assert res["implementations"]["store_cache_rows"]["auto"].startswith("unavailable: sparse attention only")


def test_shim_triton_torch_column(monkeypatch):
    """``--impl shim-tt`` times the shim's ``implementation="triton-torch"`` route: sparse
    attention only, with a reason for the indexer ops; the module-like object passes the
    route's name through; the eager table shows it beside the default route."""
    from bench import plan, report
    from bench.records import CaseResult

    calls = []

    class FakeShim:
        def qsa_sparse_paged_attention(self, *args, **kwargs):
            calls.append(kwargs)
            return "out"

        qsa_compress_groups_with_ratio = qsa_store_cache_rows = qsa_sparse_paged_attention

    tt, via_jax = plan.RoutedShim(FakeShim(), "triton-torch"), plan.RoutedShim(FakeShim(), "jax")
    assert tt.qsa_sparse_paged_attention(1, 2, output_gate=3) == "out"
    via_jax.qsa_sparse_paged_attention(1, output_gate=4)
    assert calls == [dict(output_gate=3, implementation="triton-torch"), dict(output_gate=4, implementation="jax")]
    assert not hasattr(tt, "qsa_store_cache_rows")
    s = plan.Settings.from_args(__import__("bench.run", fromlist=["parse_args"]).parse_args(
        ["--impl", "shim,shim-tt,shim-jax", "--op", "sparse,store"]), gpu=True)
    backends = plan.Backends({"shim": FakeShim(), "shim-tt": tt, "shim-jax": via_jax}, {})
    status = plan.implementation_status(s, backends)
    assert status["sparse_attention"]["shim-tt"] == status["sparse_attention"]["shim-jax"] == "available"
    assert status["store_cache_rows"]["shim-tt"].startswith("unavailable: sparse attention only")
    assert "implementation='jax'" in status["store_cache_rows"]["shim-jax"]
    assert status["store_cache_rows"]["shim"] == "available"
    cpu = plan.Backends.load(plan.Settings.from_args(
        __import__("bench.run", fromlist=["parse_args"]).parse_args([]), gpu=False), (False, "no CUDA"))
    assert all(name in cpu.why_not and "CPU mode" in cpu.why_not[name] for name in ("shim-tt", "shim-jax"))

    res = [_result(impl, eager_s=e) for impl, e in (("original", 100e-6), ("shim", 200e-6), ("shim-tt", 80e-6))]
    assert all(isinstance(r, CaseResult) for r in res)
    table = report.eager_table(res).splitlines()
    assert "shim-tt µs (seen)" in table[0] and "shim-jax" not in table[0]  # columns: the shims timed
    cells = [c.strip() for c in table[-1].strip("|").split("|")]
    # where, rows, prefill, original, shim, x, shim new, x, x in turns, shim-tt, x, shim-tt new, x, ...
    assert cells[3:6] == ["100.0", "200.0", "2.00"] and cells[9:11] == ["80.0", "0.80"], table
    assert cells[8] == "" and "× original (in turns)" in table[0]  # not timed in turns: blank
    # fp8 (no 0.30.0 path): against 0.34.0
    res = [_result(impl, eager_s=e) for impl, e in (("original034", 50e-6), ("shim-jax", 40e-6))]
    table = report.eager_table(res).splitlines()
    cells = [c.strip() for c in table[-1].strip("|").split("|")]
    assert "shim-jax µs (seen)" in table[0] and cells[3] == "50.0" and cells[4:6] == ["40.0", "0.80"], cells


def test_eager_paired_timing_and_its_column(monkeypatch):
    """``timing.eager_latency_paired`` times two implementations in alternating blocks and
    reports each side's median and the median of the rounds' ratios (here fake calls of 2 and
    1 ms, whose ratio it must find although a drift slows every call threefold from the middle
    of the fifth round on); the eager table shows the shim's in-turns ratio. The calls advance
    a fake clock (the timer the module reads) instead of spinning on the real one, so the
    statistics are exact whatever else the machine runs: the spinning form failed once on two
    busy cores (a preempted block took one side's median from 2 to 4.5 ms)."""
    from bench import report, timing

    state = {"calls": 0, "now": 0.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: state["now"])

    def fake(ms):
        def call():
            state["calls"] += 1
            slow = 3.0 if state["calls"] > 50 else 1.0  # the machine slows down during round 5
            state["now"] += ms * slow / 1e3
        return call

    got = timing.eager_latency_paired([fake(2.0)], [fake(1.0), fake(1.0)], lambda _: None, count=5, rounds=8)
    assert state["calls"] == 3 + 2 * 8 * 5
    assert got["eager_paired_ratio"] == pytest.approx(0.5), got
    # Each side's median over the rounds mixes slow and fast rounds (baseline 5 fast and 3 slow,
    # calls 4 and 4): both come out at 2 ms, blind to the 2x between them -- why the ratio is
    # taken per round.
    assert got["eager_paired_s"] == pytest.approx(2e-3) and got["eager_paired_original_s"] == pytest.approx(2e-3), got

    res = [_result("original", eager_s=100e-6),
           _result("shim", eager_s=200e-6, eager_paired_s=90e-6, eager_paired_original_s=120e-6,
                   eager_paired_ratio=0.75)]
    cells = [c.strip() for c in report.eager_table(res).splitlines()[-1].strip("|").split("|")]
    assert cells[4:6] == ["200.0", "2.00"] and cells[8] == "0.75", cells
