"""Where the shim's eager host time goes (GPU): component timings and a cProfile.

    python3 tools/profile_shim.py [--rows 1] [--tp TP1]
    python3 tools/profile_shim.py --grid 1,8,64,512,2048 [--tp TP1]

Prints the eager latency of the original (when loadable) and of the shim with each
per-call stream fence (the fence import, and the FFI wait: notes/shim.md, Session 6),
the host time of each step of a shim call measured alone, and the top of a cProfile
of repeated shim calls (sorted by own time).

``--grid``: for each row count, the originals' eager call (call + sync) against the
shim's, with ``out=`` on the default route and on each forced route (copy: plain call +
torch copy; donate: ``out`` donated to the call; notes/shim.md, Session 7), and without
``out``; the ratio shim / original for each, and the worst over the grid. The
``triton-torch`` columns (session 9): ``implementation="triton-torch"``, qsa_jax's jax-triton
kernels launched by Triton on torch's stream (``qsa_torch_shim/_direct.py``); "shim default
route": no ``implementation=``, as vLLM calls it (triton-torch on CUDA since session 12). Every
other shim column names ``implementation="jax"``, the JAX route whose pieces it times.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pathlib
import pstats
import statistics
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import qsa_torch_shim as S  # noqa: E402
from qsa_jax import arg_specs  # noqa: E402
from qsa_torch_shim import _ffi_fence as F  # noqa: E402
from qsa_torch_shim import _interop as I  # noqa: E402
from qsa_torch_shim import _jax_side as J  # noqa: E402
from qsa_torch_shim import ops as O  # noqa: E402


# Without a GPU (a CPU check of this script and of the shim's host path): CPU tensors, JAX's
# CPU backend, a small pool; the CPU computation then waits inside the export.
_GPU = torch.cuda.is_available()
_sync = torch.cuda.synchronize if _GPU else (lambda: None)
_POOL = {} if _GPU else {"nb": 8, "w": 63, "dev": "cpu"}


def per_call_us(fn, n=300, sync=False):
    """Median over 5 runs of ``n`` calls (after 20 warm-up calls) of µs per call."""
    for _ in range(20):
        fn()
    _sync()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
            if sync:
                _sync()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    _sync()
    return statistics.median(samples)


def _inputs(g, rows, kv=None, nb=512, w=2051, dev="cuda"):
    """The call's tensors at ``rows`` (one request; ``w`` selected tokens per row) over a
    ``[nb, Hk, P, 2D]`` bf16 pool (made when ``kv`` is None)."""
    d, hk, p, h = g.head_dim, g.num_kv_heads, g.page_size, g.num_query_heads
    if kv is None:
        kv = torch.randn((nb, hk, p, 2 * d), device=dev).to(torch.bfloat16)
    k, v = kv.transpose(1, 2).split(d, -1)
    q = torch.randn((rows, h, d), device=dev).to(torch.bfloat16)
    li = torch.randint(0, nb * p, (rows, w + 1), device=dev, dtype=torch.int32)
    li[:, -1] = w
    bt = torch.randperm(nb, device=dev, dtype=torch.int32)[None, :].contiguous()
    t2r = torch.zeros((rows,), device=dev, dtype=torch.int32)
    return kv, (q, k, v, li, bt, t2r, False, torch.empty_like(q)), torch.randn_like(q)


ROUTES = (("default", None), ("copy", 1 << 40), ("donate", -1))


def _new_root(t: torch.Tensor) -> torch.Tensor:
    """A new tensor object (its own root) on ``t``'s memory: what a fresh activation is
    to the shim's caches, without an allocation or a copy in the timed loop."""
    return torch.empty((0,), dtype=t.dtype, device=t.device).set_(
        t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def grid(tp: str, row_counts: list[int], only: list[str] | None = None, fp8: bool = False) -> None:
    """Eager (call + sync) of the originals against the shim's routes, per row count;
    ``only``: these columns (and the ones they are compared with); ``fp8``: an e4m3 cache with
    k_scale 0.5 and v_scale 2.0, against vLLM 0.34.0 (0.30.0 has no fp8 path)."""
    from qsa_torch_shim import _eager as E

    g = arg_specs.GEOMETRIES[tp]
    try:
        from qsa_testing import originals

        orig = (originals.load("0.34.0") if fp8 else originals.load()) if _GPU else None  # no CPU launch
    except Exception as exc:  # noqa: BLE001
        print("original not loadable:", exc)
        orig = None
    kv = fp8_pool = None
    default_limit = E.OUT_COPY_MAX_BYTES[0]
    jax = dict(implementation="jax")  # the "shim out=" / "no out" / fence columns: the JAX route
    # (column, the column it is compared with)
    cols = [("original", None)] + [(f"shim out= {name}", "original") for name, _ in ROUTES] + [
        ("shim no out", "original"), ("original new q+gate", None),
        ("shim out= default new q+gate", "original new q+gate")] + [
        (f"shim out= default {fence} fence", "original") for fence in F.MODES if fence != "import"] + [
        ("shim triton-torch", "original"), ("shim triton-torch new q+gate", "original new q+gate"),
        ("shim default route", "original")]
    if only:
        unknown = set(only) - {c for c, _ in cols}
        if unknown:
            raise SystemExit(f"--columns: unknown {sorted(unknown)}; known: {[c for c, _ in cols]}")
        keep = set(only) | {base for c, base in cols if c in only and base}
        cols = [(c, base) for c, base in cols if c in keep]
    scales = dict(k_scale=0.5, v_scale=2.0) if fp8 else {}
    print(f"\neager call + sync, {tp}{' fp8 (x vLLM 0.34.0)' if fp8 else ''}, µs per call (median of 5 x n); "
          "x = shim / original; "
          f"default out= route: copy up to {default_limit} bytes, else donate; 'new q+gate': "
          "q and the gate are new tensor objects each call (vLLM's activations), both sides")
    ratios_of = [c for c, base in cols if base]
    print("| rows | out bytes | " + " | ".join(c for c, _ in cols) + " | " +
          " | ".join(f"x {c[5:]}" for c in ratios_of) + " |")
    print("|" + "---|" * (2 + len(cols) + len(ratios_of)))
    worst: dict[str, float] = {}
    for rows in row_counts:
        kv, args, gate = _inputs(g, rows, kv, **_POOL)
        if fp8:  # the same pool's values as e4m3 (converted once; kv keeps the bf16 pool)
            fp8_pool = kv.to(torch.float8_e4m3fn) if fp8_pool is None else fp8_pool
            args = (args[0], *fp8_pool.transpose(1, 2).split(g.head_dim, -1), *args[3:])
        q, rest = args[0], args[1:]
        n = 300 if rows <= 64 else 40
        calls = {
            "original": lambda: orig.qsa_sparse_paged_attention(*args, output_gate=gate, **scales),
            "shim no out": lambda: S.qsa_sparse_paged_attention(*args[:7], output_gate=gate, **jax, **scales),
            "original new q+gate": lambda: orig.qsa_sparse_paged_attention(
                _new_root(q), *rest, output_gate=_new_root(gate), **scales),
            "shim out= default new q+gate": lambda: S.qsa_sparse_paged_attention(
                _new_root(q), *rest, output_gate=_new_root(gate), **jax, **scales),
            # qsa_jax's jax-triton kernels launched by Triton on torch's stream (no JAX, no fence)
            "shim triton-torch": lambda: S.qsa_sparse_paged_attention(
                *args, output_gate=gate, implementation="triton-torch", **scales),
            "shim triton-torch new q+gate": lambda: S.qsa_sparse_paged_attention(
                _new_root(q), *rest, output_gate=_new_root(gate), implementation="triton-torch", **scales),
            # no implementation=, as vLLM calls it: the shim's default route for CUDA tensors
            "shim default route": lambda: S.qsa_sparse_paged_attention(*args, output_gate=gate, **scales),
        }
        found = {}
        for c, _ in cols:
            if c.startswith("original") and orig is None or "triton-torch" in c and not _GPU:
                continue  # no original here / triton-torch launches on CUDA tensors only
            route = dict(ROUTES).get(c[len("shim out= "):]) if c.startswith("shim out= ") else None
            E.OUT_COPY_MAX_BYTES[0] = default_limit if route is None else route
            fn = calls.get(c, lambda: S.qsa_sparse_paged_attention(*args, output_gate=gate, **jax, **scales))
            fence = c.split()[-2] if c.endswith(" fence") else "import"
            S.set_stream_fence(fence)
            F.FENCE.reset()
            fn()
            if fence != "import" and not F.FENCE.ffi:
                print(f"{fence}: FFI fence unavailable ({F.FENCE.reason}); column skipped")
            else:
                found[c] = per_call_us(fn, n=n, sync=True)
            S.set_stream_fence("import")
        E.OUT_COPY_MAX_BYTES[0] = default_limit
        ratios = []
        for c, base in cols:
            if base is None:
                continue
            r = found[c] / found[base] if base in found and c in found else float("nan")
            ratios.append(f"{r:.2f}")
            if r == r:  # not NaN (no original)
                worst[c] = max(worst.get(c, 0.0), r)
        print(f"| {rows} | {args[7].nbytes} | " + " | ".join(
            f"{found[c]:.1f}" if c in found else "-" for c, _ in cols) + " | " + " | ".join(ratios) + " |")
    print("worst ratio over the grid: " + ", ".join(f"{c[5:]} {r:.2f}x" for c, r in worst.items()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--tp", default="TP1")
    ap.add_argument("--grid", default=None, help="comma-separated row counts: the grid table only")
    ap.add_argument("--kv-dtype", default="bf16", choices=("bf16", "fp8"),
                    help="with --grid: the cache dtype (fp8: e4m3, scales 0.5 / 2.0, against vLLM 0.34.0)")
    ap.add_argument("--columns", default=None,
                    help="with --grid: comma-separated columns to time (default all; each with its baseline)")
    a = ap.parse_args()
    if a.grid:
        grid(a.tp, [int(r) for r in a.grid.split(",")], a.columns.split(",") if a.columns else None,
             fp8=a.kv_dtype == "fp8")
        return
    g = arg_specs.GEOMETRIES[a.tp]
    kv, args, gate = _inputs(g, a.rows, **_POOL)
    q, k, v, li, bt, t2r, _, out = args
    d, hk, h, dev = g.head_dim, g.num_kv_heads, g.num_query_heads, q.device
    shim = lambda: S.qsa_sparse_paged_attention(*args, output_gate=gate, implementation="jax")  # noqa: E731
    rows = []
    try:
        from qsa_testing import originals

        orig = originals.load()
        rows.append(("original eager (call + sync)", per_call_us(
            lambda: orig.qsa_sparse_paged_attention(*args, output_gate=gate), sync=True)))
        rows.append(("original host (no sync)", per_call_us(
            lambda: orig.qsa_sparse_paged_attention(*args, output_gate=gate))))
    except Exception as exc:  # noqa: BLE001
        print("original not loadable:", exc)
    shim_new = lambda: S.qsa_sparse_paged_attention(*args[:7], output_gate=gate, implementation="jax")  # noqa: E731
    for fence in F.MODES:
        S.set_stream_fence(fence)
        F.FENCE.reset()
        shim()
        _sync()
        if fence != "import" and not F.FENCE.ffi:
            print("FFI fence unavailable, the import ran:", F.FENCE.reason)
            continue
        rows.append((f"shim eager, {fence} fence, out= (call + sync)", per_call_us(shim, sync=True)))
        rows.append((f"shim host, {fence} fence, out= (no sync)", per_call_us(shim)))
        rows.append((f"shim host, {fence} fence, no out (no sync)", per_call_us(shim_new)))
        if fence != "import":
            same = F.FENCE.handler_thread == threading.get_ident()
            print(f"{fence}: FFI handler ran on the {'calling' if same else 'another'} thread "
                  f"(handled {F.FENCE.handled}, exports replaced by the signal "
                  f"{F.FENCE.signalled}, pending {F.pending()})")
    S.set_stream_fence("import")
    # vLLM's activations: q and the gate are new tensor objects every step (same memory).
    shim_fresh = lambda: S.qsa_sparse_paged_attention(  # noqa: E731
        _new_root(q), *args[1:], output_gate=_new_root(gate), implementation="jax")
    from qsa_torch_shim import _call_cache as CC

    calls_before = (CC.SPARSE_CALLS.hits, CC.SPARSE_CALLS.misses, I.ACTIVATIONS.misses)
    rows.append(("shim eager, out=, new q+gate objects (call + sync)", per_call_us(shim_fresh, sync=True)))
    rows.append(("shim host, out=, new q+gate objects (no sync)", per_call_us(shim_fresh)))
    print("new q+gate objects: call cache hits %d, misses %d; activation imports %d "
          "(expected: all hits after the first call, no new imports)" % tuple(
              now - before for now, before in zip(
                  (CC.SPARSE_CALLS.hits, CC.SPARSE_CALLS.misses, I.ACTIVATIONS.misses), calls_before)))
    rows.append(("  _new_root(q), _new_root(gate) (the benchmark's own cost)", per_call_us(
        lambda: (_new_root(q), _new_root(gate)))))
    rows.append(("  ACTIVATIONS.get(q) (unowned import, cached)", per_call_us(lambda: I.ACTIVATIONS.get(q))))
    small = torch.zeros((8,), device=dev, dtype=torch.int32)
    import jax

    rows.append(("  jax.dlpack.from_dlpack(small tensor)", per_call_us(lambda: jax.dlpack.from_dlpack(small))))
    rows.append(("  to_jax(small tensor)", per_call_us(lambda: I.to_jax(small))))
    rows.append(("  stream_fence", per_call_us(lambda: I.stream_fence(q.device))))
    rows.append(("  import_arg(q) (cached)", per_call_us(lambda: I.import_arg(q, "q"))))
    rows.append(("  _kv_arrays (cached)", per_call_us(lambda: O._kv_arrays(k, v))))
    rows.append(("  _check_sparse", per_call_us(lambda: O._check_sparse(q, k, v, li, bt, t2r, out, gate))))
    jargs = (I.import_arg(q, "q"), O._kv_arrays(k, v), I.import_arg(li, "li"), I.import_arg(bt, "bt"),
             I.import_arg(t2r, "t2r"), I.import_arg(gate, "gate"))
    res = J.sparse_new(I.stream_fence(q.device), *jargs, use_prefill_config=False, implementation=None)
    rows.append(("  jitted call, no donation (dispatch)", per_call_us(
        lambda: J.sparse_new(None, *jargs, use_prefill_config=False, implementation=None))))
    rows.append(("  jitted call + fence import", per_call_us(
        lambda: J.sparse_new(I.stream_fence(q.device), *jargs, use_prefill_config=False,
                             implementation=None))))
    rows.append(("  donated call (out import + dispatch)", per_call_us(
        lambda: J.sparse_into(I.to_jax(out), *jargs, use_prefill_config=False, implementation=None))))
    rows.append(("  to_torch(result) (public torch.from_dlpack)", per_call_us(lambda: I.to_torch(res[0]))))
    rows.append(("  to_torch(result, q) (fast export, session 7)", per_call_us(lambda: I.to_torch(res[0], q))))
    key_args = (q, k, v, li, bt, t2r, out, gate, None, None, "0.34")
    tensors = (q, k, v, li, bt, t2r, gate)
    rows.append(("  call cache: key + lookup (replaces checks + imports)", per_call_us(
        lambda: CC.SPARSE_CALLS.get(CC.sparse_key(*key_args), tensors))))
    rows.append(("  out.copy_(result) (copy route)", per_call_us(lambda: out.copy_(gate))))
    from qsa_torch_shim import _eager as E

    rows.append(("  out.copy_ + COPY_SOURCES.hold (copy route's tail)", per_call_us(
        lambda: E.COPY_SOURCES.hold(out.copy_(gate)))))
    S.set_stream_fence("ffi")
    if F.active(q.device):
        def ffi_call():
            return F.dispatch(q.device, False, J.sparse_new, None, *jargs, use_prefill_config=False,
                              implementation=None, ffi_fence=True)

        rows.append(("  jitted call + FFI wait (record, queue, dispatch)", per_call_us(ffi_call)))
        rows.append(("  jitted call + FFI wait + to_torch of its result", per_call_us(
            lambda: I.to_torch(ffi_call()[0]))))
        # Mode "ffi-signal" checks the result's pointer instead of exporting it: does that
        # wait for the launch (or the computation)? Not on CPU: there the handler runs on
        # XLA's worker thread and this call waits for the computation holding the GIL the
        # handler needs (a deadlock; the shim itself calls it only after ``await_signal``).
        _GPU and rows.append(("  jitted call + FFI wait + unsafe_buffer_pointer()", per_call_us(
            lambda: ffi_call()[0].unsafe_buffer_pointer())))

        def push_alone():  # record + queue, then take it back as the handler would
            key, entry, _ = F._push(q.device, False)
            F._PENDING[key].pop()
            F._SPARE[key[1]].append(entry[1])

        rows.append(("  FFI record + queue alone", per_call_us(push_alone)))
        rows.append(("  to_jax(out, ordered=False) (donated import, FFI fence)", per_call_us(
            lambda: I.to_jax(out, ordered=False))))
    S.set_stream_fence("import")
    # Does the export of a just-dispatched result wait for JAX's launch? Compare with
    # dispatch alone + export of a finished result (the two rows above).
    rows.append(("  jitted call + to_torch of its result", per_call_us(
        lambda: I.to_torch(J.sparse_new(None, *jargs, use_prefill_config=False,
                                        implementation=None)[0]))))
    qkv = torch.randn((a.rows, (h + 2 * hk) * d), device=dev).to(torch.bfloat16)
    q_view = qkv[:, :h * d].view(a.rows, h, d)
    rows.append(("  import_query(strided q of qkv) (cached)", per_call_us(lambda: I.import_query(q_view)[0])))
    rows.append(("shim host, q a view of qkv (no sync)", per_call_us(
        lambda: S.qsa_sparse_paged_attention(q_view, k, v, li, bt, t2r, False, out, output_gate=gate,
                                             implementation="jax"))))
    rows.append(("  .data_ptr() of an exported alias", per_call_us(lambda: I.to_torch(res[0]).data_ptr())))
    for fence in F.MODES:
        S.set_stream_fence(fence)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            shim()
        _sync()
        prof.disable()
        print(f"\n--- cProfile, {fence} fence, 300 calls with out=")
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    S.set_stream_fence("import")
    print(f"\nshim host profile, {a.tp} rows={a.rows} (µs per call, median of 5 x 300)")
    for name, us in rows:
        print(f"{name:58s} {us:9.1f}")
    found = dict(rows)
    for kind in ("eager", "host"):
        base = found.get("original eager (call + sync)" if kind == "eager" else
                         "original host (no sync)")
        for fence in F.MODES:
            mine = found.get(f"shim {kind}, {fence} fence, out= " +
                             ("(call + sync)" if kind == "eager" else "(no sync)"))
            if base and mine:
                print(f"shim / original, {kind}, {fence} fence, out=: {mine / base:.2f}x")


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown: once (CI, 2026-12-04, CPU, after the whole grid
    # had printed) a library thread aborted the exiting process ("terminate called without an
    # active exception", status -6); four reruns exited cleanly. An exception in main() still
    # exits nonzero through the normal path above.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
