#!/usr/bin/env bash
# Session 7 diagnosis (fp8kern): the Pallas fp8 kernel against vLLM 0.34.0's at the SAME
# tiling (bn32 / 4 and 2 splits / 1 warp), TP1 512 rows = 1024 programs: busy time by
# kernel (tools/fp8_kernel_ab.py), and Nsight Compute with source counters of one launch
# each at bn32/s4/w1, exported as SASS with executed-instruction counts per line; the
# timing also A/Bs config.pallas_fp8_value_pairs (and checks it is bit-identical).
# Usage (device tool; carry .whl .cache/originals): bash tools/gpu_fp8_diag7.sh
source tools/gpu_env.sh >/dev/null
timeout 150 python3 tools/fp8_kernel_ab.py --programs 1024 --geometries TP1 --configs 32/4/1/2,32/2/1/2 --knob pallas_fp8_value_pairs \
  --out "$OUT/ab_diag" 2>&1 | grep -v Warning | tail -12
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 200 "$NCU" --clock-control none --target-processes all \
  -k 'regex:qsa_sparse_attention|_qsa_sparse_paged_gqa_splitk_kernel' --launch-count 2 \
  --section SourceCounters --section InstructionStats --section WarpStateStats --section SpeedOfLight \
  --section LaunchStats --section Occupancy -o "$OUT/diag" \
  python3 tools/ncu_fp8.py --rows 512 --repeat 1 --only pallas_fp8,original034_fp8 --config 32/4/1 \
  > "$OUT/ncu_run.log" 2>&1; echo "ncu rc=$?"; tail -3 "$OUT/ncu_run.log"
"$NCU" -i "$OUT/diag.ncu-rep" --page details --csv > "$OUT/details.csv" 2>&1
for k in qsa_sparse_attention _qsa_sparse_paged_gqa_splitk_kernel; do
  "$NCU" -i "$OUT/diag.ncu-rep" -k "regex:$k" --page source --print-source sass --csv > "$OUT/sass_$k.csv" 2>&1
  echo "$k: $(wc -l < "$OUT/sass_$k.csv") lines"
done
grep -E '"(Duration|Executed Instructions|Registers Per Thread|Issue Slots Busy|Warp Cycles Per Issued Instruction)"' "$OUT/details.csv" | cut -c1-200
