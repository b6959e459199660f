#!/usr/bin/env bash
# Prepared in session 20 for the next lent H200 (the H100 of session 20 answered a different
# question: there the fp8 kernel already runs at 87-96% of copy bandwidth). Usage (device tool;
# carry .whl .cache/originals): bash tools/sessions/gpu_next_c.sh
# 1. The Gluon fp8 split kernel (config.triton_fp8_gluon_split) against the Triton kernel at the
#    table's launch, and bf16 in the same call, 1024-8192 programs, TP1/TP4: on the H200 the fp8
#    kernel ran at ~80% of copy bandwidth at TP1 (session 17), so a kernel that moves V without
#    shared memory and hides K's latency has room there. Prediction: bit-identical; TP1 -5 to
#    -15%, TP4 within +-5% (on the H100: TP1 +0-1.4%, TP4 +5-6%). With V through shared memory
#    (triton_fp8_gluon_values_shared: V's latency overlapped too; never run): bit-identical, a
#    few % faster than the register path where V's exposed latency is what costs.
# 2. tests/test_gluon.py's GPU cases (11; the TP4 64-wide case and the 4 V_SHARED cases never ran).
# (About 560 s; gpu_next_d.sh is the second call: memcheck of the Gluon kernel's V-through-shared
# path and the Triton kernel at 3 stages.)
# Ran in session 21 on an H100 (bench/results/nvidia-h100_2026-12-05/session21/next_c/).
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 240 python3 tools/fp8_kernel_ab.py --impl triton --programs 1024,4096,8192 --geometries TP1,TP4 \
  --configs table --runs 2 --n-sets 6 --knob triton_fp8_gluon_split \
  --knob triton_fp8_gluon_split+triton_fp8_gluon_values_shared --out "$OUT/gluon_ab" > "$OUT/gluon_ab.log" 2>&1
echo "gluon ab rc=$?"; grep -E "programs|knob=|bit-identical" "$OUT/gluon_ab.log" | sed 's/ err .*\[/ [/' | tail -20
timeout -s INT 120 python3 tools/fp8_kernel_ab.py --impl auto --kv-dtype bf16 --programs 1024,4096,8192 \
  --geometries TP1,TP4 --configs table --runs 2 --n-sets 6 --out "$OUT/bf16" > "$OUT/bf16.log" 2>&1
echo "bf16 rc=$?"; grep -E "programs|knob=" "$OUT/bf16.log" | sed 's/ err .*\[/ [/' | tail -12
timeout -s INT 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_gluon.py > "$OUT/gpu_gluon.log" 2>&1
echo "gpu gluon tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_gluon.log" | tail -10
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . 2>/dev/null
