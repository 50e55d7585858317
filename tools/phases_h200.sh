#!/usr/bin/env bash
# One device call: tools/split_phases.py times for the configurations given as lines of
# "FAMILY DECODE BATCH OPTIONS_JSON [MODE]" on stdin; JSON lines to stdout and $OUT/phases.jsonl.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/phases}
mkdir -p "$OUT"
source tools/device_env.sh
while read -r fam dec batch opts mode; do
  [ -z "$fam" ] && continue
  timeout 120 python tools/split_phases.py times "$fam" "$dec" "$batch" "$opts" ${mode:-s32a16} 2>&1 | tail -1 | tee -a "$OUT/phases.jsonl"
done
