#!/usr/bin/env bash
# Session 17, call b (run; results in bench/results/nvidia-h200_2026-12-05/session17/call_b/).
# It replaces two scripts that were written and never run (no device in sessions 13-16):
# session 15's call a (issue 16's gather probe, the fp32 cache cotangent, the kernels inside
# jax.shard_map, the mesh vjp on one GPU) and what session 13's call k owed besides the memcheck
# and the split-kernel A/B that call a of this session made (the benchmark's in-turns column on
# the final kernels, 0.30.0 parity of "triton").
# Predictions: probe >= 2.5 ms at TP1 1024 rows: gather-bound; <= 1.5 ms: headroom (notes/backward.md,
# session 15); in turns <= 1.0 at every cell; parity 24 passed, relative error 0 (session 13).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session17_b.sh
source tools/gpu_env.sh
set -o pipefail
for tp in TP1 TP4; do
  timeout -s INT 120 python3 tools/backward_gather_probe.py --tp "$tp" --rows 1024 --out "$OUT/probe_$tp" \
    > "$OUT/probe_$tp.log" 2>&1; echo "probe $tp rc=$?"; cat "$OUT/probe_$tp/gather_probe.md" 2>/dev/null
done
timeout -s INT 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_shard_map.py \
  > "$OUT/shard_map.log" 2>&1; echo "pallas inside shard_map rc=$?"; tail -2 "$OUT/shard_map.log"
timeout -s INT 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_gpu_backward.py -k fp32_cache \
  > "$OUT/fp32_cache.log" 2>&1; echo "fp32 cache cotangent rc=$?"; tail -2 "$OUT/fp32_cache.log"
timeout -s INT 90 python3 tools/multi_gpu.py --rows 64,1024 --out "$OUT/multi_gpu" > "$OUT/multi_gpu.log" 2>&1
echo "multi_gpu (1 GPU) rc=$?"; tail -12 "$OUT/multi_gpu/multi_gpu.md" 2>/dev/null
timeout 120 python3 -m bench.run --impl original,original034,shim --op sparse --tp TP1,TP4 \
  --rows 1,8,64,512,2048 --kv-dtype bf16,fp8 --out "$OUT/bench_shim" > "$OUT/bench_shim.log" 2>&1
echo "bench rc=$?"; tail -1 "$OUT/bench_shim.log"
sed -n '/^| where | rows | prefill cfg | original/,/^$/p' "$OUT/bench_shim/results.md"
QSA_PARITY_IMPLS=triton timeout -s INT 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s \
  tests/test_gpu_parity.py -k "sparse_attention" > "$OUT/parity030_triton.log" 2>&1
echo "0.30 parity (triton) rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/parity030_triton.log" | tail -4
