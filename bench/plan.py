"""What a benchmark run measures: its settings (from the command line), which implementations
can run here and why not, and the list of cases in the order they are measured."""

from __future__ import annotations

import dataclasses

from bench.records import AUTO, SHIMS, Case
from qsa_jax.arg_specs import BENCH_ROWS, INDEXER_RING, INDEXER_RING_SPECULATIVE

OPS = ("sparse_attention", "compress_groups_with_ratio", "store_cache_rows")
OP_ALIASES = {"sparse": "sparse_attention", "attention": "sparse_attention",
              "compress": "compress_groups_with_ratio", "store": "store_cache_rows",
              **{op: op for op in OPS}}
# "shim": the shim as vLLM calls it (no implementation=: on CUDA tensors, its default route
# "triton-torch" since session 12). The sparse attention only, with the route named:
# "shim-tt" implementation="triton-torch" (the jax-triton kernels launched by Triton on torch's
# stream; qsa_torch_shim/_direct.py), "shim-jax" implementation="jax" (the JAX route, DLPack).
SHIM_TT = "shim-tt"
SHIM_JAX = "shim-jax"
SHIM_ROUTES = {SHIM_TT: "triton-torch", SHIM_JAX: "jax"}
assert SHIMS == ("shim", *SHIM_ROUTES)
IMPLS = ("original", "original034", "xla", "pallas", "triton", AUTO, *SHIMS)
# The vLLM release each torch-side original is loaded from.
ORIGINAL_VERSIONS = {"original": "0.30.0", "original034": "0.34.0"}
TPS = ("TP1", "TP2", "TP4")
KV_DTYPES = ("bf16", "fp8")
SHIM_FUNCS = {"sparse_attention": "qsa_sparse_paged_attention",
              "compress_groups_with_ratio": "qsa_compress_groups_with_ratio",
              "store_cache_rows": "qsa_store_cache_rows"}

GPU_ROWS = BENCH_ROWS  # 1 .. 4096
GPU_INDEXER_ROWS = (1, 4, 16, 64, 256, 512, 1024, 4096, 8192)
CPU_ROWS = (1, 4, 16, 64)
CPU_INDEXER_ROWS = (1, 16, 256)
QUICK = {"gpu": dict(rows=(1, 64, 1024, 4096), indexer_rows=(1, 512, 8192), rings=(4,),
                     n_calls=10, eager_calls=10),
         "cpu": dict(rows=(1, 16), indexer_rows=(1, 64), rings=(4,), tps=("TP1", "TP4"),
                     n_calls=3, eager_calls=3)}
# use_prefill_config changes the sparse-attention config only above this many rows x KV heads.
PREFILL_MIN_ROW_HEADS = 2048


def _csv(s, cast=str):
    return tuple(cast(x) for x in s.split(",") if x.strip()) if s else None


@dataclasses.dataclass(frozen=True)
class Settings:
    """The run's choices: the command line's, or the defaults of the mode (GPU / CPU, quick)."""

    gpu: bool
    ops: tuple[str, ...]
    tps: tuple[str, ...]
    kv_dtypes: tuple[str, ...]
    rows: tuple[int, ...]
    indexer_rows: tuple[int, ...]
    rings: tuple[int, ...]
    n_calls: int
    eager_calls: int
    requested: tuple[str, ...] | None  # --impl, or None: every implementation that can run
    prefill: str
    pool_gb: float
    seed: int
    quick: bool
    shim_graph: bool
    trace_rows: int
    cold_l2: bool = False  # sparse attention: every set its own requests, sets beyond the L2 (measure_sparse)

    @property
    def mode(self) -> str:
        return "gpu" if self.gpu else "cpu"

    @classmethod
    def from_args(cls, args, gpu: bool) -> Settings:
        """Bad values exit with a message naming the flag, before anything is loaded."""
        quick = QUICK["gpu" if gpu else "cpu"] if args.quick else {}
        for name in _csv(args.op) or ():
            if name not in OP_ALIASES:
                raise SystemExit(f"--op: unknown op {name!r}; choose from sparse, compress, store")
        s = cls(
            gpu=gpu,
            ops=tuple(dict.fromkeys(OP_ALIASES[o] for o in (_csv(args.op) or OPS))),
            tps=_csv(args.tp) or quick.get("tps") or TPS,
            kv_dtypes=_csv(args.kv_dtype) or (KV_DTYPES if gpu else ("bf16",)),
            rows=_csv(args.rows, int) or quick.get("rows") or (GPU_ROWS if gpu else CPU_ROWS),
            indexer_rows=(_csv(args.indexer_rows, int) or quick.get("indexer_rows")
                          or (GPU_INDEXER_ROWS if gpu else CPU_INDEXER_ROWS)),
            rings=_csv(args.ring, int) or quick.get("rings") or (INDEXER_RING, INDEXER_RING_SPECULATIVE),
            n_calls=args.n_calls or quick.get("n_calls") or (20 if gpu else 4),
            eager_calls=args.eager_calls or quick.get("eager_calls") or (20 if gpu else 5),
            requested=_csv(args.impl), prefill=args.prefill, pool_gb=args.pool_gb, seed=args.seed,
            quick=args.quick, shim_graph=args.shim_graph, cold_l2=args.cold_l2,
            trace_rows=args.trace_rows if args.trace_rows is not None else (64 if gpu else 0))
        for tp in s.tps:
            if tp not in TPS:
                raise SystemExit(f"--tp: unknown geometry {tp!r}; choose from TP1, TP2, TP4")
        if min(s.rows) < 1 or min(s.indexer_rows) < 1 or min(s.rings) < 4:
            raise SystemExit("--rows / --indexer-rows must be >= 1 and --ring >= 4 (the compress ratio)")
        for name in s.kv_dtypes:
            if name not in KV_DTYPES:
                raise SystemExit(f"--kv-dtype: unknown dtype {name!r}; choose from {KV_DTYPES}")
        for name in s.requested or ():
            if name not in IMPLS:
                raise SystemExit(f"--impl: unknown implementation {name!r}; choose from {IMPLS}")
        return s

    def prefill_flags(self, rows: int, num_kv_heads: int) -> tuple[bool, ...]:
        """The use_prefill_config values a sparse case runs with (``--prefill``)."""
        if self.prefill == "false":
            return (False,)
        if self.prefill == "true":
            return (True,)
        return (False, True) if rows * num_kv_heads > PREFILL_MIN_ROW_HEADS else (False,)


@dataclasses.dataclass(frozen=True)
class Backends:
    """The torch-side modules that loaded (the originals by impl name, the shim), and for
    the others why not."""

    modules: dict
    why_not: dict

    @classmethod
    def load(cls, settings: Settings, torch_cuda: tuple[bool, str]) -> Backends:
        modules, why = {}, {}
        torch_impls = (*ORIGINAL_VERSIONS, *SHIMS)
        if not settings.gpu:
            why = {name: "CPU mode: the originals are Triton kernels that need CUDA" for name in ORIGINAL_VERSIONS}
            why.update(dict.fromkeys(SHIMS, "CPU mode: the shim is timed on CUDA tensors only"))
        elif not torch_cuda[0]:
            why = dict.fromkeys(torch_impls, torch_cuda[1])
        else:
            from qsa_testing import originals

            for name, version in ORIGINAL_VERSIONS.items():
                try:
                    modules[name] = originals.load(version=version)
                except Exception as exc:  # OriginalsUnavailable or anything its import raises
                    why[name] = f"{type(exc).__name__}: {exc}"
            try:
                import qsa_torch_shim

                modules["shim"] = qsa_torch_shim
                for name, route in SHIM_ROUTES.items():
                    modules[name] = RoutedShim(qsa_torch_shim, route)
            except Exception as exc:
                why.update(dict.fromkeys(SHIMS, f"import qsa_torch_shim failed: {type(exc).__name__}: {exc}"))
        return cls(modules, why)


class RoutedShim:
    """The shim's sparse attention with ``implementation=route`` (what a user passes to take
    that route), as a module-like object for the torch-side measurement."""

    def __init__(self, shim, route: str):
        self._shim, self.route = shim, route

    def qsa_sparse_paged_attention(self, *args, **kwargs):
        return self._shim.qsa_sparse_paged_attention(*args, implementation=self.route, **kwargs)


def implementation_status(settings: Settings, backends: Backends) -> dict[str, dict[str, str]]:
    """{op: {impl: 'available' | 'not requested' | 'unavailable: <why>'}}, every impl listed."""
    import qsa_jax
    from qsa_jax import _implementations

    status = {}
    for op in settings.ops:
        status[op] = {}
        avail = qsa_jax.available_implementations(op)
        for name in IMPLS:
            if settings.requested is not None and name not in settings.requested:
                status[op][name] = "not requested"
                continue
            if name == "original034" and op != "sparse_attention":
                why = "the same kernels as 0.30.0 (0.34.0 changed only the sparse attention)"
            elif name == AUTO:
                why = ("sparse attention only" if op != "sparse_attention" else
                       "CPU mode: it is xla there (name it in --impl to time it)"
                       if not settings.gpu and settings.requested is None else None)
            elif name in backends.why_not:
                why = backends.why_not[name]
            elif name in SHIMS:
                why = None if hasattr(backends.modules[name], SHIM_FUNCS[op]) \
                    else f"qsa_torch_shim has no {SHIM_FUNCS[op]}" if name == "shim" \
                    else f"sparse attention only (implementation={SHIM_ROUTES[name]!r} is that operator's route)"
            elif name in ORIGINAL_VERSIONS:
                why = None
            elif name in avail:
                why = None
                if not settings.gpu and name != "xla" and settings.requested is None:
                    why = "CPU mode: interpreter not timed by default (name it in --impl to time it)"
            else:
                try:
                    why = _implementations.REGISTRIES[op].why_not(name) or "not available"
                except Exception as exc:
                    why = repr(exc)
            if why is not None:
                why = str(why).strip().splitlines()[0][:300]
            status[op][name] = "available" if why is None else f"unavailable: {why}"
    return status


def cases(settings: Settings, status: dict[str, dict[str, str]], geometries: dict) -> list[Case]:
    """Every case of the run, in the order it is measured: grouped so that the cases sharing
    inputs are adjacent (one pool per cache dtype and geometry, one input set per row count)
    and, within a shape, the originals first (the others' ratios are taken against them)."""
    def impls(op):
        return [name for name, st in status.get(op, {}).items() if st == "available"]

    out = []
    if "sparse_attention" in settings.ops:
        for kv_dtype in settings.kv_dtypes:
            # vLLM 0.30.0 has no fp8 path: 0.34.0 is the comparator there
            names = [i for i in impls("sparse_attention") if not (kv_dtype == "fp8" and i == "original")]
            for tp in settings.tps:
                for rows in settings.rows:
                    for flag in settings.prefill_flags(rows, geometries[tp].num_kv_heads):
                        out += [Case("sparse_attention", rows, impl, tp=tp, kv_dtype=kv_dtype,
                                     use_prefill_config=flag) for impl in names]
    for op in ("compress_groups_with_ratio", "store_cache_rows"):
        if op in settings.ops:
            for ring in settings.rings:
                for rows in settings.indexer_rows:
                    out += [Case(op, rows, impl, ring=ring) for impl in impls(op)]
    return out
