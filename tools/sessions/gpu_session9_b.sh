#!/usr/bin/env bash
# After session 8 (not yet run; about 4 min of device time): do the backward kernels spill
# under XLA's Triton the way the one-warp fp8 forward did (notes/pallas.md "Session 8";
# notes/backward.md: the dq walk takes 3.3x the forward, the dK/dV kernel 2-3x its model)?
# Nsight Compute with source counters on the backward's kernels, TP1 1024 rows, one request
# per row (bench.backward's default case), then tools/ncu_sass_summary.py on each kernel's SASS:
# stall reasons, spills (LDL/STL), the async copies' address forms.
# Usage (device tool; no carry needed): bash tools/sessions/gpu_session9_b.sh
source tools/gpu_env.sh
NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 300 "$NCU_BIN" --clock-control none --target-processes all --import-source yes \
  -k 'regex:qsa_sparse_attention' --launch-skip 6 --launch-count 6 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats \
  --section MemoryWorkloadAnalysis -o "$OUT/ncu_bwd" \
  python3 -m bench.backward --rows 1024 --reps 1 --no-xla --no-acq-rel --out "$OUT/bwd" \
  > "$OUT/ncu_bwd_run.log" 2>&1; echo "ncu rc=$?"; tail -3 "$OUT/ncu_bwd_run.log"
"$NCU_BIN" -i "$OUT/ncu_bwd.ncu-rep" --page details --csv > "$OUT/ncu_bwd_details.csv" 2>&1
grep -E '"(Duration|Registers Per Thread|Local Memory Spilling Requests|Warp Cycles Per Issued Instruction)"' \
  "$OUT/ncu_bwd_details.csv" | cut -d, -f5,13,15 | head -40
"$NCU_BIN" -i "$OUT/ncu_bwd.ncu-rep" --page source --print-source sass --csv > "$OUT/sass_bwd.csv" 2>&1
python3 tools/ncu_sass_summary.py "$OUT/sass_bwd.csv" | tee "$OUT/sass_summary.txt" | head -90
gzip "$OUT/sass_bwd.csv"
