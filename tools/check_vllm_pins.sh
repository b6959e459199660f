#!/usr/bin/env bash
# CI: the project installs beside vLLM's torch pins, and the shim runs under torch 2.14.
#
# 1. Resolve qsa-jax[torch,triton] together with torch==2.13.0 (vLLM 0.30.0's pin) and
#    torch==2.14.0 (vLLM 0.33/0.34's), and the tested set (tools/constraints.txt), with
#    `pip install --dry-run --report` (metadata only: no wheel is downloaded or installed),
#    and check what was chosen (tools/check_resolution.py).
# 2. Install qsa-jax[torch,triton] with torch==2.14.0 -- the project's other supported pair,
#    triton 3.8 with jax-triton 0.4.1 -- into a scratch venv outside the repository and run
#    there the shim's CPU tests and the Triton side's (kernels compiled for sm_90, Triton's
#    interpreter on the jax-triton kernels, the launch plans, the Gluon kernel's fallback:
#    tests/test_triton.py, test_launch.py, test_gluon.py). jax-triton itself does not import
#    without a GPU, so its launches skip as on the main venv.
# Measured on the 2-core CI machine (2026-12-03, another job running beside it): the three
# resolutions 26-42 s each; the torch 2.14 venv 167 s to create and install the first time
# (6 GB on disk, CUDA wheels included; reused by later runs on the same machine); the shim
# tests under torch 2.14 185 s (249 passed, 48 skipped: GPU, and fp8 until qsa_jax has it).
# In all 7m46s. With the Triton side added (2026-12-05, the venv reused): 309 passed, 141
# skipped in 246 s; in all 5m21s.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# Any Python 3.12 with pip resolves (a dry run installs nothing): by default the project's venv.
py=${QSA_RESOLVE_PYTHON:-$(bash tools/venv.sh test)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

resolve() {  # name, then pip arguments
  local name=$1; shift
  local t0=$SECONDS
  if ! "$py" -m pip install -q --dry-run --ignore-installed --report "$work/$name.json" "$@" \
       >"$work/$name.log" 2>&1; then
    tail -20 "$work/$name.log" >&2
    echo "FAIL  resolve $name: pip could not resolve $*" >&2
    return 1
  fi
  echo "resolved $name in $((SECONDS - t0)) s" >&2
}

resolve torch213 ".[torch,triton]" "torch==2.13.0"
resolve torch214 ".[torch,triton]" "torch==2.14.0"
resolve tested ".[test]" -c tools/constraints.txt
checks=("$work/torch213.json" torch=2.13.0 jax=0.11.2 jax-triton=0.4.1
        -- "$work/torch214.json" torch=2.14.0 triton=3.8.0 jax=0.11.2 jax-triton=0.4.1
        -- "$work/tested.json" torch=2.11.0 triton=3.6.0 jax=0.11.2 jaxlib=0.11.2 jax-triton=0.3.1)
# With vLLM 0.30.0 itself: pip fetches ~3 GB of wheels to read their metadata (~200 s
# here), so only on request. vLLM 0.34.0 cannot be resolved from PyPI at all (it pins
# flashinfer-python==0.7.3, which PyPI does not have; checked 2026-12-03): its torch pin
# stands in for it above.
if [ "${QSA_CHECK_VLLM:-0}" = 1 ]; then
  resolve vllm030 "vllm==0.30.0" ".[torch,triton]"
  checks+=(-- "$work/vllm030.json" vllm=0.30.0 torch=2.13.0 jax=0.11.2)
fi
"$py" tools/check_resolution.py "${checks[@]}"

# The shim's CPU tests under torch 2.14 (vLLM 0.34's pin), in a venv of their own.
venv214=${QSA_TORCH214_VENV:-/tmp/qsa-venv-torch214}
printf 'torch==2.14.0\njax==0.11.2\njaxlib==0.11.2\n' >"$work/torch214.txt"
t0=$SECONDS
py214=$(QSA_VENV=$venv214 QSA_CONSTRAINTS="$work/torch214.txt" bash tools/venv.sh torch,triton)
"$py214" -m pip install -q "pytest>=8" >/dev/null 2>&1
echo "torch 2.14 venv ready in $((SECONDS - t0)) s: $("$py214" -c 'import importlib.metadata as m, torch, triton, jax; print("torch", torch.__version__, "triton", triton.__version__, "jax", jax.__version__, "jax-triton", m.version("jax-triton"))')" >&2
XLA_PYTHON_CLIENT_PREALLOCATE=false "$py214" -m pytest -q -p no:cacheprovider \
  tests/test_shim.py tests/test_shim_layout.py tests/test_shim_vllm034.py \
  tests/test_triton.py tests/test_launch.py tests/test_gluon.py tests/test_triton_images.py
