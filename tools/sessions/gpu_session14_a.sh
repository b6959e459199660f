#!/usr/bin/env bash
# Session 14, call a -- NOT RUN in session 14 (no device time was left to the session: 88 s);
# run in session 17 as its call a (bench/results/nvidia-h200_2026-12-05/session17/call_a/).
# The fp16 q.K^T of the jax-triton split kernel for fp8 caches (config.triton_fp8_keys_f16_dot,
# the kernel's QK_FP16; off by default until this runs), issue 13's 1.8x fp8/bf16 throughput:
#  1. GPU bit-identity of the knob against the bf16 dot (tests/test_fp8.py, jax-triton through JAX,
#     TP1 shapes, the fp8 launches bn32/1 warp/2 splits, bn32/2/4, bn64/2/1; query heads 2^35 apart);
#  2. tools/triton_torch_ab.py --f16-dot, TP1/TP4, bf16 and fp8, 64-4096 rows: busy time of the
#     split kernel with and without the knob against vLLM 0.34.0, in one process;
#  3. tools/fp8_kernel_ab.py: the knob at the table's launch and three others (1024/4096 programs),
#     bit-identity per launch;
#  4. compute-sanitizer memcheck of the jax-triton kernels (defaults; owed since session 13).
# Prediction (CPU sm_90 compile, notes/triton.md session 14): the tile loop 2184 -> 1814 SASS
# instructions at the one-warp fp8 launches (-17%; TP4 -18%, 64/1/2 -20% with fewer spills), same
# registers. If the one-warp fp8 kernel is issue-bound, fp8 busy time -12 to -17% from 512 rows:
# TP1 2048 rows ~1229 -> ~1030 us, i.e. fp8/bf16 throughput 1.58x -> ~1.9x (issue 13's 1.8x), and
# 0.80-0.90x 0.34.0's from 1024 rows. Bits: identical to the knob off (diff 0 in every fp8 row), as
# the Pallas version of this dot was on the H200 (session 7). If slower or not identical: stays off.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session14_a.sh
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE \
  tests/test_fp8.py -k "knob_is_bit_identical and triton" > "$OUT/knob_bits.log" 2>&1
echo "knob bit-identity rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/knob_bits.log" | tail -4
timeout -s INT 300 python3 tools/triton_torch_ab.py --rows 64,512,1024,2048,4096 --tp TP1,TP4 --kv bf16,fp8 \
  --f16-dot on --out "$OUT/ab" 2>&1 | grep -v -i warn > "$OUT/ab.log"; echo "ab rc=$?"
python3 tools/triton_torch_ab.py --summarize "$OUT/ab/triton_torch_ab.json"
# The knob at other launches than the table's (it may move the best launch): jax-triton through
# JAX, same selections, knob off then on, bit-identity per launch, against 0.34.0 at its tiling.
timeout -s INT 200 python3 tools/fp8_kernel_ab.py --impl triton --programs 1024,4096 --geometries TP1,TP4 \
  --configs table,32/2/2/2,64/1/2/2,32/4/1/2 --knob triton_fp8_keys_f16_dot --out "$OUT/fp8_ab" \
  > "$OUT/fp8_ab.log" 2>&1; echo "fp8_kernel_ab rc=$?"; grep -E "knob=|bit-identical" "$OUT/fp8_ab.log" | tail -40
PART_TIMEOUT=60 IMPLS=triton bash tools/gpu_memcheck_parts.sh > "$OUT/memcheck_triton.log" 2>&1
echo "compute-sanitizer memcheck:"; grep -h MEMCHECK "$OUT/memcheck_triton.log"
