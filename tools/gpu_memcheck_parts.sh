#!/usr/bin/env bash
# compute-sanitizer memcheck of each implementation, one process per part of
# tools/memcheck.py (a sanitizer crash then costs one part, not the run), plus the
# planted control. One line per process: rc, launches checked, sanitizer errors.
# Usage (device tool): source tools/gpu_env.sh; bash tools/gpu_memcheck_parts.sh
export XLA_PYTHON_CLIENT_ALLOCATOR=${XLA_PYTHON_CLIENT_ALLOCATOR:-platform}
# Without these, compute-sanitizer 2025.x segfaults at random points of a JAX process
# (seen on the H200, 2026-12-02/03, 0-4 launches in); with them every part ran. Which of
# the three is needed was not isolated: autotuning and parallel compilation start
# CUDA work on other threads, command buffers replay kernels as CUDA graphs.
export XLA_FLAGS="${XLA_FLAGS:---xla_gpu_autotune_level=0 --xla_gpu_force_compilation_parallelism=1 --xla_gpu_enable_command_buffer=}"
line() {  # line <log> <rc> <name>
  printf 'MEMCHECK %-22s rc=%-4s launches_ok=%-3s disagree=%-2s %s\n' "$3" "$2" \
    "$(grep -cE '^ok' "$1")" "$(grep -cE '^FAIL' "$1")" \
    "$(grep -E 'ERROR SUMMARY|Segmentation' "$1" | tail -1 | sed 's/=* *//')"
}
{  # the planted control's line goes into the summary too (before session 33 it only reached stdout)
log="$OUT/memcheck_plant.log"
if [ -z "${NO_PLANT:-}" ]; then
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 python3 tools/memcheck.py --plant > "$log" 2>&1
  line "$log" $? "planted-control"
fi
for impl in ${IMPLS:-pallas triton}; do
  parts="sparse0 sparse1 sparse2 sparse3 sparse4 indexer"
  [ "$impl" = pallas ] && parts="$parts fp8 fused backward backward_fp8 bf16_bands"  # extra parts (memcheck.py EXTRA_PART_IMPLS)
  [ "$impl" = triton ] && parts="$parts fp8 fp8_gluon bf16_bands"
  for part in ${PARTS:-$parts}; do
    log="$OUT/memcheck_${impl}_${part}.log"
    timeout "${PART_TIMEOUT:-60}" compute-sanitizer --tool memcheck --error-exitcode 3 \
      python3 tools/memcheck.py --impl "$impl" --part "$part" > "$log" 2>&1
    line "$log" $? "$impl/$part"
  done
done
} 2>&1 | tee "$OUT/memcheck_summary.log"
