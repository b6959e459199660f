#!/usr/bin/env bash
# Session 7 (fp8kern): the fp8 kernel variants of notes/pallas.md "Session 7" on the H200.
#  1. GPU bit-identity of each opt-in knob (config.pallas_fp8_value_pairs,
#     config.pallas_fp8_keys_f16_dot) against the default, TP1 shapes, 3 launches.
#  2. Busy time by kernel against vLLM 0.34.0 (same fresh selections), TP1 and TP4 at
#     256 / 1024 / 2048 programs, the measured table's launch (H200_FP8), with the knobs
#     off, value pairs alone, both (tools/fp8_kernel_ab.py; each checked bit for bit
#     against "off" on the first call's output).
#  3. TP1 1024 programs at 0.34.0's own tiling (bn32 / 4 splits / 1 warp): keys_f16_dot alone, both:
#     the kernels compared like for like.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_fp8_kernel7.sh   (~4-5 min;
# NCU=1 bash tools/sessions/gpu_fp8_kernel7.sh adds step 4)
source tools/gpu_env.sh
set -o pipefail
timeout 120 python3 -m pytest -q -m gpu tests/test_fp8.py -p no:cacheprovider \
  -k "gpu_pallas_fp8_knob and (value_pairs or keys_f16_dot)" 2>&1 | tee "$OUT/knob_bit_identity.log" | tail -4
timeout 170 python3 tools/fp8_kernel_ab.py --programs 256,1024,2048 --geometries TP1,TP4 --configs table \
  --knob pallas_fp8_value_pairs --knob pallas_fp8_value_pairs+pallas_fp8_keys_f16_dot \
  --out "$OUT/ab_table" 2>&1 | grep -v -i warning | tee "$OUT/ab_table.log" | tail -40
timeout 70 python3 tools/fp8_kernel_ab.py --programs 1024 --geometries TP1 --configs 32/4/1/2 \
  --knob pallas_fp8_keys_f16_dot --knob pallas_fp8_value_pairs+pallas_fp8_keys_f16_dot \
  --out "$OUT/ab_s4w1" 2>&1 | grep -v -i warning | tee "$OUT/ab_s4w1.log" | tail -8
tar -C "$OUT" -czf "$OUT/fp8_kernel7.tgz" ab_table ab_s4w1 2>/dev/null && rm -rf "$OUT/ab_table" "$OUT/ab_s4w1"
# 4. Optional (NCU=1, ~2 more min): Nsight Compute with source counters, one launch each of
#    the Pallas kernel (knobs as committed) and 0.34.0's at bn32/s4/w1, TP1 512 rows, and
#    the GPU-compiled SASS with executed-instruction counts per line (sass_*.csv): where
#    the GPU's instructions go, to check the CPU lowering's counts (notes/pallas.md).
if [ "${NCU:-0}" = 1 ]; then
  NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 200 "$NCU_BIN" --clock-control none --target-processes all \
    -k 'regex:qsa_sparse_attention|_qsa_sparse_paged_gqa_splitk_kernel' --launch-count 2 \
    --section SourceCounters --section InstructionStats --section WarpStateStats --section SpeedOfLight \
    --section LaunchStats --section Occupancy -o "$OUT/ncu7" \
    python3 tools/ncu_fp8.py --rows 512 --repeat 1 --only pallas_fp8,original034_fp8 --config 32/4/1 \
    > "$OUT/ncu7_run.log" 2>&1; echo "ncu rc=$?"
  "$NCU_BIN" -i "$OUT/ncu7.ncu-rep" --page details --csv > "$OUT/ncu7_details.csv" 2>&1
  for k in qsa_sparse_attention _qsa_sparse_paged_gqa_splitk_kernel; do
    "$NCU_BIN" -i "$OUT/ncu7.ncu-rep" -k "regex:$k" --page source --print-source sass --csv > "$OUT/sass_$k.csv" 2>&1
  done
  grep -E '"(Duration|Executed Instructions|Registers Per Thread|Issue Slots Busy)"' "$OUT/ncu7_details.csv" | cut -c1-160
fi
