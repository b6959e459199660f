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
