"""README's layout table names every module of the tree (so it cannot drift from it), and its
Python examples run."""

from __future__ import annotations

import fnmatch
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Folders whose modules and scripts the table must name; generated or per-session files are out.
NAMED_DIRS = ("qsa_jax/", "qsa_torch_shim/", "qsa_testing/", "tools/", "bench/", "examples/")
UNNAMED = ("tools/sessions/", "bench/results/")


def _layout_patterns(readme: str) -> list[tuple[str, str]]:
    """(folder, pattern) per name in the rows of README's "## Layout" table. The first cell names
    files by path; a bare name there continues the folder of the path before it
    (`qsa_jax/ops/<operator>/pallas.py`, `triton.py`). A row whose first cell names a folder
    (`bench/`) names its modules in the other cells, by file or module name (`measure*`); other
    rows' other cells name nothing (a `run` there must not cover every run.py)."""
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        if not line.startswith("|"):
            continue
        cells = line.split("|")
        folder = ""
        for name in re.findall(r"`([^`]+)`", cells[1]):
            if name.endswith("/"):
                out += [("", n) if "/" in n else (name, n) for n in re.findall(r"`([^`]+)`", "|".join(cells[2:]))]
            elif "/" in name:
                folder = name.rsplit("/", 1)[0] + "/"
                out.append(("", name))
            else:
                out.append(("", folder + name))
    return out


def _unnamed_modules(readme: str, files: list[str]) -> list[str]:
    patterns = [(folder.replace("<operator>", "*"), name.replace("<operator>", "*").replace("<N>", "*")
                 .replace("<call>", "*")) for folder, name in _layout_patterns(readme)]
    out = []
    for f in files:
        p = pathlib.PurePosixPath(f)
        if (not f.startswith(NAMED_DIRS) or f.startswith(UNNAMED) or p.suffix not in (".py", ".sh")
                or p.name == "__init__.py"):
            continue
        if not any(fnmatch.fnmatch(f, name) if not folder else
                   (fnmatch.fnmatch(f, folder + "*") and (fnmatch.fnmatch(p.name, name) or fnmatch.fnmatch(p.stem, name)))
                   for folder, name in patterns):
            out.append(f)
    return out


def test_layout_table_names_every_module():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    assert any(f.startswith("qsa_jax/ops/") for f in files), "git ls-files listed no package files"
    missing = _unnamed_modules((ROOT / "README.md").read_text(), files)
    assert not missing, f"README.md's Layout table does not name: {missing}"


def test_layout_check_sees_an_unnamed_module():
    readme = (ROOT / "README.md").read_text()
    assert _unnamed_modules(readme, ["qsa_jax/ops/sparse_attention/new_kernel.py"]) == [
        "qsa_jax/ops/sparse_attention/new_kernel.py"]
    assert _unnamed_modules(readme, ["qsa_jax/ops/sparse_attention/api.py", "tools/gpu_all.sh"]) == []
    # A module name of one folder's row covers no other folder's file of that name.
    assert _unnamed_modules(readme, ["qsa_jax/run.py", "qsa_jax/ops/sparse_attention/plan.py"]) == [
        "qsa_jax/run.py", "qsa_jax/ops/sparse_attention/plan.py"]


def _python_blocks(readme: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", readme, re.S)


_STAND_INS = """
import numpy as np, jax.numpy as jnp
from qsa_testing import cases as C
from qsa_testing.torch_interop import kv_views, to_torch

rng = np.random.default_rng(0)
case = C.sparse_attention_case(rng, rows=4, num_query_heads=24, num_kv_heads=2, head_dim=16, page_size=8,
                               selection_blocks=3, context_tokens=40)
store = C.store_case(rng, n=4, pages=4, page_size=4, width=24)
JAX_ARRAYS = dict(zip(("q", "kv_cache", "logical_indices", "block_table", "token_to_req", "output_gate",
                       "cache", "slot_mapping", "rows"),
                      (jnp.asarray(x) for x in (case.q, case.kv_cache, case.logical_indices, case.block_table,
                                                case.token_to_req, case.output_gate, store.cache,
                                                store.slot_mapping, store.rows))))
t = lambda x: to_torch(np.asarray(x), "cpu")
k_cache, v_cache = kv_views(t(case.kv_cache), 16)
TORCH_ARRAYS = dict(q=t(case.q), k_cache=k_cache, v_cache=v_cache, logical_indices=t(case.logical_indices),
                    block_table=t(case.block_table), token_to_req=t(case.token_to_req), gate=t(case.output_gate),
                    use_prefill_config=False, out=None, k_scale=None, v_scale=None)
"""


def test_readme_python_blocks_run():
    """Every Python example in README runs as written, each in a namespace holding only its
    input arrays (so it must import what it uses), on stand-ins of small shapes, in one
    subprocess with 8 forced host devices (the mesh example needs them). A line calling with
    ``(...)`` (a placeholder) is skipped; ``warmup`` compiles one row count."""
    blocks = _python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 3
    script = [_STAND_INS]
    for i, block in enumerate(blocks):
        code = "\n".join(line for line in block.splitlines() if "(...)" not in line).replace(
            "qsa_jax.warmup(kv_cache, block_table,",
            "qsa_jax.warmup(kv_cache, block_table, row_counts=[1], persistent_cache=False,")
        arrays = "TORCH_ARRAYS" if "qsa_torch_shim" in code else "JAX_ARRAYS"
        script.append(f"exec({code!r}, dict({arrays}))\nprint('block {i} ran')")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", "\n".join(script)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    for i in range(len(blocks)):
        assert f"block {i} ran" in done.stdout
