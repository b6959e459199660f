#!/usr/bin/env bash
# Session 13, call j (about 3 min of device time; the session's last): the split kernel's tile loop
# takes the tile as its induction variable (range(split, n_tiles, NUM_SPLITS)) instead of a counter
# with a carried tile += NUM_SPLITS. CPU compile for sm_90 (tools/sm90_split_kernel_ab.py): at 1-8
# rows (64 splits, 4 warps) the loop goes from 842 to 389 SASS instructions (vLLM 0.30.0's: 383),
# fp8 988 -> 712; at 64-2048 rows +/-2-5% instructions and some spill bytes either way. Call f had
# the split kernel 2.5-3.4 us slower than 0.30.0's at 1 and 8 rows at the same tiling.
#  1. tools/triton_torch_ab.py 1 / 8 / 64 / 512 / 2048 rows, TP1 and TP4, bf16 and fp8 (busy time
#     per kernel against call e/f's, the originals in the same run);
#  2. the shim's direct-launch GPU tests (bit identity with the JAX route, capture).
# Prediction: split kernel at 1-8 rows within ~0.5 us of 0.30.0's (was +2.5-3.4 us), and 64-2048
# rows within 2% of call e's; all tests pass; bf16 bit-identical to 0.30.0 (diff 0).
# Usage (device tool; carry .whl .cache/originals): bash tools/sessions/gpu_session13_j.sh
source tools/gpu_env.sh
set -o pipefail
timeout -s INT 150 python3 tools/triton_torch_ab.py --rows 1,8,64,512,2048 --tp TP1,TP4 --kv bf16,fp8 \
  --out "$OUT/ab" 2>&1 | grep -v -i warn > "$OUT/ab.log"; echo "ab rc=$?"
python3 - "$OUT/ab/triton_torch_ab.json" <<'PY'
import json, sys
for e in json.load(open(sys.argv[1])):
    c = e["columns"]
    base = c.get("original 0.30.0") if e["kv"] == "bf16" else c.get("original 0.34.0")
    tt = c["triton-torch default"]
    split = lambda col: next((v for k, v in col["by_kernel"].items() if "split" in k), None)
    print(f'{e["tp"]} {e["kv"]} {e["rows"]}: split {split(tt):.1f} vs original {split(base):.1f} us, '
          f'busy x{tt["busy_us"] / base["busy_us"]:.2f}, eager x{tt["eager_us"] / base["eager_us"]:.2f}, '
          f'diff {tt["rel_diff_vs_first"]:.1e}')
PY
timeout -s INT 80 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short tests/test_shim_direct.py \
  > "$OUT/gpu_tests_direct.log" 2>&1
echo "direct gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests_direct.log" | tail -6
