#!/usr/bin/env bash
# Session 13, call c (about 3 min of device time): why jax-triton's split kernel takes 374 us
# against vLLM 0.30.0's 268 us at TP4 512 rows on 0.30.0's tiling (64/4 splits/2 warps; same bits;
# call b), when both compile on the CPU to the same registers, shared memory and loop.
#  1. tools/split_kernel_probe.py: busy time of each kernel on a 512-page pool (34 MB, in L2) and
#     a 4000-page pool (262 MB);
#  2. the same under Nsight Compute (launch statistics, occupancy, memory and L2 throughput), and
#     the Triton cache of both kernels (the cubins the GPU ran) for a CPU diff.
# Prediction: the gap stays on the large pool (it is not an L2 artefact); ncu shows a
# difference in the launch (registers/shared/grid) or in L2 hit rate.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session13_c.sh
source tools/gpu_env.sh
set -o pipefail
export TRITON_CACHE_DIR="$OUT/triton_cache"
timeout 90 python3 tools/split_kernel_probe.py --tp TP4 --rows 512 --pages 512,4000 2>&1 | grep -v -i warn \
  | tee "$OUT/probe.log"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
timeout 150 "$NCU" --clock-control none --target-processes all \
  -k 'regex:sparse_attention_split_kernel|_qsa_sparse_paged_gqa_splitk_kernel' --launch-skip 0 --launch-count 8 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
  --section SchedulerStats --section WarpStateStats \
  --metrics lts__t_sector_hit_rate.pct,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,smsp__inst_executed.sum \
  --csv --page details python3 tools/split_kernel_probe.py --tp TP4 --rows 512 --pages 512,4000 --calls 2 --no-trace \
  > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
echo "ncu rc=$? lines=$(wc -l < "$OUT/ncu.csv")"; tail -3 "$OUT/ncu.err"
python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit("no ncu rows")
head, body = rows[0], rows[1:]
ix = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
want = ("Duration", "Registers Per Thread", "Achieved Occupancy", "Theoretical Occupancy", "DRAM Throughput",
        "Grid Size", "Block Size", "Dynamic Shared Memory Per Block", "Static Shared Memory Per Block",
        "lts__t_sector_hit_rate.pct", "dram__bytes_read.sum", "smsp__inst_executed.sum", "L2 Hit Rate",
        "Warp Cycles Per Issued Instruction", "Waves Per SM", "Block Limit Shared Mem", "Block Limit Registers")
table = {}
for r in body:
    if r[ix["Metric Name"]] in want:
        table.setdefault((r[ix["ID"]], r[ix["Kernel Name"]][:36]), {})[r[ix["Metric Name"]]] = r[ix["Metric Value"]]
for (i, k), m in table.items():
    print(i, k, "; ".join(f"{a}={b}" for a, b in m.items()))
PY
tar -C "$OUT" -czf "$OUT/triton_cache.tgz" triton_cache && rm -rf "$OUT/triton_cache"
