# Source on the lent GPU machine (no network): makes the carried pieces importable.
#   carry: .whl (jax-triton wheel), .cache/originals (vLLM 0.30.0 and 0.34.0 qsa.py)
# The machine's python3 already has jax 0.11.2 (cuda13), torch 2.11, triton 3.6.
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export QSA_ORIGINALS_DIR="$PWD/.cache/originals"  # holds vllm-<version>/qsa.py for 0.30.0 and 0.34.0
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1 && export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import jax, torch, triton; print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__, 'triton', triton.__version__)"
