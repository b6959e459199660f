"""sm_90 registers, spills and the arrival's PTX/SASS of the fused-merge forward (no GPU).

    python tools/sm90_fused_merge.py [--out DIR]

For the decode cases of the H200 table (TP1 1/2/4/8 rows, TP4 1/4/16 rows) the forward is
lowered for sm_90 as an H200 would launch it (tools/sm90_forward_ir.py), once with the
separate merge (two kernels) and once with ``PallasLaunch(merge="fused")`` (one kernel), and
each kernel's Triton IR is compiled with the venv's Triton 3.6 for ``GPUTarget("cuda", 90,
32)``; ``ptxas -v`` gives registers and spills. For the fused kernel it also prints the PTX
and SASS around the arrival atomic: the barrier before it, the release/acquire fences and
the L1 invalidation that make the other programs' partials visible to the last arrival.
Caveat: on the GPU XLA compiles the Triton IR with its own bundled Triton.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

# (name, rows, query heads, KV heads): the <= 16-program decode buckets.
CASES = (("tp1_r1", 1, 24, 2), ("tp1_r2", 2, 24, 2), ("tp1_r4", 4, 24, 2), ("tp1_r8", 8, 24, 2),
         ("tp4_r1", 1, 6, 1), ("tp4_r4", 4, 6, 1), ("tp4_r16", 16, 6, 1))


def arrival_context(text: str, pattern: str, before: int, after: int) -> str:
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if re.search(pattern, line)]
    return "\n".join(lines[max(0, hits[0] - before):hits[0] + after]) if hits else "(no match)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="keep the TTIR/PTX/SASS here (default: a temporary folder)")
    a = ap.parse_args()
    import glob

    import triton

    import qsa_jax
    import sm90_forward_ir as IR
    from sm90_ptx_fp8 import compile_ttir, ptxas_numbers

    IR.patch_for_sm90("h200")
    ptxas_path = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))[0]
    out = a.out or tempfile.mkdtemp()
    os.makedirs(out, exist_ok=True)
    print("| case | merge | kernel | warps | stages | registers | spill st/ld B |")
    print("|---|---|---|---|---|---|---|")
    shown = False
    for name, rows, heads, hk in CASES:
        for merge in ("separate", "fused"):
            text = IR.lower_case(f"{name}_{merge}", rows, heads, hk, "fused", "bf16", None,
                                 qsa_jax.PallasLaunch(merge=merge))
            attrs, *kernels = text.split("\n\n")
            for attr, ttir in zip(attrs.splitlines(), kernels):
                kname, s, w = re.match(r"(\w+): num_stages=(\d+) num_warps=(\d+)", attr).groups()
                kernel, path = compile_ttir(ttir, kname, int(w), int(s), out, f"{name}_{merge}")
                ptx_path = path + ".ptx"
                with open(ptx_path, "w") as f:
                    f.write(kernel.asm["ptx"])
                info, sass = ptxas_numbers(ptxas_path, ptx_path)
                print(f"| {name} | {merge} | {kname} | {w} | {s} | {info['registers']} | "
                      f"{info['spill_stores']}/{info['spill_loads']} |", flush=True)
                if merge == "fused" and not shown:
                    shown = True
                    print("\nPTX around the arrival:\n" + arrival_context(kernel.asm["ptx"], r"atom\.", 12, 14))
                    print("\nSASS around the arrival:\n" + arrival_context(sass, r"\bATOM", 12, 14) + "\n")
    print(f"files: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
