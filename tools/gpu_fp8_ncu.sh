#!/usr/bin/env bash
# Nsight Compute on the GPU-compiled sparse-attention kernels (session 6, notes/pallas.md):
# Pallas fp8, Pallas bf16 and vLLM 0.34.0's fp8 split kernel at TP1 (tools/ncu_fp8.py),
# two launches each, with launch stats, occupancy, throughput, memory (incl. local =
# spill traffic), warp stalls and instruction counts -> $OUT/ncu_<rows>.csv.
# Usage (device tool; carry .whl .cache/originals): [ONLY=a,b] [GEOMETRY=TP4] bash tools/gpu_fp8_ncu.sh [rows]
# (ONLY: ncu_fp8.py's --only cases, e.g. triton_fp8,triton_bf16: the jax-triton kernels, session 34)
source tools/gpu_env.sh >/dev/null
rows=${1:-1024}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
timeout "${NCU_TIMEOUT:-150}" "$NCU" --clock-control none --target-processes all \
  -k 'regex:qsa_sparse_attention|sparse_attention_split_kernel|_qsa_sparse_paged_gqa_splitk_kernel' --launch-count 6 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
  --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section ComputeWorkloadAnalysis \
  --section InstructionStats --section SchedulerStats \
  --metrics smsp__sass_inst_executed_op_local_ld.sum,smsp__sass_inst_executed_op_local_st.sum,smsp__sass_inst_executed_op_shared_ld.sum,smsp__inst_executed.sum,'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
  --csv --page details python3 tools/ncu_fp8.py --rows "$rows" ${ONLY:+--only "$ONLY"} ${GEOMETRY:+--geometry "$GEOMETRY"} > "$OUT/ncu_$rows.csv" 2> "$OUT/ncu_$rows.err"
echo "ncu rc=$? lines=$(wc -l < "$OUT/ncu_$rows.csv")"; grep -E "^ran|tiling|==PROF==|ERR" "$OUT/ncu_$rows.csv" "$OUT/ncu_$rows.err" | head -12
python3 - "$OUT/ncu_$rows.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit("no ncu rows")
head, body = rows[0], rows[1:]
ix = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
want = ("Duration", "Registers Per Thread", "Achieved Occupancy", "Theoretical Occupancy", "DRAM Throughput",
        "Memory Throughput", "Block Limit Registers", "Executed Instructions", "Local Memory Spilling Requests",
        "smsp__sass_inst_executed_op_local_ld.sum", "smsp__sass_inst_executed_op_local_st.sum",
        "smsp__sass_inst_executed_op_shared_ld.sum", "Issue Slots Busy", "Warp Cycles Per Issued Instruction",
        "Dynamic Shared Memory Per Block", "Threads", "L2 Hit Rate", "Block Limit Shared Mem",
        "Static Shared Memory Per Block")
table = {}
for r in body:
    if r[ix["Metric Name"]] in want:
        table.setdefault((r[ix["ID"]], r[ix["Kernel Name"]][:40]), {})[r[ix["Metric Name"]]] = r[ix["Metric Value"]]
    elif r[ix["Metric Name"]].startswith("smsp__average_warps_issue_stalled"):
        try:
            v = float(r[ix["Metric Value"]].replace(",", ""))
        except ValueError:
            continue
        if v >= 0.3:  # the stall reasons that matter (warps stalled per issued instruction)
            stall = r[ix["Metric Name"]].removeprefix("smsp__average_warps_issue_stalled_")
            table.setdefault((r[ix["ID"]], r[ix["Kernel Name"]][:40]), {})["stall " + stall.split("_per_")[0]] = v
for (i, name), m in table.items():
    print(f"NCU {i} {name}: " + "; ".join(f"{k}={v}" for k, v in m.items()))
PY
