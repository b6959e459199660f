"""README's layout table names every module of the tree (so it cannot drift from it)."""

from __future__ import annotations

import fnmatch
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Folders whose modules and scripts the table must name; generated or per-session files are out.
NAMED_DIRS = ("qsa_jax/", "qsa_torch_shim/", "qsa_testing/", "tools/", "bench/", "examples/")
UNNAMED = ("tools/sessions/", "bench/results/")


def _layout_names(readme: str) -> set[str]:
    """Every backticked name in the rows of README's "## Layout" table."""
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return {name for line in section.splitlines() if line.startswith("|")
            for name in re.findall(r"`([^`]+)`", line)}


def _unnamed_modules(readme: str, files: list[str]) -> list[str]:
    names = _layout_names(readme)
    out = []
    for f in files:
        p = pathlib.PurePosixPath(f)
        if (not f.startswith(NAMED_DIRS) or f.startswith(UNNAMED) or p.suffix not in (".py", ".sh")
                or p.name == "__init__.py"):
            continue
        # A row names a file by path (`qsa_jax/ops/<operator>/api.py`, `tools/gpu_*.sh`),
        # by file name (`triton.py`) or by module name (`_checks`, `measure*`).
        if not any(fnmatch.fnmatch(f, n.replace("<operator>", "*")) or fnmatch.fnmatch(p.name, n)
                   or fnmatch.fnmatch(p.stem, n) for n in names):
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
