#!/usr/bin/env bash
# Session 20, call d (device tool, the same warm H100 as calls a and c): fp8 (table, jax-triton;
# and the Gluon kernel) and bf16 (the library's default) at 1024 and 8192 programs, TP1/TP4, to
# complete the H100's fp8/bf16 throughput and copy-bandwidth picture of calls a and c.
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 170 python3 tools/fp8_kernel_ab.py --impl triton --programs 1024,8192 --geometries TP1,TP4 \
  --configs table --runs 2 --n-sets 6 --knob triton_fp8_gluon_split --out "$OUT/fp8" > "$OUT/fp8.log" 2>&1
echo "fp8 rc=$?"; grep -E "programs|knob=|bit-identical" "$OUT/fp8.log" | sed 's/ err .*\[/ [/' | tail -16
timeout -s INT 130 python3 tools/fp8_kernel_ab.py --impl auto --kv-dtype bf16 --programs 1024,8192 \
  --geometries TP1,TP4 --configs table --runs 2 --n-sets 6 --out "$OUT/bf16" > "$OUT/bf16.log" 2>&1
echo "bf16 rc=$?"; grep -E "programs|knob=" "$OUT/bf16.log" | sed 's/ err .*\[/ [/' | tail -12
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
