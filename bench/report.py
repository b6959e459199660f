"""Results: JSON, markdown table and PNG plots."""

from __future__ import annotations

import json
import math
import pathlib

from bench import summarize

IMPL_ORDER = ("original", "original034", "xla", "pallas", "triton", "shim")
COLORS = {"original": "black", "original034": "tab:gray", "triton": "tab:blue", "pallas": "tab:orange", "xla": "tab:green",
          "shim": "tab:purple"}


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


def check_text(rec) -> str:
    if rec.get("error"):
        return "**ERROR**"
    chk = rec.get("check")
    if not chk:
        return "not checked"
    if str(chk.get("reference", "")).startswith("itself"):
        return "reference"
    if "rel_err" in chk:
        txt = f"{chk['rel_err']:.1e}"
        if chk.get("nan"):
            txt += f" {chk['nan']} NaN"
        if chk.get("nonzero_where_reference_zero"):
            txt += f" {chk['nonzero_where_reference_zero']} nonzero@0"
    elif "why" in chk:
        txt = chk["why"]
    else:
        txt = "exact" if chk.get("ok") else "mismatch " + ", ".join(
            f"{k}={v}" for k, v in chk.items() if k.startswith("mismatches"))
    return txt if chk.get("ok") else f"**FAIL** {txt}"


def one_line(rec) -> str:
    where = rec["geometry"] if rec["op"] == "sparse_attention" else f"{rec['op'].split('_')[0]} ring={rec['ring']}"
    flag = " prefill" if rec.get("use_prefill_config") else ""
    if rec.get("error"):
        return f"  {where} rows={rec['rows']}{flag} {rec['impl']}: ERROR"
    ratio = f" x{rec['ratio_to_original']:.2f}" if rec.get("ratio_to_original") else ""
    if rec.get("ratio_to_original034"):
        ratio += f" x{rec['ratio_to_original034']:.2f} of 0.34"
    return (f"  {where} rows={rec['rows']}{flag} {rec['impl']}: device {_us(rec.get('device_s'))} us, "
            f"eager {_us(rec.get('eager_s'))} us, {rec.get('pct_copy_bw', 0):.0f}% BW{ratio} [{check_text(rec)}]")


def finish(results: dict) -> None:
    n = len(results["results"])
    results["summary"] = {
        "records": n,
        "errors": sum(1 for r in results["results"] if r.get("error")),
        "check_failures": sum(1 for r in results["results"]
                              if r.get("check") and not r["check"].get("ok", True)),
        "compile_s_total": sum(r.get("compile_s", 0) + r.get("first_call_s", 0) for r in results["results"]),
        "wall_s_by_impl": {},
        "wall_s_by_op": {},
    }
    for r in results["results"]:
        for key, name in (("wall_s_by_impl", r["impl"]), ("wall_s_by_op", r["op"])):  # excl. parallel compiles
            d = results["summary"][key]
            d[name] = d.get(name, 0.0) + r.get("wall_s", 0.0)


def table(results: dict) -> str:
    head = ("| op | where | rows | prefill cfg | config (BLOCK_N, warps, tiles, splits) | impl | device µs/call "
            "| eager µs/call | GB/s | % copy BW | × 0.30.0 | × 0.34.0 | check |")
    lines = [head, "|" + "---|" * 13]
    for r in results["results"]:
        where = r["geometry"]
        cfg = "(" + ", ".join(str(x) for x in r["config"]) + ")" if r.get("config") else ""
        ratio = f"{r['ratio_to_original']:.2f}" if r.get("ratio_to_original") else ""
        ratio += " | " + (f"{r['ratio_to_original034']:.2f}" if r.get("ratio_to_original034") else "")
        lines.append(
            f"| {r['op']} | {where} | {r['rows']} | {'yes' if r.get('use_prefill_config') else ''} | {cfg} "
            f"| {r['impl']} | {_us(r.get('device_s'))} | {_us(r.get('eager_s'))} "
            f"| {r.get('gbps', 0):,.0f} | {r.get('pct_copy_bw', 0):.1f} | {ratio} | {check_text(r)} |")
    return "\n".join(lines)


def markdown(results: dict) -> str:
    m = results["machine"]
    v = m["versions"]
    cb = results["copy_bandwidth"]
    s = results["settings"]
    out = [f"# qsa-jax benchmark — {m['card']} — {m['date']}", ""]
    if results.get("not_a_gpu_measurement"):
        out += [f"> **{m['warning']}**", ""]
    out += [
        f"- card: {m['card']}; driver: {m.get('driver')}; host: {m['host']}; mode: {results['mode']}",
        "- versions: " + ", ".join(f"{k} {x}" for k, x in v.items() if x) + f", python {m['python']}",
        f"- commit: {m.get('git_commit')}{' (dirty tree)' if m.get('git_dirty') else ''}; "
        f"run took {results.get('wall_s', 0):.0f} s",
        f"- measured device-copy bandwidth: **{cb['gbps']:,.0f} GB/s** ({cb['method']}; bytes read + written)",
        f"- N = {s['n_calls']} calls per timed unit, each with a fresh input set; eager median over "
        f"{s['eager_calls']} calls",
        "",
        "Method: " + "; ".join(f"**{k}**: {x}" for k, x in results["method"].items()),
        "",
        "Byte model (GB/s and % copy bandwidth): " + "; ".join(
            f"**{k}**: {x}" for k, x in results["byte_model"].items()),
        "",
        "Geometries: " + "; ".join(
            f"{tp}: H={g['num_query_heads']} Hk={g['num_kv_heads']} D={g['head_dim']} P={g['page_size']} "
            f"W={g['selection_width']} context={g['context_tokens']} pool={g['pool_bytes'] / 2**30:.2f} GiB"
            for tp, g in s["geometries"].items()),
        "",
        "Implementations: " + "; ".join(
            f"{op}: " + ", ".join(f"{k} {x}" for k, x in st.items() if x != "not requested")
            for op, st in results["implementations"].items()),
        "",
    ]
    sm = results.get("summary", {})
    if sm.get("errors") or sm.get("check_failures"):
        out += [f"**{sm.get('errors', 0)} case(s) raised and {sm.get('check_failures', 0)} failed the check "
                "(marked in the table).**", ""]
    out += ["## Summary", "", summarize.summary_table(results), ""]
    eager = eager_table(results)
    if eager:
        out += ["## Host cost: eager call of the shim vs the original", "",
                "Wall time of one call from Python plus a device sync (median). *seen*: every tensor "
                "object was passed before (a serving loop's persistent buffers); *new tensors*: q, the "
                "gate and the indices are objects never seen before (vLLM's activations).", "",
                eager, ""]
    busy = busy_table(results)
    if busy:
        out += ["## GPU busy time at small sizes (profiler trace)", "",
                "At these sizes a JAX executable's host-side cost per run (launching, argument and "
                "output buffers) can exceed the GPU work of its N calls, so the wall clock of the "
                "JAX chain measures the launcher. The trace gives the GPU's own time: the sum of the "
                "kernel durations per call (method: *busy*). The originals' graph replays have no "
                "launch gaps, so their graph time and busy time agree.", "", busy, ""]
    out += ["## All cases", "", table(results), ""]
    return "\n".join(out)


def print_and_write(text: str, path: str | None) -> None:
    """Print a small tool's markdown report, and write it to ``path`` when given."""
    print(text)
    if path:
        pathlib.Path(path).write_text(text)


def busy_table(results: dict) -> str:
    """Per case with a trace: the original's graph and busy time, pallas/triton wall and busy time
    and busy-time ratio to the original ('' when the run took no trace)."""
    by_case: dict = {}
    for r in results["results"]:
        if r.get("busy_s"):
            key = (r["op"], r["geometry"], r["rows"], bool(r.get("use_prefill_config")))
            by_case.setdefault(key, {})[r["impl"]] = r
    if not by_case:
        return ""
    lines = ["| op | where | rows | 0.30.0 graph µs | 0.30.0 busy µs | 0.34.0 busy µs | pallas wall µs "
             "| pallas busy µs | pallas busy × 0.30.0 | × 0.34.0 | × faster original | triton busy µs "
             "| triton busy × 0.30.0 |", "|" + "---|" * 13]
    for (op, geo, n, flag), v in by_case.items():
        o = v.get("original", {})
        ob, ob34 = o.get("busy_s"), v.get("original034", {}).get("busy_s")
        fastest = min(x for x in (ob, ob34, float("inf")) if x)
        ratio = lambda x, base=ob: f"{x / base:.2f}" if (base and x and base != float("inf")) else ""  # noqa: E731
        p, t = v.get("pallas", {}), v.get("triton", {})
        lines.append(f"| {op} | {geo} | {n}{' (prefill cfg)' if flag else ''} | {_us(o.get('device_s'))} "
                     f"| {_us(ob)} | {_us(ob34)} | {_us(p.get('device_s'))} | {_us(p.get('busy_s'))} "
                     f"| {ratio(p.get('busy_s'))} | {ratio(p.get('busy_s'), ob34)} "
                     f"| {ratio(p.get('busy_s'), fastest)} | {_us(t.get('busy_s'))} | {ratio(t.get('busy_s'))} |")
    return "\n".join(lines)


def eager_table(results: dict) -> str:
    """original vs shim eager latency per sparse-attention case ('' when the run has no shim)."""
    by_case: dict = {}
    for r in results["results"]:
        if r["op"] == "sparse_attention" and r["impl"] in ("original", "shim") and r.get("eager_s"):
            by_case.setdefault((r["geometry"], r["rows"], bool(r.get("use_prefill_config"))), {})[r["impl"]] = r
    rows = [(k, v) for k, v in by_case.items() if "shim" in v]
    if not rows:
        return ""
    lines = ["| where | rows | prefill cfg | original µs | shim µs (seen) | × original | "
             "shim µs (new tensors) | × original |", "|" + "---|" * 8]
    for (geo, n, flag), v in rows:
        o = v.get("original", {}).get("eager_s")
        s, f = v["shim"]["eager_s"], v["shim"].get("eager_new_tensors_s")
        ratio = lambda x: f"{x / o:.2f}" if (o and x) else ""  # noqa: E731
        lines.append(f"| {geo} | {n} | {'yes' if flag else ''} | {_us(o)} | {_us(s)} | {ratio(s)} "
                     f"| {_us(f)} | {ratio(f)} |")
    return "\n".join(lines)


def plot(results: dict, path: pathlib.Path, op_kind: str) -> pathlib.Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    recs = [r for r in results["results"] if r.get("device_s")]
    if op_kind == "sparse":
        recs = [r for r in recs if r["op"] == "sparse_attention"]
        panels = list(dict.fromkeys(r["geometry"] for r in recs))
        key = lambda r: r["geometry"]  # noqa: E731
        title = "sparse_attention"
    else:
        recs = [r for r in recs if r["op"] != "sparse_attention"]
        panels = list(dict.fromkeys(f"{r['op']} ring={r['ring']}" for r in recs))
        key = lambda r: f"{r['op']} ring={r['ring']}"  # noqa: E731
        title = "indexer ops"
    if not recs:
        return None
    fig, axes = plt.subplots(2, len(panels), figsize=(max(7.0, 5.2 * len(panels)), 8.5), squeeze=False)
    for j, panel in enumerate(panels):
        mine = [r for r in recs if key(r) == panel]
        for impl in IMPL_ORDER:
            for flag, style in ((False, "-o"), (True, "--s")):
                pts = sorted((r["rows"], r["device_s"] * 1e6, r.get("pct_copy_bw", 0), check_text(r))
                             for r in mine if r["impl"] == impl and bool(r.get("use_prefill_config")) == flag)
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
    m = results["machine"]
    sup = (f"{title} — {m['card']} — {m['date']}\nmeasured copy BW {results['copy_bandwidth']['gbps']:,.0f} GB/s"
           f" — N={results['settings']['n_calls']} fresh input sets per timed unit")
    if results.get("not_a_gpu_measurement"):
        sup += "\nNOT A GPU MEASUREMENT (CPU mode, reduced sizes)"
    fig.suptitle(sup)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _clean(obj):
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(results: dict, path: pathlib.Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_clean(results), indent=1) + "\n")
    tmp.replace(path)


def write_all(results: dict, out_dir: pathlib.Path, *, plot: bool = True) -> list[pathlib.Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    p = out_dir / "results.json"
    write_json(results, p)
    paths.append(p)
    p = out_dir / "results.md"
    p.write_text(markdown(results))
    paths.append(p)
    if plot:
        for kind, name in (("sparse", "sparse_attention.png"), ("indexer", "indexer_ops.png")):
            got = globals()["plot"](results, out_dir / name, kind)
            if got:
                paths.append(got)
    return paths
