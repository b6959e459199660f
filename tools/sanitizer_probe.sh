#!/usr/bin/env bash
# Which processes compute-sanitizer can start on the lent GPU (it crashed at start-up
# with JAX loaded on 2026-12-02). Each probe: a tiny program under memcheck, its exit
# code and the sanitizer's last lines, in $OUT/sanitizer_probe.log.
# Usage (device tool): source tools/gpu_env.sh; bash tools/sanitizer_probe.sh
set -u
log="$OUT/sanitizer_probe.log"; : > "$log"
probe() {  # probe <name> <env...> -- <sanitizer options...> -- <python code>
  local name=$1; shift
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local opts=(); while [ "$1" != "--" ]; do opts+=("$1"); shift; done; shift
  local t0=$SECONDS
  env "${envs[@]}" timeout 45 compute-sanitizer --tool memcheck "${opts[@]}" python3 -c "$1" \
    > "$OUT/probe_$name.log" 2>&1
  local rc=$?
  printf 'PROBE %-28s rc=%-4s %3ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" \
    "$(grep -E 'ERROR SUMMARY|Segmentation|Invalid|OK' "$OUT/probe_$name.log" | tail -1)" | tee -a "$log"
}
TORCH='import torch; x = torch.ones(1 << 20, device="cuda"); print("OK", float(x.sum()))'
JAXC='import jax, jax.numpy as jnp; print("OK", float(jnp.ones(1 << 20).sum()), jax.devices())'
# Planted bug (control): a Triton kernel launched by torch that reads 64 elements past the end.
PLANT='
import torch, triton, triton.language as tl
@triton.jit
def k(x, y, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(y + o, tl.load(x + o + n))
x = torch.ones(4096, device="cuda"); y = torch.empty(64, device="cuda")
k[(1,)](x[:4032], y, 4032, BLOCK=64); torch.cuda.synchronize(); print("OK launched")'
probe python0 A=1 -- -- 'print("OK")'
probe torch A=1 -- -- "$TORCH"
probe torch_planted PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- -- "$PLANT"
probe jax_default A=1 -- -- "$JAXC"
probe jax_platform XLA_PYTHON_CLIENT_ALLOCATOR=platform -- -- "$JAXC"
probe jax_noapi XLA_PYTHON_CLIENT_ALLOCATOR=platform -- --check-api-memory-access no --report-api-errors no -- "$JAXC"
probe jax_nocmdbuf XLA_PYTHON_CLIENT_ALLOCATOR=platform "XLA_FLAGS=--xla_gpu_enable_command_buffer= --xla_gpu_autotune_level=0" -- --check-api-memory-access no -- "$JAXC"
probe jax_appsonly XLA_PYTHON_CLIENT_ALLOCATOR=platform -- --target-processes application-only --check-device-heap no -- "$JAXC"
for n in jax_default jax_platform; do echo "--- $n"; tail -n 15 "$OUT/probe_$n.log"; done >> "$log"
