#!/usr/bin/env bash
# One H200 call for the drift issue (run from the repository root on the device machine):
#   1. two shards of a small nano4b/qwen35-4b sweep run concurrently on the one GPU, merged, and
#      compared byte for byte with the unsharded run;
#   2. validated tokens/s at nano4b, batch 8, triton-replay s32a16, standard decode, fp64 reference
#      included; the copy-bandwidth ceiling measured beside it (the fp64 memory-traffic floor);
#   3. the report sweep: both families x s32a32 s32a16 s16a16 sfp16a16 sfp16a16-sr sfp8a16, standard
#      decode, long-memory scenario, 8 rows, up to 125,000 tokens per row (10^6 per cell), one
#      process per cell sharing the GPU, time-boxed by DRIFT_DEADLINE seconds.
# Everything worth keeping is copied to $OUT (at most 8 files come back).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/h200}
W=${DRIFT_WORK:-/tmp/drift-h200}
DEADLINE=${DRIFT_DEADLINE:-150}
KERNEL=${DRIFT_KERNEL:-triton-replay}
GEO=${DRIFT_GEO:-mamba2=nano4b,gdn=qwen35-4b}
TOKENS=${DRIFT_TOKENS:-125000}
SHARD_TOKENS=${DRIFT_SHARD_TOKENS:-768}
TPUT_TOKENS=${DRIFT_TPUT_TOKENS:-12000}
WORKERS=${DRIFT_WORKERS:-12}
mkdir -p "$OUT" "$W"
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
source tools/device_env.sh
cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null || true
stamp "setup done"

S="--families mamba2,gdn --kernels $KERNEL --modes s32a16 --schedules standard,spec-random
   --geometry $GEO --rows 8 --tokens $SHARD_TOKENS --local-every 4 --no-progress --workers 1"
python -m replayssm drift $S --out "$W/unsharded"
stamp "unsharded done"
python -m replayssm drift $S --out "$W/s0" --shard 0/2 & p0=$!
python -m replayssm drift $S --out "$W/s1" --shard 1/2 & p1=$!
wait $p0; wait $p1
python -m replayssm drift --merge "$W/s0" "$W/s1" --out "$W/merged" --no-progress
for f in drift_report.json drift_report.md drift_report.html; do
  if cmp -s "$W/unsharded/$f" "$W/merged/$f"; then echo "SHARD-MERGE IDENTICAL $f"; else echo "SHARD-MERGE DIFFERS $f"; fi
done
stamp "sharding check done"

python -m replayssm drift --families mamba2 --kernels "$KERNEL" --modes s32a16 --schedules standard \
  --geometry "$GEO" --rows 8 --tokens "$TPUT_TOKENS" --local-every 8 --no-progress --workers 1 --out "$W/tput"
cp "$W"/tput/timing.shard-0-of-1.json "$OUT/timing_throughput.json"
python - "$OUT/bandwidth.json" <<'PY'
import json, sys, torch
if not torch.cuda.is_available():
    sys.exit(print("no CUDA device: copy bandwidth not measured"))
from triton.testing import do_bench
n = 1 << 29  # 4 GiB of fp64, destination allocated outside the timed region
src = torch.randn(n, dtype=torch.float64, device="cuda"); dst = torch.empty_like(src)
ms = do_bench(lambda: dst.copy_(src), warmup=100, rep=500, return_mode="median")
bw = 2 * n * 8 / (ms * 1e-3)
S = 96 * 80 * 128  # nano4b Mamba-2 state elements per sequence
floor = bw / (2 * 8 * S)  # tokens/s if the fp64 reference only read + wrote its state once per token
json.dump({"copy_bytes_per_s": bw, "copy_ms": ms, "fp64_floor_tokens_per_s": floor, "state_elements": S},
          open(sys.argv[1], "w"), indent=1)
print(f"copy {bw / 1e12:.2f} TB/s; fp64 floor at nano4b: {floor:,.0f} tokens/s")
PY
stamp "throughput done"

python -m replayssm drift --families mamba2,gdn --kernels "$KERNEL" \
  --modes s32a32,s32a16,s16a16,sfp16a16,sfp16a16-sr,sfp8a16 --scenarios long-memory --schedules standard \
  --geometry "$GEO" --rows 8 --tokens "$TOKENS" --local-every 8 --budget 1e-2 \
  --workers "$WORKERS" --deadline "$DEADLINE" --checkpoint-every 1000000 --no-progress --check --out "$W/report"
echo "drift --check exit code $?"
cp "$W"/report/drift_report.json "$W"/report/drift_report.html "$W"/report/drift_report.md "$OUT/"
cp "$W"/report/timing.shard-0-of-1.json "$OUT/timing_report.json"
stamp "report done"
