#!/usr/bin/env bash
# Session 19, call a (device tool; carry .whl .cache/originals): the jax-triton fp8 kernel with V
# converted to fp16 before its layout change (config.triton_fp8_values_f16_staged, V_F16_STAGED;
# notes/triton.md "Session 19"), issue 13's fp8 throughput.
#  1. Bits: the GPU knob test, V staged against Triton's own cast (and the fp16 q.K^T again), at
#     the TP1 shapes, three launches. Prediction: identical.
#  2. tools/fp8_kernel_ab.py, jax-triton, TP1/TP4 at 1024 and 4096 programs, each of the table's
#     launch and three others with neither knob, the fp16 q.K^T, V staged, and both.
#     Prediction (sm_90 lowering: loop 2184 -> 1899, 1814 -> 1560 with both; shared memory 24.8 ->
#     41 KB, 8 -> 5 one-warp programs per SM): if the kernel is issue-bound, V staged -8 to -13%
#     at the table's launch; if it needs the occupancy (TP1 ignored the fp16 q.K^T's -17% of
#     instructions in session 17), slower. A bn16 tile keeps the shared memory at 24.7 KB: if
#     occupancy decides, 16/2/1 staged is the one that gains.
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_fp8.py \
  -k "knob_is_bit_identical and triton" > "$OUT/knob_bits.log" 2>&1
echo "knob bits rc=$?"; tail -n 3 "$OUT/knob_bits.log"
timeout -s INT 330 python3 tools/fp8_kernel_ab.py --impl triton --programs 1024,4096 --geometries TP1,TP4 \
  --configs table,32/1/1/2,16/2/1/2,64/1/2/2 --knob triton_fp8_keys_f16_dot \
  --knob triton_fp8_values_f16_staged --knob triton_fp8_values_f16_staged+triton_fp8_keys_f16_dot \
  --out "$OUT/fp8_ab" > "$OUT/fp8_ab.log" 2>&1
echo "fp8_kernel_ab rc=$?"; grep -E "programs:|knob=|identical to off: False" "$OUT/fp8_ab.log" | sed 's/ err .*\[sparse_attention_split_kernel/ [split/' | tail -80
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
