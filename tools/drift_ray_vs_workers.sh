#!/usr/bin/env bash
# One GPU call: the same drift sweep with --workers N and with --backend ray at --gpus-per-cell 1/N on
# the visible card(s); each run validates its cells (the reports must be byte-identical) and appends
# its timing record to $RECORD (docs/scaleout.md).  Usage: tools/drift_ray_vs_workers.sh [N] [TOKENS]
set -euo pipefail
N=${1:-4}
TOKENS=${2:-65536}
OUT=${OUT:-out/ray-vs-workers}
RECORD=${RECORD:-$OUT/records.jsonl}
PY=${PYTHON:-python3}
SWEEP=(--geometry mamba2=nano4b,gdn=qwen35-4b --kernels triton-replay --tokens "$TOKENS" --rows 8 --no-progress
       --record "$RECORD")
rm -rf "$OUT/workers" "$OUT/ray"
mkdir -p "$OUT"
"$PY" -m pip install -q 'ray>=2.9,<3'
"$PY" -m replayssm drift "${SWEEP[@]}" --workers "$N" --out "$OUT/workers"
"$PY" -m replayssm drift "${SWEEP[@]}" --backend ray --gpus-per-cell "$(
  "$PY" -c "print(1/$N)")" --out "$OUT/ray"
for f in drift_report.json drift_report.md; do
  cmp "$OUT/workers/$f" "$OUT/ray/$f" && echo "identical: $f"
done
for d in workers ray; do
  "$PY" -c "import json,sys; t=json.load(open('$OUT/$d/timing.shard-0-of-1.json')); \
print('$d', t['device'], t['cells_run'], 'cells', t['wall_s'], 's', t['tokens_per_s'], 'validated tokens/s')"
done
