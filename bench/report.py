"""Results: JSON, markdown table and PNG plots of a run's records (``bench.records``)."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

from bench import summarize
from bench.records import AUTO, ORIGINALS, SHIMS, CaseResult, RunResult, Timing, write_json

IMPL_ORDER = ("original", "original034", "xla", "pallas", "triton", AUTO, "shim", "shim-tt", "shim-jax")
COLORS = {"original": "black", "original034": "tab:gray", "triton": "tab:blue", "pallas": "tab:orange", "xla": "tab:green",
          AUTO: "tab:red", "shim": "tab:purple", "shim-tt": "tab:pink",
          "shim-jax": "tab:olive"}


def default_out_dir(repo: pathlib.Path, info: dict) -> pathlib.Path:
    from bench.machine import slug

    name = f"{slug(info['card'])}_{info['date']}"
    if info.get("mode") == "cpu":
        name = f"cpu-reduced_{info['date']}"
    base = repo / "bench" / "results" / name
    out, k = base, 2
    while (out / "results.json").exists():
        out = base.with_name(f"{base.name}_{k}")
        k += 1
    return out


def _us(s):
    return "" if s is None else f"{s * 1e6:,.1f}"


def check_text(r: CaseResult) -> str:
    if r.error:
        return "**ERROR**"
    chk = r.check
    if chk is None:
        return "not checked"
    if chk.is_reference:
        return "reference"
    if chk.rel_err is not None:
        txt = f"{chk.rel_err:.1e}"
        if chk.nan:
            txt += f" {chk.nan} NaN"
        if chk.nonzero_where_reference_zero:
            txt += f" {chk.nonzero_where_reference_zero} nonzero@0"
        if chk.exact_ratio is not None:  # accuracy: error vs exact attention / the reference's
            txt += f", vs exact ×{chk.exact_ratio:.2f}"
    elif chk.why is not None:
        txt = chk.why
    else:
        txt = "exact" if chk.ok else "mismatch " + ", ".join(
            f"mismatches_{k}={v}" for k, v in (chk.mismatches or {}).items())
    return txt if chk.ok else f"**FAIL** {txt}"


def one_line(r: CaseResult) -> str:
    c, rt = r.case, r.rates
    where = c.geometry if c.op == "sparse_attention" else f"{c.op.split('_')[0]} ring={c.ring}"
    flag = " prefill" if c.use_prefill_config else ""
    if r.error:
        return f"  {where} rows={c.rows}{flag} {c.impl}: ERROR"
    ratio = f" x{rt.ratio_to_original:.2f}" if rt.ratio_to_original else ""
    if rt.ratio_to_original034:
        ratio += f" x{rt.ratio_to_original034:.2f} of 0.34"
    return (f"  {where} rows={c.rows}{flag} {c.impl}: device {_us(r.timing.device_s)} us, "
            f"eager {_us(r.timing.eager_s)} us, {rt.pct_copy_bw or 0:.0f}% BW{ratio} [{check_text(r)}]")


def table(results: Sequence[CaseResult]) -> str:
    head = ("| op | where | rows | prefill cfg | config (BLOCK_N, warps, tiles, splits) | impl | device µs/call "
            "| eager µs/call | GB/s | % copy BW | × 0.30.0 | × 0.34.0 | check |")
    lines = [head, "|" + "---|" * 13]
    for r in results:
        c, rt, config = r.case, r.rates, r.workload.config
        cfg = "(" + ", ".join(str(x) for x in config) + ")" if config else ""
        ratio = f"{rt.ratio_to_original:.2f}" if rt.ratio_to_original else ""
        ratio += " | " + (f"{rt.ratio_to_original034:.2f}" if rt.ratio_to_original034 else "")
        lines.append(
            f"| {c.op} | {c.geometry} | {c.rows} | {'yes' if c.use_prefill_config else ''} | {cfg} "
            f"| {c.impl} | {_us(r.timing.device_s)} | {_us(r.timing.eager_s)} "
            f"| {rt.gbps or 0:,.0f} | {rt.pct_copy_bw or 0:.1f} | {ratio} | {check_text(r)} |")
    return "\n".join(lines)


def markdown(run: RunResult) -> str:
    m = run.machine
    v = m["versions"]
    cb = run.copy_bandwidth
    s = run.settings
    out = [f"# qsa-jax benchmark — {m['card']} — {m['date']}", ""]
    if run.not_a_gpu_measurement:
        out += [f"> **{m['warning']}**", ""]
    out += [
        f"- card: {m['card']}; driver: {m.get('driver')}; host: {m['host']}; mode: {run.mode}",
        "- versions: " + ", ".join(f"{k} {x}" for k, x in v.items() if x) + f", python {m['python']}",
        *([f"- jax-triton kernels under JAX assembled by: {m['jax_triton_assembler']}"]
          if m.get("jax_triton_assembler") else []),
        *([f"- default tiling tables (`config.default_table_names`): "
           + ", ".join(f"{k} {x}" for k, x in m["default_tiling_tables"].items())]
          if m.get("default_tiling_tables") else []),
        f"- commit: {m.get('git_commit')}{' (dirty tree)' if m.get('git_dirty') else ''}; "
        f"run took {run.wall_s or 0:.0f} s",
        f"- measured device-copy bandwidth: **{cb['gbps']:,.0f} GB/s** ({cb['method']}; bytes read + written)",
        f"- N = {s['n_calls']} calls per timed unit, each with a fresh input set; eager median over "
        f"{s['eager_calls']} calls",
        *(["- L2: **cold** (`--cold-l2`): sparse attention's sets each have their own requests, "
           "and a timed unit cycles through enough of them to read at least 4x the card's L2 "
           "where 256 sets suffice (`bench.measure_sparse.sets_per_unit`), so a set is no longer "
           "in L2 when its turn comes round again"]
          if s.get("cold_l2") else []),
        "",
        "Method: " + "; ".join(f"**{k}**: {x}" for k, x in run.method.items()),
        "",
        "Byte model (GB/s and % copy bandwidth): " + "; ".join(
            f"**{k}**: {x}" for k, x in run.byte_model.items()),
        "",
        "Geometries: " + "; ".join(
            f"{tp}: H={g['num_query_heads']} Hk={g['num_kv_heads']} D={g['head_dim']} P={g['page_size']} "
            f"W={g['selection_width']} context={g['context_tokens']} pool={g['pool_bytes'] / 2**30:.2f} GiB"
            for tp, g in s["geometries"].items()),
        "",
        "Implementations: " + "; ".join(
            f"{op}: " + ", ".join(f"{k} {x}" for k, x in st.items() if x != "not requested")
            for op, st in run.implementations.items()),
        "",
    ]
    sm = run.summary or {}
    if sm.get("errors") or sm.get("check_failures"):
        out += [f"**{sm.get('errors', 0)} case(s) raised and {sm.get('check_failures', 0)} failed the check "
                "(marked in the table).**", ""]
    out += ["## Summary", "", summarize.summary_table(run), ""]
    eager = eager_table(run.results)
    if eager:
        out += ["## Host cost: eager call of the shim vs the original", "",
                "Wall time of one call from Python plus a device sync (median). *seen*: every tensor "
                "object was passed before (a serving loop's persistent buffers); *new tensors*: q, the "
                "gate and the indices are objects never seen before (vLLM's activations); *in turns*: "
                "the shim and the original timed in alternating blocks of calls (seen objects; "
                "`bench.timing.eager_latency_paired`), the ratio least moved by drift in the "
                "machine's state.", "",
                eager, ""]
    busy = busy_table(run.results)
    if busy:
        out += ["## GPU busy time at small sizes (profiler trace)", "",
                "At these sizes a JAX executable's host-side cost per run (launching, argument and "
                "output buffers) can exceed the GPU work of its N calls, so the wall clock of the "
                "JAX chain measures the launcher. The trace gives the GPU's own time: the sum of the "
                "kernel durations per call (method: *busy*). The originals' graph replays have no "
                "launch gaps, so their graph time and busy time agree.", "", busy, ""]
    out += ["## All cases", "", table(run.results), ""]
    return "\n".join(out)


def print_and_write(text: str, path: str | None) -> None:
    """Print a small tool's markdown report, and write it to ``path`` when given."""
    print(text)
    if path:
        pathlib.Path(path).write_text(text)


def _by_case(results: Sequence[CaseResult], keep) -> dict:
    """{(op, where, rows, prefill cfg): {impl: timing}} of the results ``keep`` selects."""
    by_case: dict = {}
    for r in results:
        if keep(r):
            c = r.case
            by_case.setdefault((c.op, c.geometry, c.rows, bool(c.use_prefill_config)), {})[c.impl] = r.timing
    return by_case


def busy_table(results: Sequence[CaseResult]) -> str:
    """Per case with a trace: the original's graph and busy time, pallas/triton wall and busy time
    and busy-time ratio to the original ('' when the run took no trace); then two columns, busy
    time and its ratio to the faster original, for each of the library's default (``--impl
    auto``) and the shims that the run traced."""
    by_case = _by_case(results, lambda r: r.timing.busy_s)
    if not by_case:
        return ""
    extra = [impl for impl in (AUTO, *SHIMS) if any(v.get(impl) is not None for v in by_case.values())]
    head = ("| op | where | rows | 0.30.0 graph µs | 0.30.0 busy µs | 0.34.0 busy µs | pallas wall µs "
            "| pallas busy µs | pallas busy × 0.30.0 | × 0.34.0 | × faster original | triton busy µs "
            "| triton busy × 0.30.0 |")
    head += "".join(f" {impl} busy µs | {impl} busy × faster original |" for impl in extra)
    lines = [head, "|" + "---|" * (13 + 2 * len(extra))]
    none = Timing()
    for (op, geo, n, flag), v in by_case.items():
        o, p, t = (v.get(impl, none) for impl in ("original", "pallas", "triton"))
        ob, ob34 = o.busy_s, v.get("original034", none).busy_s
        fastest = min(x for x in (ob, ob34, float("inf")) if x)
        ratio = lambda x, base=ob: f"{x / base:.2f}" if (base and x and base != float("inf")) else ""  # noqa: E731
        line = (f"| {op} | {geo} | {n}{' (prefill cfg)' if flag else ''} | {_us(o.device_s)} "
                f"| {_us(ob)} | {_us(ob34)} | {_us(p.device_s)} | {_us(p.busy_s)} "
                f"| {ratio(p.busy_s)} | {ratio(p.busy_s, ob34)} "
                f"| {ratio(p.busy_s, fastest)} | {_us(t.busy_s)} | {ratio(t.busy_s)} |")
        for impl in extra:
            b = v.get(impl, none).busy_s
            line += f" {_us(b)} | {ratio(b, fastest)} |"
        lines.append(line)
    return "\n".join(lines)


def eager_table(results: Sequence[CaseResult]) -> str:
    """original vs shim eager latency per sparse-attention case ('' when the run has no shim):
    a pair of columns (objects seen before, new tensor objects) for each shim timed -- "shim"
    (no implementation=: the default route), "shim-tt" (triton-torch), "shim-jax" (the JAX
    route)."""
    by_case = _by_case(results, lambda r: (r.case.op == "sparse_attention"
                                           and r.case.impl in (*ORIGINALS, *SHIMS) and r.timing.eager_s))
    rows = [(k, v) for k, v in by_case.items() if any(s in v for s in SHIMS)]
    if not rows:
        return ""
    shims = [s for s in SHIMS if any(s in v for _, v in rows)]
    # The original: 0.30.0's, or 0.34.0's where 0.30.0 has no path (fp8) or was not timed.
    head = "".join(f" {s} µs (seen) | × original | {s} µs (new tensors) | × original | × original (in turns) |"
                   for s in shims)
    lines = ["| where | rows | prefill cfg | original µs |" + head, "|" + "---|" * (4 + 5 * len(shims))]
    for (_, geo, n, flag), v in rows:
        o = next((v[name].eager_s for name in ORIGINALS if name in v), None)
        ratio = lambda x: f"{x / o:.2f}" if (o and x) else ""  # noqa: E731
        cells = []
        for name in shims:
            t = v.get(name, Timing())
            turns = f"{t.eager_paired_ratio:.2f}" if t.eager_paired_ratio else ""
            cells.append(f"{_us(t.eager_s)} | {ratio(t.eager_s)} | {_us(t.eager_new_tensors_s)} "
                         f"| {ratio(t.eager_new_tensors_s)} | {turns}")
        lines.append(f"| {geo} | {n} | {'yes' if flag else ''} | {_us(o)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(run: RunResult, path: pathlib.Path, op_kind: str) -> pathlib.Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    recs = [r for r in run.results if r.timing.device_s]
    if op_kind == "sparse":
        recs = [r for r in recs if r.case.op == "sparse_attention"]
        key = lambda r: r.case.geometry  # noqa: E731
        title = "sparse_attention"
    else:
        recs = [r for r in recs if r.case.op != "sparse_attention"]
        key = lambda r: f"{r.case.op} ring={r.case.ring}"  # noqa: E731
        title = "indexer ops"
    panels = list(dict.fromkeys(key(r) for r in recs))
    if not recs:
        return None
    fig, axes = plt.subplots(2, len(panels), figsize=(max(7.0, 5.2 * len(panels)), 8.5), squeeze=False)
    for j, panel in enumerate(panels):
        mine = [r for r in recs if key(r) == panel]
        for impl in IMPL_ORDER:
            for flag, style in ((False, "-o"), (True, "--s")):
                pts = sorted((r.case.rows, r.timing.device_s * 1e6, r.rates.pct_copy_bw or 0, check_text(r))
                             for r in mine if r.case.impl == impl and bool(r.case.use_prefill_config) == flag)
                if not pts:
                    continue
                label = impl + (" (prefill cfg)" if flag else "")
                x = [p[0] for p in pts]
                axes[0][j].plot(x, [p[1] for p in pts], style, color=COLORS.get(impl), label=label, ms=4)
                axes[1][j].plot(x, [p[2] for p in pts], style, color=COLORS.get(impl), label=label, ms=4)
                bad = [p for p in pts if "FAIL" in p[3] or "ERROR" in p[3]]
                if bad:
                    axes[0][j].plot([p[0] for p in bad], [p[1] for p in bad], "rx", ms=10, mew=2)
        axes[0][j].set_title(panel)
        axes[0][j].set_xscale("log", base=2)
        axes[0][j].set_yscale("log")
        axes[0][j].set_ylabel("device time per call (µs)")
        axes[1][j].set_xscale("log", base=2)
        axes[1][j].set_ylabel("% of measured copy bandwidth")
        axes[1][j].set_xlabel("rows")
        axes[1][j].set_ylim(bottom=0)
        for ax in axes[:, j]:
            ax.grid(True, which="both", alpha=0.3)
        axes[0][j].legend(fontsize=8)
    m = run.machine
    sup = (f"{title} — {m['card']} — {m['date']}\nmeasured copy BW {run.copy_bandwidth['gbps']:,.0f} GB/s"
           f" — N={run.settings['n_calls']} fresh input sets per timed unit")
    if run.not_a_gpu_measurement:
        sup += "\nNOT A GPU MEASUREMENT (CPU mode, reduced sizes)"
    fig.suptitle(sup)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(run: RunResult, out_dir: pathlib.Path, *, plot: bool = True) -> list[pathlib.Path]:
    """results.json, results.md and (with ``plot`` and matplotlib) the PNG plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    p = out_dir / "results.json"
    write_json(run, p)
    paths.append(p)
    p = out_dir / "results.md"
    p.write_text(markdown(run))
    paths.append(p)
    if plot:
        for kind, name in (("sparse", "sparse_attention.png"), ("indexer", "indexer_ops.png")):
            got = globals()["plot"](run, out_dir / name, kind)
            if got:
                paths.append(got)
    return paths
