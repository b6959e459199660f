#!/usr/bin/env bash
# Session 9, fourth device call (about 3 min): gpu_session9_c.sh found the default backward
# kernel DRAM-bound on its fp32 atomics (no spills; 20.9 GB moved per call against the forward's
# 4.0 GB, notes/backward.md "Session 9"). The token-major order ("inverted") has no atomics on
# dK/dV yet took 6.2-6.8 ms in session 7 against its 2-3 ms model: where does its time go?
# Nsight Compute on every backward kernel (the default, the inverted order's dq walk -- same
# name -- and its token-major dK/dV kernel), TP1 1024 rows, one request per row. The first
# attempt, with JAX's profiler tracing too, ended in a segmentation fault after the default
# backward (Nsight holds CUPTI): bench.backward --no-trace times by wall clock only.
# Usage (device tool; no carry needed): bash tools/sessions/gpu_session9_e.sh
source tools/gpu_env.sh
NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 300 "$NCU_BIN" --clock-control none --target-processes all --import-source yes \
  -k 'regex:qsa_sparse_attention_backward' --launch-count 12 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats \
  --section MemoryWorkloadAnalysis -o "$OUT/ncu_inv" \
  python3 -m bench.backward --rows 1024 --reps 1 --no-xla --no-acq-rel --no-trace --variants inverted --out "$OUT/bwd" \
  > "$OUT/ncu_inv_run.log" 2>&1; echo "ncu rc=$?"; tail -3 "$OUT/ncu_inv_run.log"
"$NCU_BIN" -i "$OUT/ncu_inv.ncu-rep" --page details --csv > "$OUT/ncu_inv_details.csv" 2>&1
python3 - "$OUT/ncu_inv_details.csv" <<'PY'
import csv, sys
want = {"Duration", "Registers Per Thread", "DRAM Throughput", "Compute (SM) Throughput", "L2 Cache Throughput",
        "Warp Cycles Per Issued Instruction", "Local Memory Spilling Requests", "Block Size", "Grid Size",
        "Achieved Occupancy", "L1/TEX Hit Rate", "L2 Hit Rate", "Memory Throughput"}
for r in list(csv.reader(open(sys.argv[1])))[1:]:
    if len(r) > 14 and r[12] in want:
        print(r[0], r[4][:45], r[12], r[14], r[13])
PY
"$NCU_BIN" -i "$OUT/ncu_inv.ncu-rep" --page source --print-source sass --csv > "$OUT/sass_inv.csv" 2>&1
python3 tools/ncu_sass_summary.py "$OUT/sass_inv.csv" > "$OUT/sass_inv_summary.txt"; head -120 "$OUT/sass_inv_summary.txt"
gzip "$OUT/sass_inv.csv"; rm -f "$OUT/ncu_inv.ncu-rep"
