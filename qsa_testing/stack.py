"""The tested stack: what ``tools/constraints.txt`` pins (the versions the README's commands
install and the lent GPU machine has). Tests whose claims are about one compiler's output (the
notes' register and instruction counts) or one release's private API hold them there."""

from __future__ import annotations

from pathlib import Path

CONSTRAINTS = Path(__file__).resolve().parents[1] / "tools" / "constraints.txt"


def pinned_version(package: str) -> str:
    """The version ``tools/constraints.txt`` pins ``package`` to."""
    for line in CONSTRAINTS.read_text().splitlines():
        name, _, version = line.partition("==")
        if name.strip() == package:
            return version.strip()
    raise LookupError(f"tools/constraints.txt pins no {package}")
