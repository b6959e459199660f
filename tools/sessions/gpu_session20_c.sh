#!/usr/bin/env bash
# Session 20, call c (device tool, the H100 of call a while warm; carry .whl .cache/originals).
# Call a found the Gluon kernel bit-identical but not faster on an H100 (+1% TP1, +6% TP4). Is
# the fp8 kernel at the H100's copy bandwidth already (then no kernel change can show here)?
# 1. the card's copy bandwidth (bench.machine), 2. bf16 at the table's launch, same programs,
# through the same tool (fp8/bf16 throughput of the jax-triton route), 3. memcheck of the Gluon
# kernel (part fp8_gluon) with the planted control.
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 60 python3 -c "
from bench import machine
print('copy bandwidth', machine.copy_bandwidth(True))" 2>&1 | tail -2
timeout -s INT 150 python3 tools/fp8_kernel_ab.py --impl auto --kv-dtype bf16 --programs 2048,4096 \
  --geometries TP1,TP4 --configs table --runs 2 --n-sets 6 --out "$OUT/bf16" > "$OUT/bf16.log" 2>&1
echo "bf16 rc=$?"; grep -E "programs|knob=" "$OUT/bf16.log" | sed 's/ err .*\[/ [/' | tail -12
IMPLS=triton PARTS=fp8_gluon PART_TIMEOUT=150 bash tools/gpu_memcheck_parts.sh
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
