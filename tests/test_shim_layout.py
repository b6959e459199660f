"""qsa_torch_shim's structure: no import cycle, every private JAX/torch internal in
``_private_api``, and the fast import route is the one that runs on this stack.

If a jax/torch upgrade breaks a private internal, the shim keeps working through
the public route, more slowly; ``test_fast_import_route_runs`` is what makes that
loud.
"""

from __future__ import annotations

import ast
import pathlib
import warnings

import numpy as np
import pytest
import torch

import qsa_torch_shim as S
from qsa_torch_shim import _interop as I
from qsa_torch_shim import _private_api as P
from qsa_testing import cases as C
from qsa_testing import golden
from qsa_testing.torch_interop import kv_views, to_numpy, to_torch

PACKAGE = pathlib.Path(S.__file__).parent
MODULES = {p.stem: p for p in sorted(PACKAGE.glob("*.py"))}


def _shim_imports(path: pathlib.Path) -> set[str]:
    """Sibling modules ``path`` imports, at any depth (function-level imports too);
    names imported from the package itself count as an import of ``__init__``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "qsa_torch_shim":
                for alias in node.names:
                    found.add(alias.name if alias.name in MODULES else "__init__")
            elif node.module.startswith("qsa_torch_shim."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("qsa_torch_shim."):
                    found.add(alias.name.split(".")[1])
    found.discard(path.stem)
    return found


def test_no_import_cycle():
    graph = {name: _shim_imports(path) for name, path in MODULES.items()}
    state: dict[str, int] = {}

    def visit(name, trail):
        if state.get(name) == 1:
            pytest.fail("import cycle in qsa_torch_shim: " + " -> ".join(trail + [name]))
        if state.get(name) == 2:
            return
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            visit(dep, trail + [name])
        state[name] = 2

    for name in graph:
        visit(name, [])
    # The two that used to import each other.
    assert "ops" not in graph["_torch_ops"] and "_torch_ops" in graph["ops"]


# Private names of JAX and torch the shim may only touch in _private_api.
PRIVATE_ATTRS = {"_C", "_src", "_base", "_to_dlpack", "_cuda_getCurrentRawStream",
                 "_DL_DEVICE_TO_PLATFORM", "_backends", "dlpack_managed_tensor_to_buffer"}


def _private_uses(path: pathlib.Path) -> list[str]:
    uses = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [
                a.name for a in node.names]
            uses += [f"import {n}" for n in names
                     if n.split(".")[0] in ("jax", "jaxlib", "torch") and "._" in "." + n]
        elif isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            private_on_lib = owner in ("jax", "torch") and node.attr.startswith("_")
            if node.attr in PRIVATE_ATTRS or private_on_lib:
                uses.append(f"line {node.lineno}: .{node.attr}")
    return uses


def test_private_internals_live_in_one_module():
    offenders = {name: _private_uses(path) for name, path in MODULES.items()
                 if name != "_private_api"}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"private JAX/torch internals outside _private_api: {offenders}"
    assert _private_uses(MODULES["_private_api"])  # the scan does see them where they are


def _small_case():
    case = next(c for c, _ in golden.sparse_attention_cases() if c.name == "tp1_r3_s64_full")
    t = lambda x: to_torch(x, "cpu")  # noqa: E731
    kv = t(case.kv_cache)
    k, v = kv_views(kv, case.head_dim)
    args = (t(case.q), k, v, t(case.logical_indices), t(case.block_table), t(case.token_to_req),
            False)
    return args, t(case.output_gate)


def _run_every_op():
    """One call of each op through the shim, cold import cache."""
    I.clear_import_cache()
    args, gate = _small_case()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", S.ShimCopyWarning)  # CPU ignores donation
        got = S.qsa_sparse_paged_attention(*args, torch.empty_like(args[0]), output_gate=gate)
        S.qsa_sparse_paged_attention(*args, output_gate=gate)
        store = next(c for c, _ in golden.store_cases())
        cache = to_torch(store.cache, "cpu")
        S.qsa_store_cache_rows(cache, to_torch(store.slot_mapping.astype(np.int64), "cpu"),
                               to_torch(store.rows, "cpu"))
    return got


def test_fast_import_route_runs():
    """Every import of the shim's calls takes the fast (private) route on this stack.

    A failure here means a jax/torch upgrade broke ``_private_api``: the shim still
    works through the public route, but pays its host cost on every import."""
    P.PATHS.reset()
    _run_every_op()
    assert P.PATHS.fast >= 7, P.PATHS.fast
    assert P.PATHS.public == 0, f"public import route ran: {P.PATHS.last_reason}"
    # Exports too: sparse (result), store (the cache alias), compress (two outputs).
    assert P.PATHS.export_fast >= 3, P.PATHS.export_fast
    assert P.PATHS.export_public == 0, f"public export route ran: {P.PATHS.last_reason}"
    assert S.IMPORT_PATHS is P.PATHS


def test_fast_route_test_sees_a_broken_private_api(monkeypatch):
    """Negative control: with the private lookup broken, the shim still answers the same,
    and the counters show the public route (what the test above would fail on)."""
    want = _run_every_op().clone()

    def broken(t):
        raise AttributeError("simulated: jax._src moved")

    monkeypatch.setattr(P, "_importer", broken)
    monkeypatch.setattr(P, "_exporter", lambda: broken(None))
    P.PATHS.reset()
    got = _run_every_op()
    assert P.PATHS.fast == 0 and P.PATHS.public >= 7
    assert P.PATHS.export_fast == 0 and P.PATHS.export_public >= 3
    assert "simulated" in P.PATHS.last_reason
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    I.clear_import_cache()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8, torch.bfloat16])
def test_fp8_and_byte_caches_cross_dlpack_zero_copy(dtype):
    """fp8 caches go to JAX as they are (torch 2.11+ and jax 0.11.2 agree on float8_e4m3fn)."""
    rng = np.random.default_rng(0)
    values = torch.from_numpy(rng.normal(size=(4, 8, 2, 64)).astype(np.float32) * 3)
    t = values.to(dtype) if dtype != torch.uint8 else values.to(torch.float8_e4m3fn).view(torch.uint8)
    P.PATHS.reset()
    a = I.to_jax(t)
    assert P.PATHS.fast == 1 and P.PATHS.public == 0, P.PATHS.last_reason
    assert a.unsafe_buffer_pointer() == t.data_ptr() and a.shape == tuple(t.shape)
    assert str(a.dtype) == str(t.dtype).replace("torch.", "")
    back = I.to_torch(a)
    assert back.dtype == t.dtype and back.data_ptr() == t.data_ptr()
    assert torch.equal(back.view(torch.uint8), t.view(torch.uint8))


@pytest.mark.gpu
def test_gpu_fast_import_route_runs():
    """The same on CUDA, where the fast route also does torch's stream handshake itself."""
    g = C.sparse_attention_case(np.random.default_rng(1), rows=4, num_query_heads=6,
                                num_kv_heads=1, head_dim=256, page_size=16, selection_blocks=8,
                                context_tokens=256, num_pages=32)
    t = lambda x: to_torch(x, "cuda")  # noqa: E731
    kv = t(g.kv_cache)
    k, v = kv_views(kv, 256)
    I.clear_import_cache()
    P.PATHS.reset()
    out = torch.empty_like(t(g.q))
    S.qsa_sparse_paged_attention(t(g.q), k, v, t(g.logical_indices), t(g.block_table),
                                 t(g.token_to_req), False, out, output_gate=t(g.output_gate),
                                 implementation="jax")  # the route that imports (CUDA's default launches directly)
    torch.cuda.synchronize()
    assert P.PATHS.fast >= 6 and P.PATHS.public == 0, P.PATHS.last_reason
    assert np.isfinite(to_numpy(out).astype(np.float32)).all()
