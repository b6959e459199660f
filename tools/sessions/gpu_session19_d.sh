#!/usr/bin/env bash
# Session 19, call d (device tool; carry .whl .cache/originals): call c cut again (559 s of device
# time left after two machines were taken back mid-run, 469 s after another refused start): the
# staged-V knob's A/B at 4096 programs (it compares each knob's output bits with the plain
# kernel's, on random e4m3 caches), then the scaled fp8 backward's GPU test only.
# Predictions: V staged bit-identical; -8 to -13% at the table's launch if the one-warp loop is
# issue-bound (sm_90 loop 2184 -> 1899), slower if occupancy decides (shared memory 24.8 -> 41 KB:
# 8 -> 5 programs per SM), in which case 16/2/1 staged (24.7 KB) is the one that gains. The
# backward: dq <= 2.6x, dgate <= 2.3x the bf16 floor, e4m3 dK/dV <= 1.05x the e4m3 floor.
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 150 python3 tools/fp8_kernel_ab.py --impl triton --programs 4096 --geometries TP1,TP4 \
  --configs table,16/2/1/2 --knob triton_fp8_keys_f16_dot \
  --knob triton_fp8_values_f16_staged --knob triton_fp8_values_f16_staged+triton_fp8_keys_f16_dot \
  --out "$OUT/fp8_ab" > "$OUT/fp8_ab.log" 2>&1
# (The grep's last pattern was "identical to off: False" when this ran, which never matches the
# tool's "identical to off at <launch>: False": the False lines were found in the log afterwards.)
echo "fp8_kernel_ab rc=$?"; grep -E "programs:|knob=|identical to off at .*: False" "$OUT/fp8_ab.log" | sed 's/ err .*\[sparse_attention_split_kernel/ [split/'
timeout -s INT 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s tests/test_gpu_backward.py \
  -k fp8_scaled > "$OUT/gpu_backward_fp8.log" 2>&1
echo "gpu backward fp8 tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|GRAD fp8" "$OUT/gpu_backward_fp8.log" | tail -20
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
