#!/usr/bin/env bash
# One H200 call for the drift fast path (run from the repository root on the device machine):
#   1. bit identity on the GPU: a nano4b Mamba-2 cell (batch 8, s32a16, standard decode) run on the
#      slow path (Lockstep.step), the fast path with CUDA graphs and the fast path eager: the cell
#      results must be the same text; the tokens/s of each;
#   2. validated tokens/s through `replayssm drift` at nano4b, batch 8, s32a16, standard decode, fp64
#      reference included (the issue-7 target, >= 10^4), same settings as tools/h200_drift.sh;
#   3. if 2 reaches FAST_MIN tokens/s: one 10^6-token cell (8 rows x 125,000 tokens) with its report;
#   4. literal-replay at nano4b (the literal model, fp32 state) for ~10^4 tokens, to compare its state
#      error growth with the kernel's.
# Parameters from the environment; everything worth keeping lands in $OUT (8 files at most come
# back: the Markdown reports are printed into log.txt).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/h200-fast}
W=${DRIFT_WORK:-/tmp/drift-fast}
KERNEL=${DRIFT_KERNEL:-triton-replay}
GEO=${DRIFT_GEO:-nano4b}
ID_TOKENS=${DRIFT_ID_TOKENS:-512}
TPUT_TOKENS=${DRIFT_TPUT_TOKENS:-12000}
BIG_TOKENS=${DRIFT_BIG_TOKENS:-125000}
BIG_DEADLINE=${DRIFT_BIG_DEADLINE:-100}
LIT_TOKENS=${DRIFT_LIT_TOKENS:-1250}
LIT_DEADLINE=${DRIFT_LIT_DEADLINE:-30}
FAST_MIN=${DRIFT_FAST_MIN:-8000}
mkdir -p "$OUT" "$W"
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || echo "no nvidia-smi"
python -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
source tools/device_env.sh
cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null || true
stamp "setup done"

python - "$OUT/identity.json" "$KERNEL" "$GEO" "$ID_TOKENS" <<'PY'
import json, sys, time, torch
from replayssm.validators.drift import CellRun, CellSpec, SweepConfig
path, kernel, geo, tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.set_num_threads(1)
cfg = SweepConfig(families=("mamba2",), kernels=(kernel,), modes=("s32a16",), schedules=("standard",),
                  geometry=(("mamba2", geo),), rows=8, tokens=tokens, local_every=8, blocks=16)
spec = CellSpec("mamba2", kernel, "s32a16", "long-memory", "standard")
out = {}
for how in ("slow", "graphs", "eager"):
    run = CellRun(spec, cfg, dev, chunk=64, fast=how != "slow", graphs=None if how == "graphs" else False)
    if dev == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    while not run.done:
        run.run_steps(64)
    res = json.dumps(run.result(), sort_keys=True)
    if dev == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t
    fast = run.fast
    out[how] = {"wall_s": wall, "tokens_per_s": 8 * tokens / wall, "capture": bool(fast and fast.capture),
                "graphs": len(fast.cache) if fast else 0, "replays": fast.replays if fast else 0,
                "capture_error": fast.capture_error if fast else None, "result": res}
    print(f"{how:6s}: {8 * tokens} tokens in {wall:.2f} s = {8 * tokens / wall:,.0f} tokens/s (first run of a "
          f"process pays compiles), graphs {out[how]['graphs']}, replays {out[how]['replays']}, "
          f"capture error {out[how]['capture_error']}")
same = out["slow"]["result"] == out["graphs"]["result"] == out["eager"]["result"]
print("GPU IDENTITY slow == fast(graphs) == fast(eager):", same)
if not same:
    a, b = json.loads(out["slow"]["result"]), json.loads(out["graphs"]["result"])
    print("differing fields (slow vs graphs):", [k for k in a if a[k] != b[k]])
json.dump({"same": same, **{k: {x: y for x, y in v.items() if x != "result"} for k, v in out.items()}},
          open(path, "w"), indent=1)
PY
stamp "identity done"

python -m replayssm drift --families mamba2 --kernels "$KERNEL" --modes s32a16 --schedules standard \
  --geometry "$GEO" --rows 8 --tokens "$TPUT_TOKENS" --local-every 8 --no-progress --workers 1 --out "$W/tput"
cp "$W"/tput/timing.shard-0-of-1.json "$OUT/timing_throughput.json"
TPS=$(python -c "import json,sys; d=json.load(open(sys.argv[1])); print(int(d.get('tokens_per_s', 0)))" "$OUT/timing_throughput.json" 2>/dev/null || echo 0)
stamp "throughput done: $TPS tokens/s"

if [ "$TPS" -ge "$FAST_MIN" ]; then
  python -m replayssm drift --families mamba2 --kernels "$KERNEL" --modes s32a16 --schedules standard \
    --geometry "$GEO" --rows 8 --tokens "$BIG_TOKENS" --local-every 8 --budget 1e-2 --workers 1 \
    --deadline "$BIG_DEADLINE" --checkpoint-every 1000000 --no-progress --out "$W/big"
  for f in drift_report.json drift_report.html; do cp "$W/big/$f" "$OUT/big_$f"; done
  cat "$W/big/drift_report.md"
  cp "$W"/big/timing.shard-0-of-1.json "$OUT/timing_big.json"
  stamp "10^6-token cell done"
else
  echo "throughput $TPS < $FAST_MIN tokens/s: no 10^6-token cell"
fi

python -m replayssm drift --families mamba2 --kernels literal-replay --modes s32a16 --schedules standard \
  --geometry "$GEO" --rows 8 --tokens "$LIT_TOKENS" --local-every 8 --budget 1e-2 --workers 1 \
  --deadline "$LIT_DEADLINE" --checkpoint-every 1000000 --no-progress --out "$W/literal"
cp "$W/literal/drift_report.json" "$OUT/literal_drift_report.json"
cat "$W/literal/drift_report.md"
cp "$W"/literal/timing.shard-0-of-1.json "$OUT/timing_literal.json"
stamp "literal-replay done"
