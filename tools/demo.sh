#!/usr/bin/env bash
# Run the main job on the best device present: on a CUDA GPU the cross-framework
# benchmark (bench/run.py), elsewhere a reduced-size CPU demo that says so.
# Creates/reuses .venv (Python 3.12) with pinned versions; on a GPU machine set
# QSA_EXTRAS=bench,cuda13 (or cuda12) so JAX gets its CUDA plugin.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
extras=${QSA_EXTRAS:-bench}
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && [ -z "${QSA_EXTRAS:-}" ]; then
  extras="bench,cuda13"
fi
py=$(bash "$root/tools/venv.sh" "$extras")
cd "$root"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
exec "$py" tools/demo.py "$@"
