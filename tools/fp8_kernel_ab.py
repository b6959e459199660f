"""Time the Pallas fp8 sparse-attention kernel against vLLM 0.34.0's at fixed tilings, kernel by kernel.

    python3 tools/fp8_kernel_ab.py [--programs 256,1024,2048] [--geometries TP1,TP4]
        [--impl pallas|triton|auto] [--configs table,32/4/1/2] [--knob NAME[+NAME...]]...
        [--prefill] [--kv-dtype fp8|bf16] [--out DIR]

Why (notes/pallas.md, session 7): the fp8 sweep compares each implementation at its own
best tiling; to find *where* our kernel loses, this times both at the same tilings
(``block_n/splits/warps/stages``), on the same fresh selections (bench.hopper_sweep's
``Case``: fp8 e4m3 cache, k/v scales 0.5 / 2.0), and reports the busy time per call split
by kernel name (attention kernel, merge, anything else XLA launches), from one profiler
trace per job (``bench.kernel_trace``). ``table`` in --configs is the launch the public
call picks itself (``config.H200_FP8`` on an H200). Each ``--knob NAME`` (``A+B``: several
together; the option repeats) adds a run of every Pallas config with those
``qsa_jax.config`` functions forced True and the other knobs named forced False, after
the run with all of them False; each is checked bit for bit against that first run
(the knobs' contract) besides its error from exact attention. Session 35: ``NAME=VALUE`` forces
a knob that returns a number (``triton_fp8_register_cap=224``) to that integer, and to None
in the runs that do not name it. ``--impl`` (session 8): the
implementation timed -- ``pallas`` (default), ``triton`` (jax-triton; a tiling may add the
merge's D chunk and warps, ``32/4/1/2/256/2``) or ``auto`` (``table`` only:
``implementation=None``, the library's own choice). Session 9: ``--prefill`` passes
``use_prefill_config=True`` to 0.34.0 and to the library's ``table`` call; ``--kv-dtype
bf16`` times a bf16 cache without scales instead (0.34.0's bf16 path the comparator).
Session 11: ``original`` (with ``--impl triton``) is jax-triton at the comparator's own tiling
for each case (0.34.0's ``_select_config``: block_n, splits, warps; 2 stages as 0.34.0 launches),
with the library's jax-triton launch defaults; ``original-np`` the same without the next tile's
index prefetch (0.34.0's kernel has none). Writes ``ab.json`` to --out; since session 21 a ``table`` run records the table entry it
started from (``table_tiling``: block_n, splits, warps, stages, implementation). Needs the GPU and the originals (QSA_ORIGINALS_DIR).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", default="256,1024,2048")
    ap.add_argument("--geometries", default="TP1,TP4")
    ap.add_argument("--configs", default="table", help="'table' or block_n/splits/warps/stages, comma-separated")
    ap.add_argument("--knob", action="append", default=[],
                    help="qsa_jax.config function(s) to switch on, A+B; NAME=VALUE forces an integer")
    ap.add_argument("--n-sets", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--impl", default="pallas", choices=("pallas", "triton", "auto"),
                    help="implementation timed ('auto': implementation=None, the library's choice; "
                         "explicit tilings: pallas or triton); a jax-triton spec may add a 5th and "
                         "6th field, the merge's D chunk and warps")
    ap.add_argument("--kv-dtype", default="fp8", choices=("fp8", "bf16"),
                    help="the cache: e4m3 with scales 0.5 / 2.0 (default), or bf16 without scales")
    ap.add_argument("--prefill", action="store_true",
                    help="use_prefill_config=True for 0.34.0 and for the library's table ('table' configs)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import jax
    import numpy as np
    import torch

    from bench import hopper_sweep as hs
    from bench import inputs, kernel_trace, records
    from qsa_jax import config
    from qsa_jax.ops.sparse_attention.api import _run as jitted_call
    from qsa_jax.ops.sparse_attention.triton import _launch_plan as jax_triton_plans
    from qsa_testing import originals

    variants = []
    merge_d = {}  # variant key -> the jax-triton merge's D chunk (5th field of a spec)
    for spec in a.configs.split(","):
        if spec == "table":
            variants.append(None)
            continue
        if spec in ("original", "original-np"):
            if a.impl != "triton":
                ap.error(f"--configs {spec}: needs --impl triton")
            variants.append((spec, None))  # the tiling is the case's own (below)
            continue
        fields = [int(x) for x in spec.split("/")]
        if a.impl == "auto" or len(fields) not in ((4, 5, 6) if a.impl == "triton" else (4,)):
            ap.error(f"--configs {spec}: an explicit tiling needs --impl pallas or triton, as "
                     "block_n/splits/warps/stages (jax-triton: optionally /merge_block_d[/merge_warps])")
        v = hs.Variant(block_n=fields[0], splits=fields[1], warps=fields[2], stages=fields[3])
        if len(fields) > 4:
            merge_d[spec] = tuple(fields[4:6])
        variants.append((spec, v))
    mods = {"0.34.0": originals.load("0.34.0")}
    pools = {}
    for name in a.geometries.split(","):
        geo = inputs.geometry(name, cpu=False, pool_gb=2.0)
        pools[name] = (geo,) + inputs.make_pool(geo, gpu=True, seed=11 + len(pools),
                                                  fp8=a.kv_dtype == "fp8")
    knob_sets = [()] + [tuple(k.split("+")) for k in a.knob]
    forced = knob_values(knob_sets)
    knobs = sorted({name for values in forced for name in values})  # knob_values checked each name
    saved = {name: getattr(config, name) for name in knobs}
    results = []

    def table_fn(case):
        """N sequential public calls with the tiling and launch the library picks."""
        import qsa_jax
        from bench.timing import sequential_calls

        scales = dict(zip(("k_scale", "v_scale"), case.scales or ()))

        def chain(q, kv, idx_sets, bt, t2r, gate):
            return sequential_calls(lambda i: qsa_jax.sparse_attention(
                q, kv, i, bt, t2r, gate, implementation=None if a.impl == "auto" else a.impl,
                use_prefill_config=a.prefill, **scales), idx_sets)
        return jax.jit(chain)

    def triton_fn(case, spec, v):
        """N sequential public jax-triton calls at ``v``'s tiling, stages and merge chunk."""
        import qsa_jax
        from bench.timing import sequential_calls

        cfg = (v.block_n, v.warps, -(-case.width // v.block_n), v.splits)
        merge = merge_d.get(spec, ()) + (None, None)
        launch = qsa_jax.TritonLaunch(num_stages=v.stages, merge_block_d=merge[0], merge_warps=merge[1],
                                      prefetch=False if spec == "original-np" else None)
        scales = dict(zip(("k_scale", "v_scale"), case.scales or ()))

        def chain(q, kv, idx_sets, bt, t2r, gate):
            return sequential_calls(lambda i: qsa_jax.sparse_attention(
                q, kv, i, bt, t2r, gate, config=cfg, implementation="triton", launch=launch, **scales), idx_sets)
        return jax.jit(chain)

    def traced(run, wait):
        s = kernel_trace.trace_runs(run, runs=a.runs, calls_per_run=a.n_sets, wait=wait)
        return None if s is None else dict(busy_us=s.busy_us_per_call, by_kernel=s.mean_us_by_kernel)

    for programs in (int(x) for x in a.programs.split(",")):
        for geo_name in a.geometries.split(","):
            per_head = 2 if geo_name == "TP1" else 1  # TP1: 2 KV heads; TP4: 1
            rows = programs // per_head
            case = hs.Case(geo_name, rows, a.n_sets, pools, mods, seed=programs + per_head, scales=hs.FP8_SCALES if a.kv_dtype == "fp8" else None)
            run, _ = case.original_calls("0.34.0", a.prefill)
            run()
            torch.cuda.synchronize()
            orig = traced(run, lambda _: torch.cuda.synchronize())
            line = dict(programs=programs, geometry=geo_name, rows=rows,
                        original_config=case.original_config("0.34.0", a.prefill), prefill=a.prefill,
                        original=orig, runs=[])
            print(f"{geo_name} {programs} programs{' prefill' if a.prefill else ''}: "
                  f"0.34.0 {case.original_config('0.34.0', a.prefill)} "
                  f"{orig and round(orig['busy_us'], 1)} us", flush=True)
            for entry in variants:
                spec, v = (None, None) if entry is None else entry
                if spec in ("original", "original-np"):
                    bn, warps, _, splits = case.original_config("0.34.0", a.prefill)
                    v = hs.Variant(block_n=bn, splits=splits, warps=warps, stages=2)
                outs = {}
                key = f"table({a.impl})" if v is None else f"{a.impl} {spec}"
                for knob_set, values in zip(knob_sets, forced):
                    knob = "+".join(knob_set) or "off"
                    for name in knobs:
                        setattr(config, name, lambda *args, _k=values.get(name, False), **kw: _k)
                    jitted_call.clear_cache()  # the knobs are read while the call is traced
                    if a.impl != "pallas":  # and into the jax-triton launch plans
                        jax_triton_plans.cache_clear()
                    try:
                        build = (table_fn(case) if v is None else
                                 triton_fn(case, spec, v) if a.impl == "triton" else hs.build_fn(case, v))
                        fn = build.lower(*case.args).compile()
                    finally:
                        for name, f in saved.items():
                            setattr(config, name, f)
                    out = jax.block_until_ready(fn(*case.args))[0]
                    outs[knob] = np.asarray(jax.device_get(out))
                    got = torch.from_dlpack(out)[: case.exact_rows]
                    t = traced(lambda fn=fn: fn(*case.args), jax.block_until_ready)
                    rec = dict(variant=key if v is None else dict(dataclasses.asdict(v), spec=spec), knob=knob, timing=t,
                               err_exact=hs.rel_err(got, case.exact))
                    if v is None:  # the table entry this run started from (it changes between
                        # sessions; select_config then caps the splits at the tiles): rows x KV
                        # heads, not --programs, which an odd count at TP1 rounds down. A Pallas
                        # run records the splits and warps Pallas launches (pallas_splits /
                        # pallas_warps; since session 35, before it the entry's own).
                        entry = config.table_tiling(rows * per_head, a.prefill, is_fp8=a.kv_dtype == "fp8")
                        if a.impl == "pallas":
                            entry = entry.as_pallas_launches()
                        rec["table_tiling"] = list(entry[:5])
                    line["runs"].append(rec)
                    kernels = ", ".join(f"{n[:40]} {us:.1f}" for n, us in sorted((t or {}).get("by_kernel", {}).items(),
                                                                                  key=lambda kv: -kv[1]))
                    ratio = t["busy_us"] / orig["busy_us"] if t and orig else float("nan")
                    print(f"  {key} knob={knob}: {t and round(t['busy_us'], 1)} us ({ratio:.2f}x) "
                          f"err {rec['err_exact']:.3e} [{kernels}]", flush=True)
                for knob in list(outs)[1:]:
                    same = outs[knob].tobytes() == outs["off"].tobytes()
                    line.setdefault("knob_bit_identical", {})[f"{key} {knob}"] = same
                    print(f"  {knob} bit-identical to off at {key}: {same}", flush=True)
            results.append(line)
            records.dump_json(a.out, "ab.json", results)
    return 0


def knob_values(knob_sets) -> list[dict]:
    """Per knob set, the value each named ``qsa_jax.config`` function is forced to return: True
    for ``NAME``, the integer for ``NAME=VALUE``; a knob a set does not name returns False there
    (None for a numeric one: a number's knob takes any false value for "not set")."""
    from qsa_jax import config

    out = []
    for knob_set in knob_sets:
        values = {}
        for item in knob_set:
            name, _, value = item.partition("=")
            if not callable(getattr(config, name, None)):
                raise ValueError(f"--knob {item}: no such function in qsa_jax.config")
            values[name] = int(value) if value else True
        out.append(values)
    numeric = {name for values in out for name, v in values.items() if v is not True}
    for values in out:
        for name in numeric:
            values.setdefault(name, None)
    return out


if __name__ == "__main__":
    sys.exit(main())
