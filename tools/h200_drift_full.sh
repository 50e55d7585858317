#!/usr/bin/env bash
# Issue 18 item 3: the full H200 drift report, one shard of it per device call, run from the
# repository root on the device machine; merge the shards on any machine afterwards.
#   bash tools/h200_drift_full.sh ours SHARD       our kernels: both families (mamba2=nano4b,
#       gdn=qwen35-4b), triton-replay, modes s32a32 s32a16 s16a16 sfp16a16 sfp16a16-sr sfp8a16 and the
#       tf32 readouts s32a16-tf32 s32a16-tf32x3, schedules standard and spec-random, 8 rows x 125,000
#       tokens (10^6 accepted tokens per cell): 32 cells; SHARD = i/n of them (e.g. 0/2).
#   bash tools/h200_drift_full.sh adapters SHARD   the adapters that run there (issue 13 item 4: drift
#       >= 10^5 tokens at real geometry): vLLM ReplaySSM and baselines, SGLang, FLA, in s32a16 and
#       s32a16-tf32 where that is what they implement (22 cells; the rest skipped with the adapter's
#       reason), standard and spec-random, 8 rows x 12,500 tokens (DRIFT_FAMILIES / DRIFT_KERNELS: a
#       subset, e.g. the cells a deadline stopped: a checkpoint does not come back, they rerun); carry
#       [".whl/sglang", ".whl/fla_core-0.6.0-py3-none-any.whl", ".peers/vllm-replayssm"].
# Every cell is one process sharing the GPU (DRIFT_WORKERS, default 8: 16 ran the H200 out of memory at
# 1e9807587c22, the GDN spec-random cells' processes holding 10-11 GB each; since bd1a984 a process holds at
# most ~3.9 GB, measured at fa523b3 on an H100, so 12-16 fit; 12 took the report in 1,143 s on an H100 at
# 041a19a against 1,194 s for 8: processes time-slice the card, docs/benchmarks.md); DRIFT_DEADLINE (s, default 420)
# time-boxes the sweep: a cell it stops is reported as stopped at the tokens it reached, never as
# complete.  A shard longer than one call (the 16 spec-random cells, ~16 minutes): a cell the deadline stops
# keeps a checkpoint under $DRIFT_WORK (default /tmp/drift-full, on the device's disk), so the same command
# run again while the machine is still held resumes it (checkpoints do not come back in $OUT);
# DRIFT_CHECKPOINT_EVERY=S also checkpoints every S seconds, against a kill.  Results in $OUT: log.txt,
# drift_report.md (this shard), gpu_apps.csv (each process's device memory every 15 s), cells.tar.gz (the
# shard folder's cell results and config: `replayssm drift --merge` takes the unpacked folders), timing.json.
# Merge (here):  for s in 0 1; do mkdir -p m/s$s && tar -xzf shard$s/cells.tar.gz -C m/s$s; done
#                python -m replayssm drift --merge m/s0 m/s1 --out m/all
set -uo pipefail
export PYTHONUNBUFFERED=1
WHAT=${1:-ours}
SHARD=${2:-0/1}
OUT=${OUT:-out/drift_full}
W=${DRIFT_WORK:-/tmp/drift-full}
WORKERS=${DRIFT_WORKERS:-8}
DEADLINE=${DRIFT_DEADLINE:-420}
mkdir -p "$W"
source tools/device_log.sh
echo "sweep $WHAT shard $SHARD workers $WORKERS deadline $DEADLINE s"
source tools/device_env.sh
case "$WHAT" in
  ours)
    ARGS=(--families mamba2,gdn --kernels triton-replay
          --modes s32a32,s32a16,s16a16,sfp16a16,sfp16a16-sr,sfp8a16,s32a16-tf32,s32a16-tf32x3
          --rows 8 --tokens "${DRIFT_TOKENS:-125000}") ;;
  adapters)
    source tools/adapter_sources.sh
    adapter_sources "$OUT/log.txt" || echo "drift_full: pip install of the carried adapter wheels failed"
    python -m replayssm list adapters
    ARGS=(--families "${DRIFT_FAMILIES:-mamba2,gdn,kda}"
          --kernels "${DRIFT_KERNELS:-vllm-replay,vllm-replay-state,vllm-baseline,sglang-replay,sglang-replay-serving,sglang-replay-fold,sglang-baseline,fla-baseline}"
          --modes s32a16,s32a16-tf32 --rows 8 --tokens "${DRIFT_TOKENS:-12500}") ;;
  *) echo "usage: tools/h200_drift_full.sh ours|adapters SHARD" >&2; exit 2 ;;
esac
stamp "setup done"
# the device memory of every process on the card every 15 s (how many workers fit: $OUT/gpu_apps.csv)
nvidia-smi --query-compute-apps=timestamp,pid,used_memory --format=csv,noheader -l 15 > "$OUT/gpu_apps.csv" 2>&1 &
SMI=$!
python -m replayssm drift "${ARGS[@]}" --scenarios long-memory --schedules standard,spec-random \
  --geometry mamba2=nano4b,gdn=qwen35-4b,kda=kimi-linear-48b --local-every 8 --budget 1e-2 \
  --workers "$WORKERS" --device cuda --deadline "$DEADLINE" --checkpoint-every "${DRIFT_CHECKPOINT_EVERY:-1000000}" --no-progress \
  --shard "$SHARD" --out "$W/report"
echo "drift exit code $?"
kill "$SMI" 2>/dev/null
stamp "sweep done"
N=${SHARD#*/}; I=${SHARD%/*}
cp "$W/report/drift_report.shard-$I-of-$N.md" "$OUT/drift_report.md" 2>/dev/null \
  || cp "$W/report/drift_report.md" "$OUT/drift_report.md" 2>/dev/null
cp "$W/report/timing.shard-$I-of-$N.json" "$OUT/timing.json" 2>/dev/null \
  || cp "$W/report/timing.shard-0-of-1.json" "$OUT/timing.json" 2>/dev/null
(cd "$W/report" && tar -czf "$OUT/cells.tar.gz" config.json cells)
ls -la "$OUT"
stamp "done"
