#!/usr/bin/env bash
# Session 12, call f (about 3 min of device time): the default route's eager cost after call e's
# fidelity fixes, which change triton-torch's small launches on 0.30.0's table (64 splits of 65
# tiles, no longer 65, at <= 24 programs; the merge over whole D on 2 warps at <= 256 row-heads).
# tools/profile_shim.py --grid at 1, 8, 64 rows, TP1 and TP4: the default route (no
# implementation=) and triton-torch with new q and gate objects, against vLLM 0.30.0.
# Prediction: within 2-3 us of call b's (one split walks a second tile; the merge reads whole D).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session12_f.sh
source tools/gpu_env.sh
for tp in TP1 TP4; do
  timeout 80 python3 tools/profile_shim.py --grid 1,8,64 --tp $tp \
    --columns "shim default route,shim triton-torch new q+gate" > "$OUT/grid_$tp.log" 2>&1
  echo "grid $tp rc=$?"; grep -E "^\| (rows|[0-9])|worst" "$OUT/grid_$tp.log" | tail -5
done
