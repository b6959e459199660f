#!/usr/bin/env bash
# Install the test dependencies into .venv (Python 3.12) and run the test suite.
# Extra arguments go to pytest (e.g. `bash tools/test.sh -k golden`).
# On a machine with an NVIDIA GPU it adds JAX's cuda13 plugin (venv.sh's "gpu", as demo.sh
# does), so the GPU tests (marker `gpu`) run instead of skipping; QSA_TEST_EXTRAS overrides the
# extras (e.g. QSA_TEST_EXTRAS=test,cuda12 for a CUDA 12 driver, QSA_TEST_EXTRAS=test for CPU only).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=$(bash "$root/tools/venv.sh" "${QSA_TEST_EXTRAS:-test,gpu}")
cd "$root"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
exec "$py" -m pytest -q "$@"
