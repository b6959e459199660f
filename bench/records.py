"""Typed records of a benchmark run, and their JSON form (``results.json``).

A run measures a list of :class:`Case` (one operator call shape on one implementation).
Each gives a :class:`CaseResult`: the inputs' :class:`Workload`, the :class:`Timing`, the
:class:`Check` against the reference, the :class:`Rates` derived from them, or the error it
raised. :class:`RunResult` holds the machine, the settings and the results.

The JSON form is flat per result (one object of every field that has a value), as the
files under ``bench/results/`` have it since the first run: ``to_json`` writes it and
``from_json`` reads every committed file back to records that write the same JSON again.
Keys a record does not know are kept in ``extra`` so an older or newer file still loads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
from typing import Any

# The torch-side originals (vLLM releases): every other implementation's ratios are taken
# against them.
ORIGINALS = ("original", "original034")
# The shim as vLLM calls it, and its sparse attention with a route named (bench/plan.py).
SHIMS = ("shim", "shim-tt", "shim-jax")
SPARSE = "sparse_attention"
# qsa_jax.sparse_attention(implementation=None): the library's own choice (jax-triton for an
# fp8 cache at the measured Hopper table's one-warp entries up to 2048 programs, else Pallas).
AUTO = "auto"


def _fields(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _set_fields(obj) -> dict:
    """The fields that have a value (``None`` means "not measured" and is left out of the JSON)."""
    return {k: getattr(obj, k) for k in _fields(type(obj)) if getattr(obj, k) is not None}


def _take(cls, d: dict, used: set):
    """``cls`` from the keys of ``d`` named like its fields; marks them in ``used``."""
    got = {k: d[k] for k in _fields(cls) if k in d}
    used.update(got)
    return cls(**got)


@dataclasses.dataclass(frozen=True)
class Case:
    """What is measured: one operator at one shape on one implementation.

    Sparse attention: ``tp`` (the head geometry), ``kv_dtype`` and ``use_prefill_config``;
    the indexer ops: ``ring`` (slots per ring). ``kv_dtype`` is None in files written
    before fp8 caches were measured (they are bf16).
    """

    op: str
    rows: int
    impl: str
    tp: str | None = None
    kv_dtype: str | None = None
    use_prefill_config: bool | None = None
    ring: int | None = None

    @property
    def geometry(self) -> str:
        """The label of the table column 'where': ``TP1``, ``TP1 fp8`` or ``ring4``."""
        if self.op == SPARSE:
            return f"{self.tp} fp8" if self.kv_dtype == "fp8" else str(self.tp)
        return f"ring{self.ring}"

    @property
    def label(self) -> str:
        """The progress line's name of the case."""
        if self.op == SPARSE:
            return f"{self.tp} rows={self.rows}{' prefill' if self.use_prefill_config else ''} {self.impl}"
        return f"{self.op.split('_')[0]} ring={self.ring} rows={self.rows} {self.impl}"

    def to_json(self) -> dict:
        d = {"op": self.op, "geometry": self.geometry}
        if self.kv_dtype is not None:
            d["kv_dtype"] = self.kv_dtype
        d["rows"] = self.rows
        if self.use_prefill_config is not None:
            d["use_prefill_config"] = self.use_prefill_config
        if self.ring is not None:
            d["ring"] = self.ring
        d["impl"] = self.impl
        return d

    @classmethod
    def from_json(cls, d: dict, used: set) -> Case:
        sparse = d["op"] == SPARSE
        case = cls(op=d["op"], rows=d["rows"], impl=d["impl"],
                   tp=d["geometry"].split()[0] if sparse else None, kv_dtype=d.get("kv_dtype"),
                   use_prefill_config=d.get("use_prefill_config"), ring=d.get("ring"))
        if case.geometry != d["geometry"]:  # the label is derived: a file must agree with it
            raise ValueError(f"result record: geometry {d['geometry']!r} does not match its case {case}")
        used.update(k for k in ("op", "geometry", "kv_dtype", "rows", "use_prefill_config", "ring", "impl")
                    if k in d)
        return case


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one call of the case moves: the launch configuration the shape selects (sparse
    attention), and the byte model's count (``bytes_per_call['total']`` and its parts)."""

    bytes_per_call: dict
    config: tuple | None = None
    config_fields: tuple | None = None
    valid_entries_per_call: float | None = None

    def to_json(self) -> dict:
        d = _set_fields(self)
        for k in ("config", "config_fields"):
            if k in d:
                d[k] = list(d[k])
        order = ("config", "config_fields", "bytes_per_call", "valid_entries_per_call")  # as the files have it
        return {**{k: d.pop(k) for k in order if k in d}, **d}

    @classmethod
    def from_json(cls, d: dict, used: set) -> Workload:
        w = _take(cls, d, used)
        return dataclasses.replace(w, config=None if w.config is None else tuple(w.config),
                                   config_fields=None if w.config_fields is None else tuple(w.config_fields))


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds (per call unless named otherwise) and how they were taken; None = not taken."""

    first_call_s: float | None = None  # the checked first call, compile included
    compile_s: float | None = None  # the N-call function (JAX)
    prepare_s: float | None = None  # all JAX implementations of the case, compiled in parallel
    compile_note: str | None = None
    eager_s: float | None = None  # median of one call + sync
    eager_min_s: float | None = None
    eager_calls: int | None = None
    eager_new_tensors_s: float | None = None  # the shim, on tensor objects never seen before
    # The shim and the case's original timed in alternating blocks (timing.eager_latency_paired):
    eager_paired_s: float | None = None
    eager_paired_original_s: float | None = None
    eager_paired_ratio: float | None = None  # median over the rounds of shim / original
    eager_paired_with: str | None = None  # which original ("original": 0.30.0, "original034")
    device_s: float | None = None  # the N-call unit's time / N
    reps: int | None = None
    method: str | None = None  # how device_s was taken
    busy_s: float | None = None  # GPU busy time from a profiler trace
    busy_kernels_us: dict | None = None
    busy_median_gap_us: float | None = None
    wall_s: float | None = None  # this record's whole measurement (excl. the parallel compiles)

    def to_json(self) -> dict:
        return _set_fields(self)

    @classmethod
    def from_json(cls, d: dict, used: set) -> Timing:
        return _take(cls, d, used)


# The bit-exact comparison's per-output keys: exact_0, mismatches_0, rel_err_0, exact_1, ...
_PER_OUTPUT = re.compile(r"^(exact|mismatches|rel_err)_(\d+)$")


@dataclasses.dataclass(frozen=True)
class Check:
    """One case's output against the reference (see bench/README.md "check").

    Sparse attention: the fidelity numbers (``rel_err``, ``ulp_fraction``, ``nan``, ...) and,
    where exact float64 rows were computed, the accuracy contract (``contract='accuracy'``,
    which then decides ``ok``). Compress/store: per output, bit-exact or the number of
    mismatches (``exact``, ``mismatches``, ``output_rel_err`` by output index).
    """

    ok: bool
    reference: str
    contract: str | None = None
    rel_err: float | None = None
    ulp_fraction: float | None = None
    nan: int | None = None
    nonzero_where_reference_zero: int | None = None
    fidelity_ok: bool | None = None
    exact_rows: int | None = None
    err_exact: float | None = None
    err_exact_reference: float | None = None
    exact_ratio: float | None = None
    why: str | None = None
    exact: tuple[bool, ...] | None = None
    mismatches: dict[int, int] | None = None
    output_rel_err: dict[int, float] | None = None

    @property
    def is_reference(self) -> bool:
        """This case's output was the reference the others were checked against."""
        return self.reference.startswith("itself")

    def to_json(self) -> dict:
        d = _set_fields(self)
        for name, key in (("exact", "exact"), ("mismatches", "mismatches"), ("output_rel_err", "rel_err")):
            values = d.pop(name, None)
            if values is not None:
                items = enumerate(values) if name == "exact" else values.items()
                d.update({f"{key}_{k}": v for k, v in items})
        return d

    @classmethod
    def from_json(cls, d: dict) -> Check:
        per: dict[str, dict[int, Any]] = {"exact": {}, "mismatches": {}, "rel_err": {}}
        plain = {}
        for k, v in d.items():
            m = _PER_OUTPUT.match(k)
            if m:
                per[m.group(1)][int(m.group(2))] = v
            else:
                plain[k] = v
        unknown = set(plain) - set(_fields(cls))
        if unknown:
            raise ValueError(f"check record: unknown keys {sorted(unknown)}")
        return cls(**plain,
                   exact=tuple(per["exact"][k] for k in sorted(per["exact"])) if per["exact"] else None,
                   mismatches=per["mismatches"] or None, output_rel_err=per["rel_err"] or None)


@dataclasses.dataclass(frozen=True)
class Rates:
    """Derived from the timing: bandwidth by the byte model, and ratios to the originals
    measured just before in the same case (> 1 is slower)."""

    gbps: float | None = None
    pct_copy_bw: float | None = None  # of the copy bandwidth measured at the start of the run
    ratio_to_original: float | None = None  # device time / 0.30.0's
    ratio_to_original034: float | None = None  # device time / 0.34.0's
    eager_ratio_to_original: float | None = None

    @classmethod
    def of(cls, timing: Timing, workload: Workload, copy_gbps: float, originals: dict[str, Timing]) -> Rates:
        """``originals``: the Timing of each original measured in the same case."""
        o30, o34 = originals.get("original"), originals.get("original034")
        eager_ratio = None
        if timing.eager_s and o30 is not None and o30.eager_s:
            eager_ratio = timing.eager_s / o30.eager_s
        dev = timing.device_s
        if not dev:
            return cls(eager_ratio_to_original=eager_ratio)
        gbps = workload.bytes_per_call["total"] / dev / 1e9
        return cls(gbps=gbps, pct_copy_bw=100.0 * gbps / copy_gbps,
                   ratio_to_original=dev / o30.device_s if o30 is not None and o30.device_s else None,
                   ratio_to_original034=dev / o34.device_s if o34 is not None and o34.device_s else None,
                   eager_ratio_to_original=eager_ratio)

    def to_json(self) -> dict:
        return _set_fields(self)

    @classmethod
    def from_json(cls, d: dict, used: set) -> Rates:
        return _take(cls, d, used)


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """One measured case. ``error`` (and ``traceback``) when it raised: the numbers taken
    before the error stay. A failing case is kept, never dropped."""

    case: Case
    workload: Workload
    timing: Timing = Timing()
    check: Check | None = None
    rates: Rates = Rates()
    error: str | None = None
    traceback: str | None = None
    warnings: tuple[str, ...] | None = None
    extra: dict = dataclasses.field(default_factory=dict)  # JSON keys of no field (kept)

    @property
    def failed(self) -> bool:
        """Raised, or failed its check: the run's exit status is 1."""
        return bool(self.error) or (self.check is not None and not self.check.ok)

    def to_json(self) -> dict:
        d = {**self.case.to_json(), **self.workload.to_json(), **self.timing.to_json()}
        d.pop("wall_s", None)  # written after the check, where the old files have it
        if self.warnings is not None:
            d["warnings"] = list(self.warnings)
        if self.check is not None:
            d["check"] = self.check.to_json()
        if self.error is not None:
            d.update(error=self.error, traceback=self.traceback)
        if self.timing.wall_s is not None:
            d["wall_s"] = self.timing.wall_s
        d.update(self.rates.to_json())
        d.update(self.extra)
        return d

    @classmethod
    def from_json(cls, d: dict) -> CaseResult:
        used = {"check", "error", "traceback", "warnings"}
        case = Case.from_json(d, used)
        workload = Workload.from_json(d, used)
        timing = Timing.from_json(d, used)
        rates = Rates.from_json(d, used)
        return cls(case=case, workload=workload, timing=timing,
                   check=None if d.get("check") is None else Check.from_json(d["check"]), rates=rates,
                   error=d.get("error"), traceback=d.get("traceback"),
                   warnings=None if d.get("warnings") is None else tuple(d["warnings"]),
                   extra={k: v for k, v in d.items() if k not in used})


@dataclasses.dataclass(frozen=True)
class RunResult:
    """A whole run. The header (machine, settings, implementation status, byte model,
    method) is free-form JSON as written by ``bench.run``; ``results`` are typed."""

    machine: dict
    mode: str
    not_a_gpu_measurement: bool
    copy_bandwidth: dict
    settings: dict
    implementations: dict
    byte_model: dict
    method: dict
    results: tuple[CaseResult, ...] = ()
    interrupted: bool | None = None
    wall_s: float | None = None
    summary: dict | None = None

    @property
    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if r.failed]

    def with_summary(self) -> RunResult:
        """The counts and totals stored under ``summary`` in the JSON."""
        rs = self.results
        summary = {
            "records": len(rs),
            "errors": sum(1 for r in rs if r.error),
            "check_failures": sum(1 for r in rs if r.check is not None and not r.check.ok),
            "compile_s_total": sum((r.timing.compile_s or 0) + (r.timing.first_call_s or 0) for r in rs),
            "wall_s_by_impl": {},
            "wall_s_by_op": {},
        }
        for r in rs:  # excl. the parallel compiles
            for key, name in (("wall_s_by_impl", r.case.impl), ("wall_s_by_op", r.case.op)):
                summary[key][name] = summary[key].get(name, 0.0) + (r.timing.wall_s or 0.0)
        return dataclasses.replace(self, summary=summary)

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in ("machine", "mode", "not_a_gpu_measurement", "copy_bandwidth",
                                           "settings", "implementations", "byte_model", "method")}
        d["results"] = [r.to_json() for r in self.results]
        for k in ("interrupted", "wall_s", "summary"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d

    @classmethod
    def from_json(cls, d: dict) -> RunResult:
        return cls(**{k: v for k, v in d.items() if k != "results"},
                   results=tuple(CaseResult.from_json(r) for r in d["results"]))


def load(path: str | pathlib.Path) -> RunResult:
    """A ``results.json`` (or ``results.partial.json``) as records."""
    return RunResult.from_json(json.loads(pathlib.Path(path).read_text()))


def _clean(obj):
    """JSON has no NaN or infinity: they are written as strings."""
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(run: RunResult, path: pathlib.Path) -> None:
    """Atomically (a reader of the partial file never sees half of it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_clean(run.to_json()), indent=1) + "\n")
    tmp.replace(path)


def dump_json(folder: str | None, name: str, obj) -> None:
    """Write ``obj`` as ``folder/name`` (indented; unknown types as strings); no-op without a
    folder. The tools rewrite their file after every case, so a run cut short keeps its cases."""
    if not folder:
        return
    import json
    import os

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as f:
        json.dump(obj, f, indent=1, default=str)
