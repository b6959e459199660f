#!/usr/bin/env bash
# Session 13, call g (about 3 min of device time; rerun as call h after the capture mode change): call f's benchmark again, now with the
# eager table's "in turns" column (bench.timing.eager_latency_paired: the shim and the case's
# original timed in alternating blocks of calls), because call f's single medians moved the
# originals' 1-row call between 119 and 254 us for the same host path.
# Prediction: the in-turns ratio of the default route (shim) <= 1.0 at every cell (call e/f's
# round-robin A/B: 0.70-1.00); the seen / new-tensor columns as noisy as before.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session13_g.sh
source tools/gpu_env.sh
set -o pipefail
timeout 240 python3 -m bench.run --impl original,original034,shim --op sparse --tp TP1,TP4 \
  --rows 1,64,512,2048 --kv-dtype bf16,fp8 --out "$OUT/bench_shim" > "$OUT/bench_shim.log" 2>&1
echo "bench rc=$?"; tail -1 "$OUT/bench_shim.log"
python3 - "$OUT/bench_shim/results.md" <<'PY'
import sys
text = open(sys.argv[1]).read()
start = text.find("| where | rows | prefill cfg | original µs |")
print(text[start:text.find("\n\n", start)])
PY
