#!/usr/bin/env bash
# Install the test dependencies into .venv (Python 3.12) and run the test suite.
# Extra arguments go to pytest (e.g. `bash tools/test.sh -k golden`).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=$(bash "$root/tools/venv.sh" test)
cd "$root"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
exec "$py" -m pytest -q "$@"
