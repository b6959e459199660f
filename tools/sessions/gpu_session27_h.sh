#!/usr/bin/env bash
# Session 27, call h (carry .whl .cache/originals), asked for as kind nvidia-h200 with the ~420 s
# of device time left.
# - On an H200: gpu_session27_f.sh's trimmed issue-13 targets (grid and decode; predictions there).
# - On an H100: the review's fix to bench.measure (torch-side busy time traced exactly once: the
#   graph it timed, or a shim's eager loop) on the GPU, through bench.run itself: TP1, 1 and 8
#   rows, fp8 and bf16, the originals, auto, shim and shim-tt, once with --shim-graph (the shims
#   traced in their graphs) and once without (over their eager loops). Prediction: every case
#   passes its check, every traced case has a busy time, and each shim's busy time lies within 3%
#   between the two runs (the same kernels; the loop's gaps left out).
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
if [[ "$card" == *H200* ]]; then
  exec bash tools/sessions/gpu_session27_f.sh
fi
source tools/gpu_env.sh
set -o pipefail
slug=$(echo "$card" | tr 'A-Z ' 'a-z-')_$(date +%F)
for mode in graph loop; do
  flag=""; [ "$mode" = graph ] && flag="--shim-graph"
  timeout -s TERM 120 python3 -m bench.run --op sparse --impl original,original034,auto,shim,shim-tt $flag \
    --kv-dtype fp8,bf16 --rows 1,8 --tp TP1 --trace-rows 64 --n-calls 4 --eager-calls 3 --no-progress --no-plot \
    --out "$OUT/${slug}_shim_$mode" > "$OUT/shim_$mode.log" 2>&1
  echo "bench ($mode) rc=$?"; rm -f "$OUT/${slug}_shim_$mode/results.partial.json"; tail -n 2 "$OUT/shim_$mode.log"
done
python3 - "$OUT" "$slug" <<'PY'
import json, sys, pathlib
out, slug = sys.argv[1:]
busy = {}
for mode in ("graph", "loop"):
    p = pathlib.Path(out) / f"{slug}_shim_{mode}" / "results.json"
    recs = json.loads(p.read_text())["results"]
    bad = [(r["impl"], r["rows"], r["kv_dtype"]) for r in recs if r.get("error") or not (r.get("check") or {}).get("ok", True)]
    missing = [(r["impl"], r["rows"], r["kv_dtype"]) for r in recs if "busy_s" not in r]
    print(f"{mode}: {len(recs)} cases, failed/raised {bad}, without busy time {missing}")
    for r in recs:
        busy[(mode, r["impl"], r["rows"], r["kv_dtype"])] = (r.get("busy_s") or 0) * 1e6, r.get("method")
for (mode, impl, rows, kv), (us, method) in sorted(busy.items()):
    if mode == "loop" and impl.startswith("shim"):
        g = busy.get(("graph", impl, rows, kv), (0, None))[0]
        print(f"{impl:8s} {kv} rows={rows}: busy graph {g:6.2f} loop {us:6.2f} us ({us / g:.3f}x)")
PY
true
