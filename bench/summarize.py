"""Render the README summary table from a benchmark results JSON.

    python -m bench.summarize bench/results/<card>_<date>/results.json

``summary_table(results)`` is the function; the command prints its markdown.
"""

from __future__ import annotations

import argparse
import json
import pathlib

IMPL_ORDER = ("original", "xla", "pallas", "triton", "shim")


# A JAX wall clock this much above the GPU busy time of the same case is XLA's host work.
HOST_BOUND_RATIO = 1.2


def _host_bound(r) -> bool:
    dev, busy = r.get("device_s"), r.get("busy_s")
    return bool(dev and busy and r["impl"] != "original" and dev > HOST_BOUND_RATIO * busy)


def _cell(r, with_ratio: bool) -> str:
    if r is None:
        return ""
    if r.get("error"):
        return "error"
    dev = r.get("device_s")
    if not dev:
        return ""
    txt = f"{dev * 1e6:,.1f} µs, {r.get('pct_copy_bw', 0):.0f}%"
    if with_ratio and r.get("ratio_to_original"):
        txt += f", ×{r['ratio_to_original']:.2f}"
    if str(r.get("method", "")).startswith("eager loop"):
        txt += " †"
    if _host_bound(r):
        txt += f" ‡ (GPU busy {r['busy_s'] * 1e6:,.1f} µs)"
    chk = r.get("check")
    if chk and not chk.get("ok", True):
        txt += " **FAIL**"
    return txt


def summary_table(results: dict) -> str:
    """Markdown: per op and geometry, rows x implementation -> device µs/call, % copy BW, × original."""
    m = results["machine"]
    recs = results["results"]
    impls = [i for i in IMPL_ORDER if any(r["impl"] == i for r in recs)]
    lines = []
    note = " — NOT a GPU measurement (CPU mode, reduced sizes)" if results.get("not_a_gpu_measurement") else ""
    lines.append(f"Device time per call, % of measured copy bandwidth "
                 f"({results['copy_bandwidth']['gbps']:,.0f} GB/s) and ratio to the original, on "
                 f"{m['card']} ({m['date']}, N={results['settings']['n_calls']} fresh input sets per timed "
                 f"unit){note}.")
    groups = list(dict.fromkeys((r["op"], r["geometry"]) for r in recs))
    for op, where in groups:
        mine = [r for r in recs if r["op"] == op and r["geometry"] == where]
        keys = list(dict.fromkeys((r["rows"], bool(r.get("use_prefill_config"))) for r in mine))
        lines += ["", f"**{op} — {where}**", "",
                  "| rows | " + " | ".join(impls) + " |", "|---|" + "---|" * len(impls)]
        for rows, flag in keys:
            cells = []
            for impl in impls:
                r = next((x for x in mine if x["impl"] == impl and x["rows"] == rows
                          and bool(x.get("use_prefill_config")) == flag), None)
                cells.append(_cell(r, impl != "original"))
            lines.append(f"| {rows}{' (prefill cfg)' if flag else ''} | " + " | ".join(cells) + " |")
    if any(str(r.get("method", "")).startswith("eager loop") for r in recs):
        lines += ["", "† timed as N eager calls launched back to back (CUDA events), not a CUDA graph: "
                      "its JAX work cannot be captured in one; where its host cost per call exceeds the "
                      "device time, this is the host cost."]
    if any(_host_bound(r) for r in recs):
        lines += ["", f"‡ wall clock more than {HOST_BOUND_RATIO}× the GPU busy time of the same calls "
                      "(profiler trace): XLA's host work per execution set the pace, not the kernels; "
                      "compare the busy time."]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=pathlib.Path, help="results.json written by python -m bench.run")
    a = p.parse_args(argv)
    print(summary_table(json.loads(a.results.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
