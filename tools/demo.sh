#!/usr/bin/env bash
# Run the main job on the best device present: on a CUDA GPU the cross-framework
# benchmark (bench/run.py), elsewhere a reduced-size CPU demo that says so.
# Creates/reuses .venv (Python 3.12) with pinned versions; on a machine with an NVIDIA GPU
# JAX's cuda13 plugin too (venv.sh's "gpu"); QSA_EXTRAS overrides the extras (e.g.
# QSA_EXTRAS=bench,cuda12 for a CUDA 12 driver).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=$(bash "$root/tools/venv.sh" "${QSA_EXTRAS:-bench,gpu}")
cd "$root"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
exec "$py" tools/demo.py "$@"
