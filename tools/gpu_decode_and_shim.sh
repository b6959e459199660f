#!/usr/bin/env bash
# Device calls for the decode-time and shim work, one part per call (each < 10 min).
#   decode: bench.decode_floor at TP1/TP2/TP4 x rows 1..64 with the kernel trace (busy
#           time per call, per-kernel means, launch gaps) -> $OUT/decode_floor.md; the same
#           at TP1 under two XLA_FLAGS settings (command buffers off / on with every
#           command type and graphs from 1 command); the shim's host profile.
#   shim:   GPU tests of the strided-q / shim / Pallas work, then tools/swap_in_check.py --quick
#   variants: bench.decode_floor with its variants table (prefetch, 65 splits, strided q)
# Usage (device tool; carry .whl .cache/originals): bash tools/gpu_decode_and_shim.sh decode|shim|variants
source tools/gpu_env.sh
set -o pipefail
part="${1:-decode}"
if [ "$part" = decode ]; then
  timeout "${DECODE_TIMEOUT:-200}" python3 -m bench.decode_floor --no-variants --tp TP1,TP2,TP4 \
    --rows "${DECODE_ROWS:-1,4,16,64}" --out "$OUT/decode_floor.md" > "$OUT/decode_floor.log" 2>&1
  echo "decode_floor rc=$?"
  for flags in "--xla_gpu_enable_command_buffer=" \
               "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN --xla_gpu_graph_min_graph_size=1"; do
    name=$(echo "$flags" | tr -c 'a-z0-9\n' '_' | cut -c1-40)
    XLA_FLAGS="$flags" timeout "${FLAGS_TIMEOUT:-75}" python3 -m bench.decode_floor --no-variants --tp TP1 \
      --rows 1,16 --out "$OUT/decode_flags_${name}.md" > "$OUT/decode_flags_${name}.log" 2>&1
    echo "decode_floor XLA_FLAGS='$flags' rc=$?"; grep "^| TP1" "$OUT/decode_flags_${name}.md" 2>/dev/null \
      || tail -n 5 "$OUT/decode_flags_${name}.log"
  done
  timeout "${PROFILE_TIMEOUT:-60}" python3 tools/profile_shim.py --tp TP1 --rows 1 > "$OUT/profile_shim.log" 2>&1
  echo "profile rc=$?"; tail -n 24 "$OUT/profile_shim.log"
  echo; cat "$OUT/decode_floor.md" 2>/dev/null || tail -n 30 "$OUT/decode_floor.log"
elif [ "$part" = shim ]; then
  timeout "${TESTS_TIMEOUT:-200}" python3 -m pytest -q -s -m gpu -p no:cacheprovider -rfE \
    tests/test_strided_query.py tests/test_shim.py tests/test_pallas.py > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests.log" | tail -12
  timeout "${SWAP_TIMEOUT:-120}" python3 tools/swap_in_check.py --quick > "$OUT/swap_in.log" 2>&1
  echo "swap-in rc=$?"; grep -c "^PASS" "$OUT/swap_in.log"; grep -v "^PASS" "$OUT/swap_in.log" | tail -n 8
else
  timeout "${DECODE_TIMEOUT:-230}" python3 -m bench.decode_floor --tp TP1,TP2,TP4 \
    --rows "${DECODE_ROWS:-1,4,16,32,64}" --out "$OUT/decode_floor.md" > "$OUT/decode_floor.log" 2>&1
  echo "decode_floor rc=$?"; cat "$OUT/decode_floor.md" 2>/dev/null || tail -n 30 "$OUT/decode_floor.log"
fi
