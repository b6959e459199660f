#!/usr/bin/env python3
"""Check the versions in pip ``--report`` files: ``REPORT name=version ... [-- REPORT ...]``.

Used by tools/check_vllm_pins.sh. Prints what each resolution chose for the
packages that matter and exits 1 on any mismatch.
"""

from __future__ import annotations

import json
import sys

WATCH = ("torch", "triton", "jax", "jaxlib", "jax-triton", "numpy")


def check(report: str, wanted: list[str]) -> bool:
    chosen = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
              for item in json.load(open(report))["install"]}
    ok = True
    for pair in wanted:
        name, version = pair.split("=")
        if chosen.get(name) != version:
            print(f"FAIL  {report}: {name} {chosen.get(name)}, expected {version}")
            ok = False
    print(("ok    " if ok else "      ") + report.rsplit("/", 1)[-1] + ": "
          + ", ".join(f"{n} {chosen[n]}" for n in WATCH if n in chosen))
    return ok


def main(argv: list[str]) -> int:
    groups, current = [], []
    for arg in argv + ["--"]:
        if arg == "--":
            groups.append(current)
            current = []
        else:
            current.append(arg)
    results = [check(g[0], g[1:]) for g in groups if g]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
