#!/usr/bin/env bash
# After session 9 (not yet run; about 8 min of device time): should order="inverted" become the
# backward's default? Session 9 made its dK/dV kernel 2.3x faster (2 warps) and the whole
# inverted backward 6.52 ms against 10.57 for "selection" -- at TP1 1024 rows, one request per
# row only. This times both orders, and the inverted order's dq walk at 8 (default), 4 and 2 warps
# (dq_warps, the 6th variant field), at 64 / 1024 / 2048 rows for one request per row and for one
# long sequence (training), TP1; then TP4 at 1024 rows. Also jax.grad with each order as the
# default. Decide from busy time per call (bench.backward's table) and peak memory.
# Usage (device tool; no carry needed): bash tools/sessions/gpu_session10_a.sh
source tools/gpu_env.sh
V=inverted,inverted:16:2:0:0:4,inverted:16:2:0:0:2
timeout 420 python3 -m bench.backward --tp TP1 --rows 64,1024,2048 --requests 0,1 --reps 3 --no-xla \
  --no-acq-rel --variants $V --grad-orders inverted --out "$OUT/bwd_tp1" 2>&1 | grep -v -i warning | grep "^|"
timeout 120 python3 -m bench.backward --tp TP4 --rows 1024 --requests 0,1 --reps 3 --no-xla \
  --no-acq-rel --variants $V --grad-orders inverted --out "$OUT/bwd_tp4" 2>&1 | grep -v -i warning | grep "^|" | tail -14
