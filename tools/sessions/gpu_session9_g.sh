#!/usr/bin/env bash
# Session 9, last device call (about 2.5 min): the token-major dK/dV kernel executes 4.3x the
# default kernel's HMMA instructions (gpu_session9_e.sh). One candidate cause is warps: its dots
# are [32 lanes, 16 slots] tiles spread over 8 warps, which Triton may cover by repeating work.
# Time the inverted order at 8 (default), 4 and 2 warps, and 64 lanes at 4 warps, against the
# default order; TP1 1024 rows, one request per row.
# Usage (device tool; no carry needed): bash tools/sessions/gpu_session9_g.sh
source tools/gpu_env.sh
timeout 200 python3 -m bench.backward --rows 1024 --reps 5 --no-xla --no-acq-rel \
  --variants inverted,inverted:16:4,inverted:16:2,inverted:16:4:0:64 --out "$OUT/bwd" 2>&1 \
  | grep -v -i warning | grep "^|" | tail -8
