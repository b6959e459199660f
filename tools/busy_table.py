"""Print the per-call GPU busy-time rows of a ``bench.run`` results.md (its "GPU busy time"
section), for the short table a GPU session script prints last.

    python3 tools/busy_table.py DIR/results.md
"""

import sys


def main(path: str) -> None:
    lines = open(path).read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## GPU busy time")), None)
    if start is None:  # no case at or below the run's --trace-rows (a grid of large sizes)
        print(f"(no GPU busy-time section in {path}: no case was traced; see its Summary)")
        return
    for line in lines[start:]:
        if line.startswith("## All cases"):
            break
        if line.startswith("| sparse_attention"):
            print(line)


if __name__ == "__main__":
    main(sys.argv[1])
