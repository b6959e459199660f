#!/usr/bin/env bash
# Session 26, call d (carry .whl .cache/originals; ~300 s, any Hopper): an experiment. The knob it
# switches existed only in commit 7cf5f74 (removed after this run): check that commit out to rerun.
# config.triton_partials_f16 (off): the jax-triton split kernel stores its per-split outputs in
# fp16 instead of fp32 (the merge still computes in fp32). At decode the partials are of the order
# of the K/V bytes (TP1 8 rows, 33 splits: 6.5 MB written and read against 16.8 MB of fp8 K/V).
# Prediction: 3-8% less busy time at 2-64 programs where the merge runs (more where splits are
# many), nothing at one split; error from exact within 1.02x of the fp32 partials' (fp16 keeps 11
# significant bits; the output is rounded to bf16's 8). If the partials stay in the L2 between the
# two kernels the gain is smaller (a null result says the bytes were not the cost).
source tools/gpu_env.sh
set -o pipefail
for kv in fp8 bf16; do
  timeout -s INT 200 python3 tools/fp8_kernel_ab.py --impl triton --kv-dtype $kv --programs 2,16,48,64,512 \
    --geometries TP1,TP4 --configs table --knob triton_partials_f16 --out "$OUT/partials_f16_$kv" \
    > "$OUT/partials_f16_$kv.log" 2>&1
  echo "partials f16 $kv rc=$?"; grep -E "programs|knob=|bit-identical" "$OUT/partials_f16_$kv.log" | cut -c1-160
done
true
