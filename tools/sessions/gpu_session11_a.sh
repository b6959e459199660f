#!/usr/bin/env bash
# Session 11, call a (about 7 min of device time). Two questions, both "does the kernel at the
# originals' own tiling beat the library's current choice?":
#  1. fp8 and bf16 (tools/fp8_kernel_ab.py): jax-triton at vLLM 0.34.0's own tiling
#     ("original", and "original-np" without the index prefetch 0.34.0 lacks) against the
#     library's choice ("table", implementation=None), busy time against 0.34.0 in each process.
#     fp8 where the default is still 1.03-1.09x of 0.34.0 (64-128, 512 programs; 32 as a control),
#     bf16 where it is 1.01-1.12x (8-16 programs; 4 as a control).
#  2. the shim's implementation="triton-torch" (tools/triton_torch_ab.py): busy time and eager call
#     of 0.30.0, 0.34.0 and triton-torch at each tiling table (library, vllm-0.30, vllm-0.34).
# Prediction: jax-triton at 0.34.0's tiling lands within +-3% of 0.34.0 wherever it was timed so
# far (8-24 programs: 0.99-1.06x), so at 64-128 and 512 fp8 programs it beats the library's
# 1.03-1.09x; triton-torch's kernels at the library's (Pallas-tuned) bf16 table run slower than
# the originals' at 64-2048 rows, and at a vLLM table within +-3% of that version's.
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session11_a.sh
source tools/gpu_env.sh
set -o pipefail
{
  timeout 150 python3 tools/fp8_kernel_ab.py --geometries TP1,TP4 --impl triton --programs 32,64,128,512 \
    --configs original,original-np --out "$OUT/fp8_t"
  timeout 80 python3 tools/fp8_kernel_ab.py --geometries TP1,TP4 --impl auto --programs 32,64,128,512 \
    --configs table --out "$OUT/fp8_a"
  timeout 100 python3 tools/fp8_kernel_ab.py --kv-dtype bf16 --geometries TP1,TP4 --impl triton --programs 4,8,16 \
    --configs original,original-np --out "$OUT/bf16_t"
  timeout 60 python3 tools/fp8_kernel_ab.py --kv-dtype bf16 --geometries TP1,TP4 --impl auto --programs 4,8,16 \
    --configs table --out "$OUT/bf16_a"
} 2>&1 | grep -v -i warning | tee "$OUT/ab.log" | grep -E "programs|x\) err|rc="
timeout 200 python3 tools/triton_torch_ab.py --rows 1,8,64,512,2048 --tp TP1,TP4 --kv bf16,fp8 \
  --out "$OUT/triton_torch" 2>&1 | grep -v -i warning > "$OUT/triton_torch.log"
echo "triton_torch rc=$?"; grep -E "^\||^TP" "$OUT/triton_torch.log" | grep -v -- "---" | tail -70
