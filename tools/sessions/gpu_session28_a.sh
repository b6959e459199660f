#!/usr/bin/env bash
# Session 28, call a (carry .whl .cache/originals), asked for as kind nvidia-h200. On an H200: issue
# 13's trimmed targets (gpu_session27_f.sh: the grid and the decode rows against 0.34.0). On an
# H100: the same-process test of the assembler hypothesis prepared in session 27
# (gpu_next_h.sh; its header holds the predictions).
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card; $(date -u +%FT%TZ)"
if [[ "$card" == *H200* ]]; then
  bash tools/sessions/gpu_session27_f.sh
else
  # ran session 27's script as it stood at 771e8eb (then gpu_next_h.sh); fixed since, as call b
  bash tools/sessions/gpu_session28_b.sh
fi
