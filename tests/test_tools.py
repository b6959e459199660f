"""CPU smoke tests of the GPU tools, so they do not rot between GPU sessions."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("part, launches", [("indexer", 3), ("sparse0", 4), ("fp8", 20), ("fused", 2),
                                             ("backward", 2), ("backward_fp8", 4),
                                             ("bf16_bands", 8)])
def test_memcheck_driver_part_agrees_on_cpu(part, launches):
    """tools/memcheck.py --part runs its adversarial cases (Pallas in interpret mode) and every
    launch agrees with the XLA reference; the run must also report what it checked."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    res = subprocess.run([sys.executable, "tools/memcheck.py", "--impl", "pallas", "--part", part],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    checked = [line for line in res.stdout.splitlines() if line.startswith("ok")]
    assert len(checked) == launches, res.stdout
    assert "0 disagree" in res.stdout


def test_ncu_sass_summary_classifies_copies_and_spills(tmp_path):
    """tools/ncu_sass_summary.py on a small `ncu --page source --csv` file: stall reasons,
    opcodes, spills and the two shared-address forms of the async copies (session 8's finding:
    ``[R+imm]`` in Triton 3.6's kernels, one register per copy in XLA's Pallas fp8 kernel)."""
    import csv
    import random

    sys.path.insert(0, "tools")
    import ncu_sass_summary as S

    rnd = random.Random(8)
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
              "stall_long_sb", "stall_wait", "stall_long_sb (Not Issued)"]
    body, want = [], {"R+imm": [0, 0], "R": [0, 0], "LDL": 0, "long_sb": 0, "wait": 0}
    sources = ["LDGSTS.E.64 desc[UR12][R140.64], P3, [R194]",
               "LDGSTS.E.BYPASS.128 desc[UR22][R152.64], P4, [R227+0x2000]",
               "@!P0  LDL R154, [R1+0x28]", "HMMA.16816.F32.BF16 R140, R140, R146, R148"]
    for i in range(40):
        src = sources[i % 4]
        executed, long_sb, wait = rnd.randint(1, 10**6), rnd.randint(0, 500), rnd.randint(0, 500)
        form = None if "LDGSTS" not in src else "R+imm" if "+0x" in src else "R"
        if form:
            want[form][0] += 1
            want[form][1] += executed
        if "LDL" in src:
            want["LDL"] += executed
        want["long_sb"] += long_sb
        want["wait"] += wait
        body.append([f"0x{i:04x}", src, str(long_sb + wait), f"{executed:,}", str(long_sb), str(wait), "7"])
    path = tmp_path / "k.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "toy_kernel"])
        w.writerow(header)
        w.writerows(body)
    kernel, lines = S.read(str(path))
    s = S.summarise(lines)
    assert kernel == "toy_kernel" and len(lines) == 40
    assert s["stalls"]["long_sb"] == want["long_sb"] and s["stalls"]["wait"] == want["wait"]
    assert "long_sb (Not Issued)" not in s["stalls"]
    assert s["by_op"]["LDL"][0] == want["LDL"]
    assert s["copies"][("64", "[R]")][:2] == want["R"]
    assert s["copies"][("128", "[R+imm]")][:2] == want["R+imm"]
    text = S.report(kernel, s)
    assert "LDGSTS .64 [R]: 10 lines" in text and "LDGSTS .128 [R+imm]: 10 lines" in text
    # Several launches in one file (ncu -k regex matching more than one): one block each.
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "second_kernel"])
        w.writerow(header)
        w.writerows(body[:3])
    blocks = S.read_all(str(path))
    assert [(k, len(ls)) for k, ls in blocks] == [("toy_kernel", 40), ("second_kernel", 3)]


def test_profile_shim_grid_runs_on_cpu():
    """tools/profile_shim.py --grid on CPU tensors (JAX's CPU backend; no original, no
    triton-torch there): the columns asked for and their baselines, an fp8 cache, and an unknown
    column name refused with the known ones listed."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "tools/profile_shim.py", "--grid", "1", "--tp", "TP4", "--kv-dtype", "fp8",
           "--columns", "shim out= default,shim default route"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    header = next(line for line in res.stdout.splitlines() if line.startswith("| rows"))
    assert header.split(" | ")[2:5] == ["original", "shim out= default", "shim default route"], header
    row = next(line for line in res.stdout.splitlines() if line.startswith("| 1 |"))
    assert float(row.split(" | ")[3]) > 0 and float(row.split(" | ")[4]) > 0, row  # both shim columns timed
    assert "fp8 (x vLLM 0.34.0)" in res.stdout
    bad = subprocess.run(cmd[:-1] + ["shim fast"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "--columns: unknown ['shim fast']" in bad.stderr


def test_backward_gather_probe_runs_on_cpu(tmp_path):
    """tools/backward_gather_probe.py --small: the probe's sums equal NumPy's over the kernel's own
    inverse index (the tool exits 1 otherwise), then the GPU path runs (no busy times on CPU)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    res = subprocess.run([sys.executable, "tools/backward_gather_probe.py", "--small", "--variants", "32:2,16:1",
                          "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.count("max relative difference from NumPy") == 2
    table = (tmp_path / "gather_probe.md").read_text()
    assert "dK/dV kernel" in table and table.count("gather probe") == 2


def test_ptxas_ab_runs_one_launch():
    """tools/ptxas_ab.py (session 27: one PTX through two ptxas releases) compiles the split
    kernel at a table launch and compares the two listings; with Triton's own ptxas on both
    sides they must agree line for line."""
    pytest.importorskip("triton")
    res = subprocess.run([sys.executable, "tools/ptxas_ab.py", "--ptxas", _triton_ptxas(), "--rows", "TP4:32"],
                         cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    row = [line for line in res.stdout.splitlines() if line.startswith("| TP4 | 32 |")]
    assert len(row) == 1, res.stdout
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    assert cells[2] == "32/16/1/2" and cells[6] == "0" and cells[7] == "yes", cells  # sm_90's 25-32 entry


def _triton_ptxas() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def _script_invocations(path):
    """(module or script, flags) for every ``python3 -m bench.<m>`` / ``python3 tools/<x>.py`` in
    a shell script: continuation lines joined, the command cut at its redirection or pipe."""
    text = open(path).read().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        for m in re.finditer(r"python3? (?:-m (bench\.\w+)|(tools/\w+\.py))", line):
            rest = re.split(r"\s[0-9]?>|\s\||;|&&", line[m.end():])[0]
            flags = sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest)))
            found.append((m.group(1) or m.group(2), flags))
    return found


def test_gpu_scripts_pass_flags_their_programs_take():
    """Every flag a standing GPU script (tools/*.sh, tools/sessions/gpu_next_*.sh) passes to a
    bench module or tools/ script is one that program's ``--help`` lists: a renamed or dropped
    flag otherwise shows only as an argparse error on a lent GPU (tools/gpu_verify.sh passed the
    removed ``--relaxed-atomics`` to bench.backward until session 30)."""
    import glob

    scripts = sorted(glob.glob(os.path.join(ROOT, "tools", "*.sh"))
                     + glob.glob(os.path.join(ROOT, "tools", "sessions", "gpu_next_*.sh")))
    wanted = {}
    for path in scripts:
        for program, flags in _script_invocations(path):
            wanted.setdefault(program, {}).update({f: os.path.relpath(path, ROOT) for f in flags})
    assert {"bench.backward", "bench.run", "tools/memcheck.py"} <= set(wanted), sorted(wanted)
    # The repository on the path, as tools/gpu_env.sh puts it for the scripts.
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT + (os.pathsep + path if path else "")}
    missing = []
    for program, flags in sorted(wanted.items()):
        if not flags:  # called with positional arguments only (tools/busy_table.py)
            continue
        cmd = [sys.executable, "-m", program] if program.startswith("bench.") else [sys.executable, program]
        res = subprocess.run(cmd + ["--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, (program, res.stderr[-2000:])
        listed = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", res.stdout))
        missing += [f"{script}: {program} {flag}" for flag, script in sorted(flags.items()) if flag not in listed]
    assert not missing, missing


def test_gpu_scripts_name_files_that_exist():
    """The test files, tools and session scripts a standing GPU script names exist (a rename
    otherwise shows as 'file not found' on a lent GPU)."""
    import glob

    scripts = sorted(glob.glob(os.path.join(ROOT, "tools", "*.sh"))
                     + glob.glob(os.path.join(ROOT, "tools", "sessions", "gpu_next_*.sh")))
    named = {(os.path.relpath(path, ROOT), name) for path in scripts
             for name in re.findall(r"(?<![\w/.-])((?:tests|tools)/[\w/]+\.(?:py|sh))", open(path).read())}
    assert any(name.startswith("tests/") for _, name in named) and len(named) > 20, sorted(named)
    missing = sorted(f"{script}: {name}" for script, name in named if not os.path.exists(os.path.join(ROOT, name)))
    assert not missing, missing


def test_gather_roofline_kernel_in_interpreter():
    """tools/gather_roofline.py --check: the gather kernel (the roofline of issue 13's fp8 target)
    reads exactly the attention kernel's rows -- its XOR per (row, KV head) equals NumPy's over the
    same entries, fp8 and bf16 bytes, with and without the prefetch (the tool exits 1 otherwise)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    res = subprocess.run([sys.executable, "tools/gather_roofline.py", "--check"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.count("\nok ") + res.stdout.startswith("ok ") == 6, res.stdout


def test_fp8_kernel_ab_knob_values():
    """``--knob A+B --knob N=224``: the runs force A and B True (False where a run does not
    name them) and a numeric knob to its integer (None where a run does not name it); an
    unknown name is an error before any GPU work."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import fp8_kernel_ab as ab

    sets = [(), ("triton_fp8_lazy_rescale",), ("triton_fp8_register_cap=224", "triton_fp8_lazy_rescale"),
            ("triton_fp8_register_cap=200",)]
    assert ab.knob_values(sets) == [
        {"triton_fp8_register_cap": None},
        {"triton_fp8_lazy_rescale": True, "triton_fp8_register_cap": None},
        {"triton_fp8_register_cap": 224, "triton_fp8_lazy_rescale": True},
        {"triton_fp8_register_cap": 200}]
    with pytest.raises(ValueError, match="no_such_knob"):
        ab.knob_values([("no_such_knob=3",)])
