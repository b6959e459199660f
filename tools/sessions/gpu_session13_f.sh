#!/usr/bin/env bash
# Session 13, call f (about 4 min of device time): the committed benchmark after call d's
# do_not_specialize change, and the round-robin A/B at the small row counts call e left out.
#  1. tools/triton_torch_ab.py 1 / 8 rows, TP4 and TP1, fp8 and bf16 (eager call round-robin);
#  2. bench.run --impl original,original034,shim --op sparse, TP1/TP4, 1/64/512/2048 rows,
#     bf16 and fp8 (vLLM-like selections; shim = the default route, triton-torch).
# Prediction: 1. eager ratios 0.65-0.9 (host-bound; calls a/d 0.5-0.9); 2. the eager table's shim
# column <= 1.0x the originals' at every cell but noise-level cells (single medians).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session13_f.sh
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 120 python3 tools/triton_torch_ab.py --rows 1,8 --tp TP4,TP1 --kv fp8,bf16 \
  --out "$OUT/ab" 2>&1 | grep -v -i warn | tee "$OUT/ab.log" | grep -E "^\||^TP" | grep -v "vllm-0\|---" | tail -24
timeout 200 python3 -m bench.run --impl original,original034,shim --op sparse --tp TP1,TP4 \
  --rows 1,64,512,2048 --kv-dtype bf16,fp8 --out "$OUT/bench_shim" > "$OUT/bench_shim.log" 2>&1
echo "bench rc=$?"; tail -1 "$OUT/bench_shim.log"
python3 - "$OUT/bench_shim/results.md" <<'PY'
import sys
text = open(sys.argv[1]).read()
start = text.find("| where | rows | prefill cfg | original µs |")
print(text[start:text.find("\n\n", start)])
PY
