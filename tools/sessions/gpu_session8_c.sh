#!/usr/bin/env bash
# Session 8, call C (about 4 min of device time). Call B found the Pallas fp8 kernel's
# gap to 0.34.0 at the same tiling in XLA's Triton build: the GPU-compiled kernel keeps one
# register per async-copy shared-memory destination (48 per tile, no base+immediate form),
# spills them and reloads them before each copy (28 LDL per tile against 4; 46% of the
# stall samples are long-scoreboard waits, 34% on the V copies), while the same TTIR
# compiled by Triton 3.6 on CPU folds them as 0.34.0's does.
#  1. The jax-triton implementation (the same kernel family compiled by the installed
#     Triton 3.6) against 0.34.0 on fp8, TP1/TP4, 256/1024/2048 programs, with the Pallas
#     table in the same process.
#  2. XLA's dump of the Pallas fp8 kernel's Triton compilation (TTGIR/LLVM if XLA writes
#     them), TP1 512 rows, bn32 / 4 splits / 1 warp, for comparison with Triton 3.6's.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session8_c.sh
source tools/gpu_env.sh
set -o pipefail
timeout 170 python3 tools/fp8_kernel_ab.py --impl triton --programs 256,1024,2048 --geometries TP1,TP4 \
  --configs table --out "$OUT/ab_triton" 2>&1 | grep -v -i warning | tee "$OUT/ab_impls.log" | tail -14
timeout 150 python3 tools/fp8_kernel_ab.py --impl pallas --programs 256,1024,2048 --geometries TP1,TP4 \
  --configs table --out "$OUT/ab_pallas" 2>&1 | grep -v -i warning | tee -a "$OUT/ab_impls.log" | tail -14
mkdir -p /tmp/xd
XLA_FLAGS="--xla_dump_to=/tmp/xd --xla_dump_emitter_re=.* --xla_gpu_dump_llvmir" MLIR_ENABLE_DUMP=1 \
  timeout 90 python3 tools/ncu_fp8.py --rows 512 --repeat 1 --only pallas_fp8 --config 32/4/1 \
  > "$OUT/xla_dump_run.log" 2> /tmp/xd/stderr.txt; echo "dump rc=$?"
ls /tmp/xd | head -30; ls /tmp/xd | wc -l; du -sh /tmp/xd
grep -c "IR Dump" /tmp/xd/stderr.txt
grep -l -E "ttg\.|triton_gpu|ttng|nvvm" /tmp/xd/* 2>/dev/null | head
tar -C /tmp -czf "$OUT/xla_dump.tgz" xd; ls -la "$OUT/xla_dump.tgz"
tar -C "$OUT" -czf "$OUT/ab_impls.tgz" ab_triton ab_pallas 2>/dev/null && rm -rf "$OUT/ab_triton" "$OUT/ab_pallas"
