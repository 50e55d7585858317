#!/usr/bin/env bash
# Issue 17's side-by-side table in one call (<= 9 minutes on one H200): our replay and baseline
# kernels beside the official ReplaySSM kernels (vLLM fork: vllm-replay, vllm-baseline) through
# `replayssm bench --against`, one process for both families (one copy ceiling), every
# configuration validated by the engine first.  Cases: standard L = 16 and speculative T' = 4,
# B = 16 at k = 4 and k = 2, batches 1..512.
# Run from the repository root of a copy of the tree, carrying .peers/vllm-replayssm:
#   REPLAYSSM_COMMIT=$(git rev-parse --short=12 HEAD) bash tools/speed_h200.sh
# (the device copy has no .git: the caller names the commit).  Knobs: SPEED_BATCHES, SPEED_SPEC_BATCHES
# (default: SPEED_BATCHES), SPEED_KS,
# SPEED_FAMILIES (default: both), SPEED_REP_MS, SPEED_LIMIT (seconds, default 520), SPEED_SWEEP (1, the
# default: our replay's time is the fastest of the family's validated launch candidates, the winner
# named in the table; 0: our defaults only).
# Writes $OUT/against_<family>_<commit>.{json,md} and $OUT/speed.log.
set -uo pipefail
OUT=${OUT:-out/speed}; mkdir -p "$OUT"
export REPLAYSSM_VLLM_SRC=${REPLAYSSM_VLLM_SRC:-$PWD/.peers/vllm-replayssm}
export PYTHONUNBUFFERED=1
source tools/device_env.sh
BATCHES=${SPEED_BATCHES:-1,8,32,128,256,512}
SPEC_BATCHES=${SPEED_SPEC_BATCHES:-$BATCHES}
FAMS=${SPEED_FAMILIES:-}
fam_args=()
[ -n "$FAMS" ] && fam_args=(--family "$FAMS")
[ "${SPEED_SWEEP:-1}" = 1 ] && fam_args+=(--sweep-ours)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/speed.log"
timeout "${SPEED_LIMIT:-520}" python -m replayssm bench --against vllm-replay "${fam_args[@]}" \
  --batches "$BATCHES" --spec-batches "$SPEC_BATCHES" --ks "${SPEED_KS:-4,2}" --rep-ms "${SPEED_REP_MS:-60}" \
  --out "$OUT" >> "$OUT/speed.log" 2>&1
echo "bench --against rc=$?" | tee -a "$OUT/speed.log"
grep -v "^copy bandwidth" "$OUT/speed.log" | tail -n 80
