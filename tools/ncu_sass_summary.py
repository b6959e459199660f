"""Summarise Nsight Compute's per-instruction SASS page: where a kernel's stalls and spills are.

    ncu -i REPORT.ncu-rep -k regex:NAME --page source --print-source sass --csv > k.csv
    python3 tools/ncu_sass_summary.py k.csv [other.csv ...]

Why (notes/pallas.md, "Session 8"): the CPU lowering (the venv's Triton and ptxas) does not
predict the register allocation of the kernel XLA compiles on the GPU with its own Triton --
the Pallas fp8 kernel spilled the shared-memory addresses of its async copies only there.
What settled it was the GPU-compiled SASS with executed counts and stall samples per line;
this prints, per file (one kernel):

* the stall reasons over all samples (``stall_*`` columns; long_sb = waiting on a global or
  local-memory load);
* executed instructions and stall samples by opcode;
* local-memory traffic (``LDL``/``STL``: spills) executed per loop-like iteration estimate;
* the async copies (``LDGSTS``) by width and by the form of their shared-memory address:
  ``[R+imm]`` (base register plus constant, as Triton 3.6 emits) or ``[R]`` (one register
  per copy, as XLA's Triton emitted for the Pallas fp8 kernel), with their stall samples.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys

# "Address","Source",... then per-line columns; the first row is "Kernel Name",<name>
_OPCODE = re.compile(r"^(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)")
_SHARED_DEST = re.compile(r"\[(R\d+|UR\d+)(\+0x[0-9a-f]+)?\]\s*$")


def _number(text: str) -> float:
    text = (text or "").replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return 0.0


def read_all(path: str) -> list[tuple[str, list[dict]]]:
    """[(kernel name, one dict per SASS line)] of an ``ncu --page source --csv`` file: one
    block per profiled launch, each opened by a ``"Kernel Name",<name>`` row."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    blocks, kernel, header = [], "?", None
    for r in rows:
        if r[:1] == ["Kernel Name"]:
            kernel, header = (r[1] if len(r) > 1 else "?"), None
        elif r[:2] == ["Address", "Source"]:
            header = r
            blocks.append((kernel, []))
        elif header is not None and len(r) == len(header):
            blocks[-1][1].append(dict(zip(header, r)))
    return blocks


def read(path: str) -> tuple[str, list[dict]]:
    """The first block of ``read_all``."""
    return read_all(path)[0]


def summarise(lines: list[dict]) -> dict:
    stall_cols = [c for c in (lines[0] if lines else {}) if c.startswith("stall_") and "Not Issued" not in c]
    stalls = collections.Counter()
    by_op = collections.defaultdict(lambda: [0.0, 0.0])  # opcode -> [executed, stall samples]
    copies = collections.defaultdict(lambda: [0, 0.0, 0.0])  # (width, form) -> [lines, executed, samples]
    samples = 0.0
    for line in lines:
        source = line.get("Source", "").strip()
        executed = _number(line.get("Instructions Executed"))
        sampled = _number(line.get("Warp Stall Sampling (All Samples)"))
        samples += sampled
        for c in stall_cols:
            stalls[c[len("stall_"):]] += _number(line[c])
        m = _OPCODE.match(source)
        if not m:
            continue
        op = m.group(1)
        by_op[op][0] += executed
        by_op[op][1] += sampled
        if op == "LDGSTS" and executed:
            width = m.group(2).split(".")[-1] or "?"
            dest = _SHARED_DEST.search(source.split(",")[-1]) or _SHARED_DEST.search(source)
            form = "?" if dest is None else ("[R+imm]" if dest.group(2) else "[R]")
            entry = copies[(width, form)]
            entry[0] += 1
            entry[1] += executed
            entry[2] += sampled
    return dict(samples=samples, stalls=stalls, by_op=dict(by_op), copies=dict(copies))


def report(kernel: str, s: dict, top: int = 12) -> str:
    out = [f"== {kernel}: {s['samples']:.0f} stall samples"]
    total = s["samples"] or 1.0
    out.append("  stall reasons: " + ", ".join(f"{k} {v / total:.1%}" for k, v in s["stalls"].most_common(6)))
    ops = sorted(s["by_op"].items(), key=lambda kv: -kv[1][0])
    out.append("  opcode        executed (M)  stall samples")
    for op, (executed, sampled) in ops[:top]:
        out.append(f"  {op:12s} {executed / 1e6:12.2f}  {sampled / total:6.1%}")
    local = {op: s["by_op"][op] for op in ("LDL", "STL") if op in s["by_op"]}
    out.append("  local memory (spills): " + (", ".join(
        f"{op} {ex / 1e6:.2f} M executed, {sm / total:.1%} of samples" for op, (ex, sm) in local.items()) or "none"))
    for (width, form), (count, executed, sampled) in sorted(s["copies"].items()):
        out.append(f"  LDGSTS .{width} {form}: {count} lines, {executed / 1e6:.2f} M executed, "
                   f"{sampled / total:.1%} of samples")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+", help="ncu --page source --print-source sass --csv output, one kernel each")
    ap.add_argument("--top", type=int, default=12, help="opcodes to list")
    a = ap.parse_args(argv)
    for path in a.csv:
        for kernel, lines in read_all(path):
            print(report(kernel, summarise(lines), a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
