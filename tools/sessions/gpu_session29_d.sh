#!/usr/bin/env bash
# Session 29, call d (call c's start failed; a plain run then asked for an H200 only).
# On an H200: call a's H200 branch (issue 13's targets: the grid at 1024-4096 rows, decode
# against 0.34.0, the image tests); call c follows in the next call. On an H100: call c.
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$card" == *H200* ]]; then
  bash tools/sessions/gpu_session29_a.sh
  tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz --exclude='*_grid' --exclude='*_decode' . 2>/dev/null \
    && rm -f "$OUT"/*.log
else
  bash tools/sessions/gpu_session29_c.sh
fi
