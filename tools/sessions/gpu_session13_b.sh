#!/usr/bin/env bash
# Session 13, call b (about 4 min of device time): the default route's large cells after
# session 12's fidelity fix, which were last timed before it (TP4 bf16 512/2048 rows: 1.18/1.12
# in session 12 call b), and where the kernel time goes there.
#  1. tools/profile_shim.py --grid 512,2048 (bf16), TP1 and TP4, default route × vLLM 0.30.0;
#  2. tools/triton_torch_ab.py TP4 512/2048 rows bf16 and fp8: busy time per kernel of the
#     originals and of triton-torch at each table. A CPU compile of both split kernels for sm_90
#     at 0.30.0's TP4 512-program launch (64/4/2; tools/sm90_split_kernel_ab.py) gave the same
#     registers, shared memory and loop (1353 vs 1342 SASS instructions), so session 11's
#     366 vs 266 us there (same tiling) should not repeat.
# Prediction: TP4 512 near 1.0 now (the split kernel at ~270 us like 0.30.0's), 2048 ~1.01-1.03
# (session 11: the kernel 1% slower at one split); TP1 0.98-1.02 as before.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session13_b.sh
source tools/gpu_env.sh
set -o pipefail
for tp in TP4 TP1; do
  timeout 100 python3 tools/profile_shim.py --grid 512,2048 --tp $tp \
    --columns "shim default route" > "$OUT/grid_bf16_$tp.log" 2>&1
  echo "grid bf16 $tp rc=$?"; grep -E "^\| (rows|[0-9])|worst" "$OUT/grid_bf16_$tp.log" | tail -4
done
timeout -s INT 150 python3 tools/triton_torch_ab.py --rows 512,2048 --tp TP4 --kv bf16,fp8 \
  --out "$OUT/ab" 2>&1 | grep -v -i warn | tee "$OUT/ab.log" | grep -E "^\|" | tail -20
