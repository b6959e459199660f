#!/usr/bin/env bash
# Session 28, call d (any H100/H200; carry .whl .cache/originals; <= 560 s).
# Call c checked the Triton-image hook (ops/_triton_images.py) on the sparse-attention split and
# merge kernels and the bf16/compress/store parity of `triton`. Every other kernel JAX launches
# through jax-triton now runs Triton's image too: the Gluon split kernel, the indexer ops, the
# strided-query and sharded launches. Here the GPU tests of those files, and compute-sanitizer
# memcheck of the triton implementation (every part, with the planted control).
# Prediction: all pass; memcheck 0 errors in every triton part, the planted control errors.
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 380 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_gluon.py tests/test_triton.py \
  tests/test_indexer_ops.py tests/test_shard_map.py tests/test_strided_query.py tests/test_fused_merge.py \
  tests/test_shim_direct.py tests/test_shim_vllm034.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -12
IMPLS=triton PART_TIMEOUT=45 bash tools/gpu_memcheck_parts.sh
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
true
