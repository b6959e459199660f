#!/usr/bin/env bash
# Session 29, call e (asked for as kind nvidia-h200; carry .whl .cache/originals; <= 250 s).
# On an H200: gpu_next_i.sh (issue 13's targets). On an H100: what a Hopper with another SM count
# (H20: 78, H100 PCIe: 114) would run if the library's measured sm_90 table -- measured on 132-SM
# cards only -- gave way to vLLM 0.34.0's sm_90 table (tuned on an H20): config.MEASURED_TABLES
# emptied in the benchmark's process, so every implementation launches 0.34.0's tilings, beside
# 0.34.0 itself; busy time, bf16 and fp8, TP1 and TP4, 1-1024 rows. Also JAX's core_count and the
# GPU test that it is torch's SM count (config.device_sm_count gates the measured table on it).
# Predictions: fp8 -- jax-triton within 0.97-1.04x of 0.34.0 everywhere (its kernel launch at
# 0.34.0's tiling: sessions 10-11), Pallas 1.2-1.6x at 256-2048 programs (2026-12-03's 1.48-1.56x);
# bf16 -- both within 0.9-1.1x of 0.34.0, neither ahead everywhere.
# Trimmed to the device time left (370 s, a start included): on an H200 the grid part of
# gpu_next_i.sh alone (1024-4096 rows, fp8 and bf16, 0.30.0 / 0.34.0 / auto, TP1 and TP4).
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
source tools/gpu_env.sh
set -o pipefail
if [[ "$card" == *H200* ]]; then
  slug=$(echo "$card" | tr 'A-Z ' 'a-z-')_$(date +%F)
  timeout -s TERM 200 python3 -m bench.run --op sparse --impl original,original034,auto \
    --kv-dtype bf16,fp8 --rows 1024,2048,4096 --n-calls 10 --eager-calls 3 --no-progress --no-plot \
    --out "$OUT/${slug}_grid" --tp TP1,TP4 > "$OUT/grid.log" 2>&1
  echo "grid rc=$?"; [ -f "$OUT/${slug}_grid/results.json" ] && rm -f "$OUT/${slug}_grid/results.partial.json"
  grep -E "^\| (TP1|TP4)" "$OUT/${slug}_grid/results.md" | head -30
  exit 0
fi
python3 -c "import jax; d = jax.devices()[0]; print('core_count', d.core_count, 'capability', d.compute_capability)"
timeout -s INT 60 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_config.py -k sm_count 2>&1 | tail -n 2
timeout -s TERM 170 python3 - --op sparse --impl original034,pallas,triton --kv-dtype bf16,fp8 \
  --rows 1,8,64,256,1024 --trace-rows 1024 --n-calls 10 --eager-calls 3 --no-progress \
  --no-plot --out "$OUT/vllm034_table" --tp TP1,TP4 > "$OUT/vllm034_table.log" 2>&1 <<'PY'
import runpy, sys
from qsa_jax import config
config.MEASURED_TABLES.clear()  # every call takes vLLM 0.34.0's table for the capability
sys.argv = ["bench.run"] + sys.argv[1:]
runpy.run_module("bench.run", run_name="__main__", alter_sys=True)
PY
echo "vllm034 table rc=$?"; d="$OUT/vllm034_table"; [ -f "$d/results.json" ] && rm -f "$d/results.partial.json"
tail -n 2 "$OUT/vllm034_table.log"
python3 - "$d" <<'PY'
import json, os, sys
path = os.path.join(sys.argv[1], "results.json")
path = path if os.path.exists(path) else os.path.join(sys.argv[1], "results.partial.json")
busy, cfg = {}, {}
for r in json.load(open(path))["results"]:
    k = (r["geometry"].split()[0], r["kv_dtype"], r["rows"], bool(r.get("use_prefill_config")), r["impl"])
    busy[k] = (r.get("busy_s") or float("nan")) * 1e6
    cfg[k[:4]] = r.get("config")
for key in sorted({k[:4] for k in busy}):
    o, p, t = (busy.get(key + (i,), float("nan")) for i in ("original034", "pallas", "triton"))
    print(f"TABLE {key[0]} {key[1]:4s} rows={key[2]:5d}{' prefill' if key[3] else '        '} cfg={cfg[key]}: "
          f"0.34.0 {o:9.2f}  pallas {p / o:.3f}x  triton {t / o:.3f}x")
PY
true
