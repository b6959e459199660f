#!/usr/bin/env bash
# Session 12, call b (about 10 min of device time): the shim's sparse attention takes the
# triton-torch route by default on CUDA tensors (no implementation=, as vLLM calls it);
# "jax" names the JAX route.
#  1. GPU tests: triton-torch (default route launches directly; a torch CUDA graph captures it
#     and replays it on new inputs bit for bit, fp8 scales first seen inside the capture), the
#     shim against both originals on both routes, the JAX route's in-place/zero-copy/strided-q
#     tests pinned to "jax", the fast import route.
#  2. tools/swap_in_check.py --quick: the installed shim under vLLM's module name.
#  3. tools/profile_shim.py --grid, TP1 and TP4: eager call + sync against vLLM 0.30.0.
#  4. bench.run: original, original034, shim (default route), shim-jax; TP1/TP4; bf16 and fp8.
# Prediction: all tests pass; the default-route column equals the triton-torch column (the
# same call) at 0.75-1.05x the original (session 11: 0.94/0.87/0.83/0.98/1.03 at TP1); TP4 64
# rows, 1.17x in session 11's single-median benchmark, <= 1.0 in the repeated grid.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session12_b.sh
source tools/gpu_env.sh
set -o pipefail
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --durations=8 tests/test_shim_direct.py \
  tests/test_shim_layout.py tests/test_shim.py -k "direct or captures or fast_import or identical_call or strided_q or in_place or store_and or torch_keeps or triton_torch" \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -12
timeout 60 python3 tools/swap_in_check.py --quick > "$OUT/swap_in.log" 2>&1
echo "swap-in rc=$?"; tail -n 3 "$OUT/swap_in.log"
for tp in TP1 TP4; do
  timeout 80 python3 tools/profile_shim.py --grid 1,8,64,512,2048 --tp $tp \
    --columns "shim out= default,shim triton-torch,shim triton-torch new q+gate,shim default route" > "$OUT/grid_$tp.log" 2>&1
  echo "grid $tp rc=$?"; grep -E "^\| [0-9]|worst" "$OUT/grid_$tp.log" | tail -6
done
timeout 170 python3 -m bench.run --impl original,original034,shim,shim-jax --op sparse --tp TP1,TP4 \
  --rows 1,64,512,2048 --kv-dtype bf16,fp8 --out "$OUT/bench_shim" > "$OUT/bench_shim.log" 2>&1
echo "bench rc=$?"; sed -n '/Host cost/,/^$/p' "$OUT/bench_shim/results.md" | head -3
python3 - "$OUT/bench_shim/results.md" <<'PY'
import sys
text = open(sys.argv[1]).read()
start = text.find("| where | rows | prefill cfg | original µs |")
print(text[start:text.find("\n\n", start)])
PY
