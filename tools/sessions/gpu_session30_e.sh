#!/usr/bin/env bash
# Session 30, call e (any H100/H200; carry .whl .cache/originals; <= 310 s).
# Call d's `bench.decode_sweep --impl triton --kv fp8` at TP1 4 / 8 rows timed the split merge with
# 64-wide D chunks on ONE warp at 2.3 / 2.8 µs against the default's 2.7 / 3.3 (64-wide on 2 warps
# at 96 pairs; D whole on 2 warps at 192): 0.4-0.5 µs a call, enough to take TP1 fp8 8 rows from
# 1.03x of 0.34.0 to about 0.98x. 1 warp had never been swept for the merge (session 25 compared
# 2 against 4, session 29 2 against 4 at each D chunk). This call sweeps the merge layouts with
# 1 / 2 / 4 warps (decode_sweep --variants merge, now with 1-warp variants; each variant whose bits
# differ from the default is held to the fidelity contract against it):
#   1. jax-triton fp8 (the default at most fp8 decode sizes): TP1 1-64 rows, TP4 4-64 rows;
#   2. Pallas bf16 (the default for bf16): TP1 1-16, TP4 4-32;
#   3. jax-triton bf16 (the shim's default route for bf16): the same cases.
# Prediction: 1 warp (32- or 64-wide) fastest up to a few hundred pairs for jax-triton, by
# 0.3-0.5 µs; for Pallas smaller or none (its merge measured the other way in session 29);
# every differing variant within fidelity.
source tools/gpu_env.sh
sweep() {  # sweep <name> <timeout> <impl> <kv> <cases>
  timeout -s TERM "$2" python3 -m bench.decode_sweep --impl "$3" --kv "$4" --variants merge \
    --cases "$5" --n-calls 20 --out "$OUT/$1.md" > "$OUT/$1.log" 2>&1
  echo "$1 rc=$?"
}
sweep triton_fp8 150 triton fp8 TP1:1,TP1:2,TP1:4,TP1:8,TP1:16,TP1:32,TP1:64,TP4:4,TP4:8,TP4:16,TP4:32,TP4:64
sweep pallas_bf16 75 pallas bf16 TP1:1,TP1:4,TP1:8,TP1:16,TP4:4,TP4:8,TP4:16,TP4:32
sweep triton_bf16 75 triton bf16 TP1:1,TP1:4,TP1:8,TP1:16,TP4:4,TP4:8,TP4:16,TP4:32
python3 - "$OUT" <<'PY'
import collections, os, re, sys
# Per case: the default's busy time, the fastest variant, and the 1-warp variants.
for name in ("triton_fp8", "pallas_bf16", "triton_bf16"):
    path = os.path.join(sys.argv[1], name + ".log")
    if not os.path.exists(path):
        continue
    rows = collections.OrderedDict()
    for line in open(path):
        c = [x.strip() for x in line.split("|")[1:-1]]
        if len(c) == 10 and re.match(r"^[\d.]+$", c[7]):
            rows.setdefault((c[0], c[2]), []).append((c[5], c[6], float(c[7]), c[9][:24]))
    print(f"== {name}: where rows | default µs | best (block_d/warps) µs | 64/1 | 32/1 | 128/1 | 256/1")
    for (tp, r), v in rows.items():
        d = v[0][2]
        best = min(v, key=lambda x: x[2])
        get = lambda bd, w: next((f"{x[2]:.2f}" + ("" if x[3].startswith(("yes", "NO (rel")) and "FAILS" not in x[3] else "!")
                                  for x in v if x[0] == bd and x[1] == w), "-")
        print(f"{tp} {r} | {d:.2f} | {best[0]}/{best[1]} {best[2]:.2f} | {get('64', '1')} | {get('32', '1')} | "
              f"{get('128', '1')} | {get('256', '1')}")
PY
grep -c FAILS "$OUT"/*.log | tr '\n' ' '; echo
