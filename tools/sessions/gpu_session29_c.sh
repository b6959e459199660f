#!/usr/bin/env bash
# Session 29, call c (any H100/H200; carry .whl .cache/originals; <= 560 s).
# Call a (gpu_next_k.sh, now gpu_session29_a_merge_sweep.sh, on an H100) timed the split merge's layouts at 96-240 pairs: for the
# jax-triton merge, whole D on 2 warps beat the 64-wide chunks by 0.12-0.28 µs from 192 pairs in
# all eight cases, fp8 and bf16, TP1 and TP4, and was mixed at 96; the Pallas merge went the other
# way. So config.TRITON_MERGE_SPLIT_D_MAX_PAIRS = 128 (Pallas keeps MERGE_SPLIT_D_MAX_PAIRS = 256).
# 1. GPU parity of the changed launch (the merge's sum may associate differently): fp8 e4m3 and
#    bf16 at TP2/TP4 (GPU_ROWS has TP2 16 and TP4 32 rows, 192 pairs; none of its TP1 rows is in
#    the changed 129-256 pairs) against 0.34.0 and exact attention; test_gpu_parity.py for
#    triton at rows 8 / 16 / 32 (192 pairs at TP1 / TP2 / TP4).
#    Prediction: all pass.
# 2. Busy time, default (auto) against 0.34.0, fp8 at TP1 4/8/10 and TP4 16/32/40 rows (and the
#    others the flag lists), with the new threshold. Prediction: TP1 8 rows from 1.019x (session
#    28 call c) to about 1.005-1.01x; no case with 96 pairs or fewer moves (same launch).
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 170 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s tests/test_fp8.py \
  -k "gpu_fp8_parity and not bytes and not TP1" > "$OUT/gpu_fp8_parity.log" 2>&1
echo "fp8 parity rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_fp8_parity.log" | tail -5
grep -E "FP8PARITY .* impl=triton rows=(16|32) " "$OUT/gpu_fp8_parity.log" | head -12
QSA_PARITY_IMPLS=triton QSA_PARITY_ROWS=8,16,32 timeout -s INT 130 python3 -m pytest -q -m gpu -s \
  -p no:cacheprovider -rfE tests/test_gpu_parity.py -k sparse_attention > "$OUT/gpu_parity_triton.log" 2>&1
echo "bf16 parity (triton) rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_parity_triton.log" | tail -5
grep -E "^PARITY" "$OUT/gpu_parity_triton.log" | head -9
timeout -s TERM 170 python3 -m bench.run --op sparse --impl original034,auto --kv-dtype fp8 \
  --rows 4,8,10,16,32,40 --tp TP1,TP4 --n-calls 10 --eager-calls 3 --no-progress --no-plot \
  --out "$OUT/decode_fp8" > "$OUT/decode_fp8.log" 2>&1
echo "decode rc=$?"; [ -f "$OUT/decode_fp8/results.json" ] && rm -f "$OUT/decode_fp8/results.partial.json"
python3 - "$OUT/decode_fp8" <<'PY'
import json, os, sys
d = sys.argv[1]
path = os.path.join(d, "results.json")
path = path if os.path.exists(path) else os.path.join(d, "results.partial.json")
res = json.load(open(path))["results"]
key = lambda r: (r["geometry"].split()[0], r["rows"], r["impl"])
busy = {key(r): (r.get("busy_s") or float("nan")) * 1e6 for r in res}
kern = {key(r): r.get("busy_kernels_us") or {} for r in res}
for tp, rows in sorted({k[:2] for k in busy}):
    a, o = busy.get((tp, rows, "auto"), float("nan")), busy.get((tp, rows, "original034"), float("nan"))
    merge = {i: next((v for k, v in kern.get((tp, rows, i), {}).items() if "merge" in k), float("nan"))
             for i in ("auto", "original034")}
    print(f"TABLE {tp} fp8 rows={rows:3d}: auto {a:7.2f} / 0.34.0 {o:7.2f} = {a / o:.3f}; "
          f"merge {merge['auto']:.2f} / {merge['original034']:.2f} us")
PY
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz --exclude=decode_fp8 . 2>/dev/null && rm -f "$OUT"/*.log
true
