#!/usr/bin/env bash
# Session 13, call k -- NOT RUN: the session's device time was spent. For the next session (about
# 6 min of device time), the checks the last kernel changes of session 13 are owed:
#  1. compute-sanitizer memcheck of the jax-triton kernels (every sparse part, fp8, the planted
#     control): the split kernel now takes last_request and has two loop forms;
#  2. tools/triton_torch_ab.py 1 / 8 / 64 / 512 / 2048 rows, TP1/TP4, bf16/fp8: the per-launch loop
#     form as a whole (calls e and j timed each form alone);
#  3. the benchmark's in-turns column again on the final kernel (call h ran before calls i-j);
#  4. tests/test_gpu_parity.py for "triton" at every row count (0.30.0's bits).
# Prediction: memcheck 0 errors (the control reports its errors); 2: split kernel at 1-8 rows as
# call j's (TP1 bf16 7.0 / 19.1 us), from 64 rows as call e's (TP1 fp8 2048 ~1229 us); 3: in turns
# <= 1.0 at every cell; 4: 24 passed, relative error 0.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session13_k.sh
source tools/gpu_env.sh
set -o pipefail
PART_TIMEOUT=60 IMPLS=triton bash tools/gpu_memcheck_parts.sh > "$OUT/memcheck_triton.log" 2>&1
echo "compute-sanitizer memcheck:"; grep -h MEMCHECK "$OUT/memcheck_triton.log"
timeout -s INT 150 python3 tools/triton_torch_ab.py --rows 1,8,64,512,2048 --tp TP1,TP4 --kv bf16,fp8 \
  --out "$OUT/ab" 2>&1 | grep -v -i warn > "$OUT/ab.log"; echo "ab rc=$?"
python3 tools/triton_torch_ab.py --summarize "$OUT/ab/triton_torch_ab.json"
timeout 200 python3 -m bench.run --impl original,original034,shim --op sparse --tp TP1,TP4 \
  --rows 1,8,64,512,2048 --kv-dtype bf16,fp8 --out "$OUT/bench_shim" > "$OUT/bench_shim.log" 2>&1
echo "bench rc=$?"; tail -1 "$OUT/bench_shim.log"
sed -n '/^| where | rows | prefill cfg | original/,/^$/p' "$OUT/bench_shim/results.md"
QSA_PARITY_IMPLS=triton timeout -s INT 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s \
  tests/test_gpu_parity.py -k "sparse_attention" > "$OUT/parity030_triton.log" 2>&1
echo "0.30 parity (triton) rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/parity030_triton.log" | tail -4
