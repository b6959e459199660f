"""Render the README summary table from a benchmark results JSON.

    python -m bench.summarize bench/results/<card>_<date>/results.json

``summary_table(results)`` is the function; the command prints its markdown.
"""

from __future__ import annotations

import argparse
import pathlib

from bench.records import AUTO, ORIGINALS, CaseResult, RunResult, load

IMPL_ORDER = ("original", "original034", "xla", "pallas", "triton", AUTO, "shim", "shim-tt", "shim-jax")
# What runs through XLA, whose host work can set the pace of a JAX chain (``_host_bound``); the
# originals and the shim's torch routes launch from torch.
_THROUGH_XLA = ("xla", "pallas", "triton", AUTO, "shim-jax")


# A JAX wall clock this much above the GPU busy time of the same case is XLA's host work.
HOST_BOUND_RATIO = 1.2


def _host_bound(r: CaseResult) -> bool:
    dev, busy = r.timing.device_s, r.timing.busy_s
    return bool(dev and busy and r.case.impl in _THROUGH_XLA and dev > HOST_BOUND_RATIO * busy)


def _eager_loop(r: CaseResult) -> bool:
    return str(r.timing.method or "").startswith("eager loop")


def ratio_to_faster_original(r: CaseResult) -> float | None:
    """Device time over the faster original's of the same case (0.30.0 or 0.34.0, whichever ran
    there: fp8 has 0.34.0 only), or None without one."""
    ratios = [x for x in (r.rates.ratio_to_original, r.rates.ratio_to_original034) if x]
    return max(ratios) if ratios else None  # the faster original's time is the smaller one


def _cell(r: CaseResult | None, with_ratio: bool) -> str:
    if r is None:
        return ""
    if r.error:
        return "error"
    dev = r.timing.device_s
    if not dev:
        return ""
    txt = f"{dev * 1e6:,.1f} µs, {r.rates.pct_copy_bw or 0:.0f}%"
    ratio = ratio_to_faster_original(r) if with_ratio else None
    if ratio:
        txt += f", ×{ratio:.2f}"
    if _eager_loop(r):
        txt += " †"
    if _host_bound(r):
        txt += f" ‡ (GPU busy {r.timing.busy_s * 1e6:,.1f} µs)"
    if r.check is not None and not r.check.ok:
        txt += " **FAIL**"
    return txt


def summary_table(run: RunResult) -> str:
    """Markdown: per op and geometry, rows x implementation -> device µs/call, % copy BW, × original."""
    m = run.machine
    recs = run.results
    impls = [i for i in IMPL_ORDER if any(r.case.impl == i for r in recs)]
    lines = []
    note = " — NOT a GPU measurement (CPU mode, reduced sizes)" if run.not_a_gpu_measurement else ""
    lines.append(f"Device time per call, % of measured copy bandwidth "
                 f"({run.copy_bandwidth['gbps']:,.0f} GB/s) and ratio to the faster original (vLLM 0.30.0 "
                 f"or 0.34.0, whichever ran faster; fp8: 0.34.0), on "
                 f"{m['card']} ({m['date']}, N={run.settings['n_calls']} fresh input sets per timed "
                 f"unit){note}.")
    groups = list(dict.fromkeys((r.case.op, r.case.geometry) for r in recs))
    for op, where in groups:
        mine = [r for r in recs if r.case.op == op and r.case.geometry == where]
        by_key = {(r.case.rows, bool(r.case.use_prefill_config), r.case.impl): r for r in reversed(mine)}
        keys = list(dict.fromkeys((r.case.rows, bool(r.case.use_prefill_config)) for r in mine))
        lines += ["", f"**{op} — {where}**", "",
                  "| rows | " + " | ".join(impls) + " |", "|---|" + "---|" * len(impls)]
        for rows, flag in keys:
            cells = [_cell(by_key.get((rows, flag, impl)), impl not in ORIGINALS) for impl in impls]
            lines.append(f"| {rows}{' (prefill cfg)' if flag else ''} | " + " | ".join(cells) + " |")
    if any(_eager_loop(r) for r in recs):
        lines += ["", "† timed as N eager calls launched back to back (CUDA events), not a CUDA graph: "
                      "the shim's JAX route cannot be captured in one (its triton-torch route is timed the same "
                      "way, for one method across its routes); where its host cost per call exceeds the "
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
    print(summary_table(load(a.results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
