#!/usr/bin/env bash
# One H200 call (at most ~5 minutes: setup, then timeouts 80 + 140 + 2 x 30 s) for the drift lock-step on a GPU
# (issue 18 item 2), run from the repository root on the device machine:
#   1. bit identity on the GPU: tests/test_drift_fast.py -m gpu (CUDA graphs + fused fp64 reference +
#      launch_checkpoint against Lockstep.step every step, nano4b, 8 rows);
#   2. tools/drift_lockstep_speed.py: the copy bandwidth and the fp64 floor, then at batch 8 and 64
#      (nano4b, triton-replay, s32a16, standard L = 16, local_every 8) the device time of one fp64
#      reference step (eager vs fused) and the validated tokens/s of the fast path after warm-up,
#      with the fused and with the eager reference, and the ratio to the floor;
#   3. the same through `replayssm drift` (setup, compiles and captures included), batch 8 and 64.
# Parameters from the environment; results in $OUT: log.txt, speed.json, timing_b8.json, timing_b64.json.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/h200-lockstep}
W=${DRIFT_WORK:-/tmp/drift-lockstep}
KERNEL=${DRIFT_KERNEL:-triton-replay}
GEO=${DRIFT_GEO:-nano4b}
T8=${DRIFT_TOKENS_B8:-24000}
T64=${DRIFT_TOKENS_B64:-4000}
mkdir -p "$OUT" "$W"
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || echo "no nvidia-smi"
python -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
source tools/device_env.sh
cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null || true
stamp "setup done"

timeout 80 python -m pytest -q -p no:xdist -p no:cacheprovider -m gpu tests/test_drift_fast.py 2>&1 | tail -5
stamp "GPU identity test done"

timeout 140 python tools/drift_lockstep_speed.py --kernel "$KERNEL" --geometry "$GEO" --rows 8 64 \
  --tokens "$T8" "$T64" --json "$OUT/speed.json"
stamp "speed done"

for b in 8 64; do
  [ "$b" = 8 ] && tok=$T8 || tok=$T64
  timeout 30 python -m replayssm drift --families mamba2 --kernels "$KERNEL" --modes s32a16 --schedules standard \
    --geometry "$GEO" --rows "$b" --tokens "$tok" --local-every 8 --no-progress --workers 1 --out "$W/b$b"
  cp "$W/b$b/timing.shard-0-of-1.json" "$OUT/timing_b$b.json" 2>/dev/null
  stamp "replayssm drift batch $b done: $(python -c "import json,sys; print(json.load(open(sys.argv[1]))['tokens_per_s'])" "$OUT/timing_b$b.json" 2>/dev/null) tokens/s"
done
