#!/usr/bin/env bash
# Session 13, call h (about 3 min of device time): call g again after bench.timing.torch_graph
# captures with capture_error_mode="thread_local" (call g: one capture of 0.34.0's TP1 2048-row
# prefill calls failed with cudaErrorStreamCaptureInvalidated, the other 44 cases captured).
# Prediction: every case captures and passes its check; the in-turns column <= 1.0 (call g 0.69-0.99).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session13_h.sh
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
