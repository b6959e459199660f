#!/usr/bin/env bash
# Session 30, call c. Asked for as kind nvidia-h200 (carry .whl .cache/originals; <= 440 s on an
# H200, <= 200 s on an H100).
# - H200 (issue 13's card): gpu_session29_a.sh's H200 branch (the targets; predictions there).
# - H100: TP1 fp8 8 rows, where the default ran 1.03x of 0.34.0 twice in call a/b (the split
#   kernel 13.96 against 13.53 µs at 0.34.0's tiling). Session 28 had the torch route's launch of
#   our kernel level with 0.34.0 and JAX's 0.5-1.2% above. Here: 0.34.0, auto (JAX's launch) and
#   shim-tt (the same Triton kernel launched by Triton on torch's stream) at 4 / 8 / 16 rows, three
#   processes on fresh sets (seeds 0-2). Prediction: shim-tt within 1% of 0.34.0's split kernel,
#   auto 1-3% above both at 8 rows; i.e. the gap is JAX's launch of the same cubin, not our source.
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$card" == *H200* ]]; then
  exec bash tools/sessions/gpu_session29_a.sh
fi
source tools/gpu_env.sh
for seed in 0 1 2; do
  timeout -s TERM 60 python3 -m bench.run --op sparse --impl original034,auto,shim-tt --kv-dtype fp8 \
    --rows 4,8,16 --tp TP1 --n-calls 20 --eager-calls 3 --seed $seed --no-progress --no-plot \
    --out "$OUT/seed$seed" > "$OUT/seed$seed.log" 2>&1
  echo "seed $seed rc=$?"; rm -f "$OUT/seed$seed/results.partial.json"
done
python3 - "$OUT" <<'PY'
import json, os, sys
print("| seed | rows | impl | busy µs | split µs | merge µs |")
for seed in range(3):
    path = os.path.join(sys.argv[1], f"seed{seed}", "results.json")
    if not os.path.exists(path):
        continue
    for r in json.load(open(path))["results"]:
        k = r.get("busy_kernels_us") or {}
        split = sum(v for n, v in k.items() if "merge" not in n)
        merge = sum(v for n, v in k.items() if "merge" in n)
        print(f"| {seed} | {r['rows']} | {r['impl']} | {(r.get('busy_s') or float('nan')) * 1e6:.2f} | {split:.2f} | {merge:.2f} |")
PY
