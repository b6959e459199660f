#!/usr/bin/env bash
# Session 29 call b (was gpu_next_j.sh; run inline on call a's machine). Prepared in session 28 (any H100/H200; carry .whl .cache/originals; <= 300 s).
# bf16 caches run Pallas first at every entry of the measured table (config.sparse_attention_order),
# a choice made when JAX's jax-triton launches ran XLA's ptxas (CUDA 13.0). Since session 28 they run
# the cubin Triton's own ptxas makes (ops/_triton_images.py), which was 2.5-3.9% faster at TP1 fp8
# 16-64 rows. Does that move any bf16 entry? Busy time, same fresh sets, pallas / triton / 0.30.0 /
# 0.34.0 at the bf16 table's entries (1-4096 rows), TP1 and TP4. Prediction: triton within +-3% of
# pallas at most entries; the order changes only where triton wins by > 2% at both TP1 and TP4 and
# stays within 1.10x of the originals' error (check column).
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
slug=$(echo "$card" | tr 'A-Z ' 'a-z-')_$(date +%F)
timeout -s TERM 270 python3 -m bench.run --op sparse --impl original,original034,pallas,triton --kv-dtype bf16 \
  --rows 1,4,8,16,64,256,1024,4096 --trace-rows 4096 --n-calls 10 --eager-calls 3 --no-progress --no-plot \
  --out "$OUT/${slug}_bf16_order" --tp TP1,TP4 > "$OUT/bf16_order.log" 2>&1
echo "bf16 order rc=$?"; d="$OUT/${slug}_bf16_order"
[ -f "$d/results.json" ] && rm -f "$d/results.partial.json"; tail -n 2 "$OUT/bf16_order.log"
python3 - "$d" <<'PY'
import json, os, sys
path = os.path.join(sys.argv[1], "results.json")
if not os.path.exists(path):
    path = os.path.join(sys.argv[1], "results.partial.json")
busy = {}
for r in json.load(open(path))["results"]:
    busy[(r["geometry"], r["rows"], r["impl"])] = (r.get("busy_s") or float("nan")) * 1e6
for geo, rows in sorted({k[:2] for k in busy}):
    p, t = busy.get((geo, rows, "pallas"), float("nan")), busy.get((geo, rows, "triton"), float("nan"))
    o = min(busy.get((geo, rows, "original"), float("inf")), busy.get((geo, rows, "original034"), float("inf")))
    print(f"TABLE {geo:8s} rows={rows:5d}: pallas {p:9.2f} triton {t:9.2f} us  triton/pallas {t / p:.3f}  "
          f"pallas/orig {p / o:.3f}  triton/orig {t / o:.3f}")
PY
true
