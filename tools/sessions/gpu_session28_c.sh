#!/usr/bin/env bash
# Session 28, call c (any H100/H200; carry .whl .cache/originals; <= 560 s).
# Calls a-b proved that XLA's ptxas (CUDA 13.0) is what makes JAX's launches of the split kernel
# 2.6-3.9% slower at TP1 fp8 16-64 rows. Since then ops/_triton_images.py puts the cubin Triton's
# own ptxas makes into jax-triton's kernel proto (TritonKernel.module_image), which jaxlib 0.11.2
# loads instead of assembling the PTX.
# 1. GPU tests of the hook: the lowering carries Triton's image for split and merge (and the
#    launch agrees with XLA); a wrong image fails the launch (jaxlib loads what the proto carries).
# 2. A/B in two processes, the torch route (shim-tt, Triton's own launch) as each run's
#    reference: JAX's split kernel / torch's at TP1 fp8 8-1024 rows and TP4 32 rows, with the
#    images (default) and without (config switched off). Prediction: with images 0.99-1.01 at
#    every row count; without 1.02-1.045 at TP1 16-64 rows (calls a-b), ~1.00 at 8 and 1024.
#    The default run also has 0.34.0, for the standing against it.
# 3. GPU parity of the kernels JAX now runs from Triton's images: fp8 e4m3 (TP1/TP2/TP4, every
#    implementation against 0.34.0 and exact attention) and bf16 + compress + store
#    (test_gpu_parity, triton only, rows 1,16,64,1024). Prediction: all pass.
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_triton_images.py \
  > "$OUT/gpu_images_tests.log" 2>&1
echo "image tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_images_tests.log" | tail -5
args=(--op sparse --kv-dtype fp8 --rows 8,16,32,64,1024 --tp TP1,TP4 --trace-rows 1024 --n-calls 10
      --eager-calls 3 --no-progress --no-plot --shim-graph)
timeout 120 python3 -m bench.run --impl original034,auto,shim-tt "${args[@]}" --out "$OUT/images" > "$OUT/images.log" 2>&1
echo "images rc=$?"
timeout 100 python3 - "${args[@]}" --impl auto,shim-tt --out "$OUT/no_images" > "$OUT/no_images.log" 2>&1 <<'PY'
import runpy, sys
from qsa_jax import config
config.jax_triton_images_from_triton_ptxas = lambda: False  # read at each lowering
sys.argv = ["bench.run"] + sys.argv[1:]
runpy.run_module("bench.run", run_name="__main__", alter_sys=True)
PY
echo "no_images rc=$?"
python3 - "$OUT" <<'PY2'
import json, sys
for variant in ("images", "no_images"):
    try:
        res = json.load(open(f"{sys.argv[1]}/{variant}/results.json"))["results"]
    except OSError as e:
        print(variant, "no results:", e); continue
    key = lambda r: (r["geometry"].split()[0], r["rows"], r["impl"])
    split = {key(r): next((v for k, v in (r.get("busy_kernels_us") or {}).items() if "split" in k or "gqa" in k),
                          None) for r in res}
    busy = {key(r): (r.get("busy_s") or float("nan")) * 1e6 for r in res}
    for tp, rows in sorted({k[:2] for k in split}):
        a, t, o = (split.get((tp, rows, i)) or float("nan") for i in ("auto", "shim-tt", "original034"))
        ab, ob = busy.get((tp, rows, "auto")) or float("nan"), busy.get((tp, rows, "original034")) or float("nan")
        print(f"TABLE {variant:9s} {tp} fp8 rows={rows:5d}: JAX split {a:8.2f} us, torch split {t:8.2f} us, "
              f"JAX/torch {a / t:.3f}; busy auto {ab:8.2f} / 0.34.0 {ob:8.2f} = {ab / ob:.3f}")
PY2
timeout -s INT 130 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s tests/test_fp8.py \
  -k "gpu_fp8_parity and e4m3 and not bytes" > "$OUT/gpu_fp8_parity.log" 2>&1
echo "fp8 parity rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_fp8_parity.log" | tail -5
QSA_PARITY_IMPLS=triton QSA_PARITY_ROWS=1,16,64,1024 timeout -s INT 150 python3 -m pytest -q -m gpu \
  -p no:cacheprovider -rfE tests/test_gpu_parity.py > "$OUT/gpu_parity_triton.log" 2>&1
echo "bf16/compress/store parity (triton) rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_parity_triton.log" | tail -5
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
true
