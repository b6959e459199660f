#!/usr/bin/env bash
# Session 26, call a (carry .whl .cache/originals; ~350 s, any Hopper). Session 25's prepared
# gpu_next_i.sh plus an A/B at 4 and 6 programs, run after the CPU change it checks:
# config.H200_BF16's 5-8-program band from (64, 32 splits, 4 warps, 2 stages) to vLLM 0.34.0's
# own tiling (64, 33, 2, 2) (evidence: session25/call_b/bf16_ab_pallas/, H100: 1.00 / 1.00x of
# 0.34.0 at 8 programs against the old entry's 1.07 / 1.08x).
# 1. GPU parity at rows 3, 4 and 8 (5-8 programs: TP1 3-4 rows, TP2 and TP4 8 rows; TP2/TP4 3-4
#    rows and TP1 8 rows are the neighbouring bands), every implementation, against 0.30.0 and
#    exact. Prediction: pass.
# 2. A/B, Pallas, bf16: at 6 programs (the band's other end, TP1 3 rows / TP4 6 rows) the new
#    entry against the old; at 4 programs (band (64, 33, 8, 2), 1.01-1.02x of 0.34.0 in session
#    24's decode) 0.34.0's tiling at 2 and 4 warps. Prediction: 6 programs new <= old (0.98-1.02x
#    of 0.34.0 against 1.05-1.09x); 4 programs: within +-3% of the entry, so no change there.
# 3. Decode busy time, auto against 0.34.0, bf16, 1-16 rows. Prediction: TP1 4 rows and TP4 8
#    rows from 1.06-1.09x (session 24) to 0.98-1.02x; other rows unchanged.
source tools/gpu_env.sh
set -o pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
dir="$OUT/$(echo "$card" | tr 'A-Z ' 'a-z-')_$(date +%F)_decode"
QSA_PARITY_ROWS=3,4,8 timeout -s INT 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s \
  tests/test_gpu_parity.py -k sparse > "$OUT/gpu_parity.log" 2>&1
echo "gpu parity rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_parity.log" | tail -5
timeout -s INT 90 python3 tools/fp8_kernel_ab.py --kv-dtype bf16 --programs 6 --geometries TP1,TP4 \
  --impl pallas --configs table,64/32/4/2 --out "$OUT/bf16_ab_6" > "$OUT/bf16_ab_6.log" 2>&1
echo "bf16 a/b 6 rc=$?"; grep -E "programs|knob=off" "$OUT/bf16_ab_6.log" | cut -c1-150
timeout -s INT 90 python3 tools/fp8_kernel_ab.py --kv-dtype bf16 --programs 4 --geometries TP1,TP4 \
  --impl pallas --configs table,64/33/2/2,64/33/4/2 --out "$OUT/bf16_ab_4" > "$OUT/bf16_ab_4.log" 2>&1
echo "bf16 a/b 4 rc=$?"; grep -E "programs|knob=off" "$OUT/bf16_ab_4.log" | cut -c1-150
timeout -s TERM 120 python3 -m bench.run --op sparse --impl original034,auto --kv-dtype bf16 \
  --rows 1,2,4,8,16 --trace-rows 16 --n-calls 10 --eager-calls 5 --no-progress --no-plot \
  --out "$dir" --tp TP1,TP4 > "$OUT/decode.log" 2>&1
echo "decode grid rc=$?"; rm -f "$dir/results.partial.json"; tail -n 2 "$OUT/decode.log"
python3 tools/busy_table.py "$dir/results.md"
true
