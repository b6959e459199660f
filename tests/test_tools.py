"""CPU smoke tests of the GPU tools, so they do not rot between GPU sessions."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("part, launches", [("indexer", 3), ("sparse0", 4), ("fp8", 4), ("fused", 2),
                                             ("backward", 2)])
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
