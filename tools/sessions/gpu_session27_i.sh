#!/usr/bin/env bash
# Session 27, call i (carry .whl .cache/originals; <= 300 s), any card.
# Calls a-d: the JAX launch of the split kernel runs 1-4% longer than torch's at TP1 fp8 decode,
# with the same code; call b saw the torch launch as slow once in another process. Left: where
# the buffers lie (XLA's allocator against torch's) and the launch call itself. Here XLA's
# allocator is switched (XLA_PYTHON_CLIENT_ALLOCATOR: default BFC pool, "platform" = a
# cudaMalloc per buffer, "cuda_async"), two processes each, TP1 fp8 16 and 64 rows; the metric is
# auto's split kernel over shim-tt's in the same process. Prediction: if placement is the cause,
# some allocator brings the ratio to 1.00 +- 0.01 in both its processes; else all stay 1.02-1.04.
source tools/gpu_env.sh
set -o pipefail
slug=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')_$(date +%F)
for alloc in default platform cuda_async; do
  for n in 1 2; do
    env $([ "$alloc" != default ] && echo XLA_PYTHON_CLIENT_ALLOCATOR=$alloc) timeout -s TERM 60 \
      python3 -m bench.run --op sparse --impl auto,shim-tt --shim-graph --kv-dtype fp8 --rows 16,64 --tp TP1 \
      --trace-rows 64 --n-calls 10 --eager-calls 3 --no-progress --no-plot --out "$OUT/${alloc}_$n" \
      > "$OUT/${alloc}_$n.log" 2>&1
    echo "$alloc $n rc=$?"
  done
done
python3 - "$OUT" <<'PY'
import json, sys, pathlib
for d in sorted(pathlib.Path(sys.argv[1]).glob("*_[12]")):
    p = d / "results.json"
    if not p.exists():
        print(d.name, "no results"); continue
    split = {}
    for r in json.loads(p.read_text())["results"]:
        k = r.get("busy_kernels_us") or {}
        split[(r["rows"], r["impl"])] = next((v for n, v in k.items() if "split" in n), float("nan"))
    print(d.name, " ".join(f"rows={rows}: auto {split[(rows, 'auto')]:.2f} shim-tt {split[(rows, 'shim-tt')]:.2f} "
                           f"ratio {split[(rows, 'auto')] / split[(rows, 'shim-tt')]:.3f}" for rows in (16, 64)))
PY
true
