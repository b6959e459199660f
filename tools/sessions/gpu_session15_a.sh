#!/usr/bin/env bash
# Session 15, call a -- NOT RUN in session 15 (no device machine was lent: status "paused").
# Issue 16: is the inverted backward's dK/dV kernel bound by its gathers? (notes/backward.md,
# "Session 15"). tools/backward_gather_probe.py times, on the benchmark's selections and the
# kernel's own inverse index, the dK/dV kernel and a probe making exactly its gathers (q and dA
# rows, multiplicities, LSE, delta) with no dots, at several lanes x warps; TP1 and TP4, 1024 rows.
# Prediction: TP1 about 12 GB gathered per call; the kernel ~3.0 ms (session 10: 2.99) = ~4 TB/s.
# If the probe takes >= ~2.5 ms the kernel is gather-bound and 2.5x the forward is out of reach at
# this shape (the model's bound); if the probe takes <= ~1.5 ms the dots or the loop's dependent
# loads cost the rest and the kernel has headroom (then: prefetch the next step's reference rows).
# Then the backward's fp32 cache cotangent (what a row-split mesh sums; test_gpu_backward.py
# -k fp32_cache: rounded, the default's bits) and the mesh gradient on the one GPU (degenerate
# 1 x 1 mesh; the vjp rows of tools/multi_gpu.py). Session 16 added: the Pallas kernels inside a
# caller's jax.shard_map with check_vma=True (test_shard_map.py -m gpu; lowered for CUDA on CPU only).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session15_a.sh
source tools/gpu_env.sh
set -o pipefail
for tp in TP1 TP4; do
  timeout -s INT 200 python3 tools/backward_gather_probe.py --tp "$tp" --rows 1024 --out "$OUT/probe_$tp" \
    > "$OUT/probe_$tp.log" 2>&1; echo "probe $tp rc=$?"; cat "$OUT/probe_$tp/gather_probe.md" 2>/dev/null
done
timeout -s INT 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_shard_map.py \
  > "$OUT/shard_map.log" 2>&1; echo "pallas inside shard_map rc=$?"; tail -2 "$OUT/shard_map.log"
timeout -s INT 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_gpu_backward.py -k fp32_cache \
  > "$OUT/fp32_cache.log" 2>&1; echo "fp32 cache cotangent rc=$?"; tail -2 "$OUT/fp32_cache.log"
timeout -s INT 150 python3 tools/multi_gpu.py --rows 64,1024 --out "$OUT/multi_gpu" > "$OUT/multi_gpu.log" 2>&1
echo "multi_gpu (1 GPU) rc=$?"; tail -12 "$OUT/multi_gpu/multi_gpu.md" 2>/dev/null
