#!/usr/bin/env bash
# Create (or reuse) the project's Python >= 3.12 (3.12 tested) virtualenv in .venv and install
# the project with the extras named in $1 (comma-separated, e.g. "test" or
# "torch,bench"). Sourced by demo.sh and test.sh; prints the venv's python.
# Versions: the tested stack in tools/constraints.txt (QSA_CONSTRAINTS= another
# file, or empty for pyproject.toml's ranges alone; QSA_VENV= another venv).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${QSA_VENV:-$root/.venv}
extras=${1:-}
# "gpu" among the extras: JAX's cuda13 plugin where an NVIDIA GPU answers, nothing elsewhere
# (demo.sh and test.sh ask for it, so the GPU tests and the benchmark see the GPU).
case ",$extras," in *,gpu,*)
  extras=$(echo ",$extras," | sed 's/,gpu,/,/; s/^,//; s/,$//')
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    extras="${extras:+$extras,}cuda13"
  fi;;
esac
constraints=${QSA_CONSTRAINTS-$root/tools/constraints.txt}

supported() {  # pyproject.toml's requires-python (jax 0.11 has no wheels below 3.12)
  "$1" -c 'import sys; assert sys.version_info[:2] >= (3, 12)' >/dev/null 2>&1
}

find_python() {
  # QSA_PYTHON first (any supported version), then 3.12, the tested one. A pyenv
  # shim may exist without a selected version, so actually run each candidate.
  local c
  for c in "${QSA_PYTHON:-}" python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 \
           /usr/local/bin/python3.12 /usr/bin/python3.12; do
    [ -n "$c" ] || continue
    if supported "$c"; then
      command -v "$c" || echo "$c"; return 0
    fi
  done
  return 1
}

# Only a venv this script made (it carries the marker) is ever replaced: QSA_VENV may
# point at someone's own environment, and deleting that is not ours to do.
marker="$venv/.qsa-jax-venv"
if [ ! -x "$venv/bin/python" ] || ! supported "$venv/bin/python"; then
  if [ -e "$venv" ] && [ ! -f "$marker" ]; then
    echo "error: $venv exists but is not a Python >= 3.12 virtualenv made by tools/venv.sh;" \
         "remove it yourself or set QSA_VENV to another path" >&2
    exit 1
  fi
  py=$(find_python) || { echo "error: no Python >= 3.12 interpreter found (set QSA_PYTHON)" >&2; exit 1; }
  echo "creating $venv with $py" >&2
  rm -rf "$venv"
  "$py" -m venv "$venv"
  touch "$marker"
  "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
fi

spec="$root"
[ -n "$extras" ] && spec="$root[$extras]"
# Re-install only when pyproject.toml or the constraints changed since the last install.
stamp="$venv/.installed-$(echo "$extras" | tr ',' '_')"
pin=()
[ -n "$constraints" ] && pin=(-c "$constraints")
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ] || { [ -n "$constraints" ] && [ "$constraints" -nt "$stamp" ]; }; then
  echo "installing qsa-jax[$extras] into $venv (log: $venv/install.log)" >&2
  if ! "$venv/bin/python" -m pip install -q "${pin[@]}" -e "$spec" >"$venv/install.log" 2>&1; then
    tail -40 "$venv/install.log" >&2
    exit 1
  fi
  touch "$stamp"
fi
echo "$venv/bin/python"
