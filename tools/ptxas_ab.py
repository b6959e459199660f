"""The same jax-triton PTX through two ptxas releases: which sm_90 table launches get other SASS.

    python3 tools/ptxas_ab.py --ptxas PATH [--kv fp8|bf16] [--rows TP1:4,16,64 --rows TP4:32] [--out DIR]

Why (session 27): jax-triton hands its PTX to jaxlib, which assembles it with XLA's ptxas
(``stream_executor::CompileGpuAsm``; CUDA 13.0 on the lent machines), while Triton's own launcher
(the shim's triton-torch route, and vLLM) assembles it with the ptxas that Triton bundles (12.8
with Triton 3.6). The PTX of the two routes is identical (session 27, call c), yet on an H100 the
JAX route's split kernel ran 1-4% longer at TP1 fp8 decode, and the torch route assembled with
the 13.0 ptxas (``TRITON_PTXAS_PATH``) ran as slow as JAX's in the one process that tried it
(call b). This compiles the split kernel for sm_90 at each launch the library's table picks
(``tools/sm90_split_kernel_ab.ours``, specialised as jax-triton does, at the geometry's real page
size), assembles the PTX with Triton's ptxas and with ``--ptxas`` (e.g. the CUDA 13.0 one of the
``nvidia-cuda-nvcc`` 13.0.88 wheel), and prints per launch: registers and spills under each,
SASS length, how many listing lines differ (instruction order included), whether the two use
the same instructions (as a multiset), and the tile loop's length under each. Both listings come
from Triton's ``cuobjdump``. No GPU needed.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

DEFAULT_ROWS = ("TP1:4,8,16,32,64,264,1024", "TP4:8,16,32,64,1024")
CONTEXT = 65536  # tokens per request, as bench.run draws them (the block table's width)


def listing(sass: str) -> list[str]:
    """The instructions of a ``cuobjdump -sass`` text, addresses and encodings dropped."""
    return [re.sub(r"\s+", " ", t).strip() for t in re.findall(r"/\*[0-9a-f]{4,6}\*/\s+(.*?;)", sass)]


def assemble(ptxas: str, ptx_path: str, cubin: str) -> dict:
    info = subprocess.run([ptxas, "-v", "-O3", "--gpu-name=sm_90a", ptx_path, "-o", cubin],
                          capture_output=True, text=True, check=True).stderr
    return dict(registers=int(re.search(r"Used (\d+) registers", info).group(1)),
                spills=int(re.search(r"(\d+) bytes spill stores", info).group(1)))


def opcodes(lines: list[str]) -> collections.Counter:
    return collections.Counter(re.sub(r"^@!?U?P\w+ ", "", t).split()[0] for t in lines)


def compare(ptx: str, out_dir: str, name: str, ptxas_a: str, ptxas_b: str, cuobjdump: str) -> dict:
    """Both assemblies of one PTX text: registers, spills, SASS, the lines that differ."""
    import sm90_ptx_fp8 as P

    path = os.path.join(out_dir, name + ".ptx")
    with open(path, "w") as f:
        f.write(ptx)
    res = {}
    for tag, ptxas in (("a", ptxas_a), ("b", ptxas_b)):
        cubin = os.path.join(out_dir, f"{name}.{tag}.cubin")
        res[tag] = assemble(ptxas, path, cubin)
        raw = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
        res[tag]["sass"] = listing(raw)
        try:
            res[tag]["loop"] = P.sass_loop(raw)[0]
        except ValueError:  # no backward branch: one tile per split, no loop
            res[tag]["loop"] = 0
    a, b = res["a"]["sass"], res["b"]["sass"]
    differing = sum(1 for line in difflib.unified_diff(a, b, lineterm="", n=0)
                    if line[:1] in "+-" and not line.startswith(("+++", "---")))
    return dict(a=res["a"], b=res["b"], differing=differing, same_ops=opcodes(a) == opcodes(b))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ptxas", required=True, help="the second ptxas (the first is Triton's bundled one)")
    ap.add_argument("--kv", default="fp8", choices=("fp8", "bf16"))
    ap.add_argument("--rows", action="append", default=None, help="GEOMETRY:rows,rows,... (repeatable)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import sm90_split_kernel_ab as A

    from qsa_jax import arg_specs, config

    ptxas_a = A.ptxas_path()
    cuobjdump = os.path.join(os.path.dirname(ptxas_a), "cuobjdump")
    version = {p: subprocess.run([p, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
               for p in (ptxas_a, a.ptxas)}
    out_dir = a.out or tempfile.mkdtemp(prefix="ptxas_ab_")
    os.makedirs(out_dir, exist_ok=True)
    fp8 = a.kv == "fp8"
    print(f"a = {ptxas_a} ({version[ptxas_a]})\nb = {a.ptxas} ({version[a.ptxas]})\n{a.kv} cache, sm_90's table, "
          f"files in {out_dir}\n")
    print("| where | rows | launch (block_n/splits/warps/stages) | regs a / b | spills a / b B | SASS a / b "
          "| lines differing | same instructions | loop a / b |")
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in a.rows or DEFAULT_ROWS:
        geo_name, rows_text = spec.split(":")
        geo = arg_specs.GEOMETRIES[geo_name]
        # The probe constants of sm90_split_kernel_ab stand for the real layout here.
        A.PAGE = geo.page_size
        A.BTW = -(-CONTEXT // geo.page_size)
        A.NUM_PAGES = 1000
        A.W = arg_specs.SELECTION_BLOCKS * 4 + 3
        for rows in (int(r) for r in rows_text.split(",")):
            programs = rows * geo.num_kv_heads
            c = config.select_config(rows, geo.num_kv_heads, False, A.W, fp8, capability=(9, 0))
            # The launch select_config settles on, with the table entry's stages.
            t = config.table_tiling(programs, False, is_fp8=fp8, capability=(9, 0))._replace(
                block_n=c.block_n, splits=c.num_splits, warps=c.num_warps)
            kernel = A.ours(geo, rows, t.block_n, t.splits, t.warps, "jax-triton", fp8=fp8, requests=rows,
                            stages=t.stages)
            r = compare(kernel.asm["ptx"], out_dir, f"{geo_name}_{rows}", ptxas_a, a.ptxas, cuobjdump)
            print(f"| {geo_name} | {rows} | {t.block_n}/{t.splits}/{t.warps}/{t.stages} "
                  f"| {r['a']['registers']} / {r['b']['registers']} | {r['a']['spills']} / {r['b']['spills']} "
                  f"| {len(r['a']['sass'])} / {len(r['b']['sass'])} | {r['differing']} "
                  f"| {'yes' if r['same_ops'] else 'no'} | {r['a']['loop']} / {r['b']['loop']} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
