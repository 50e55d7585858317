#!/usr/bin/env bash
# Issue 18: how the drift cells sharing one GPU are best spread over processes (--workers) and threads
# on CUDA streams in each (--streams).  Run from the repository root on the device machine:
#   bash tools/drift_streams.sh [W1xS1 W2xS2 ...]     (default: 8x1 1x8 2x4)
# Each layout runs the same 8 cells (Mamba-2 nano4b / GDN qwen35-4b, triton-replay, s32a16 and
# sfp16a16-sr, standard and spec-random, 8 rows x DRIFT_TOKENS tokens, default 12,500) into a folder of
# its own, after the GPU test that the streams give each cell's bits (it also compiles the kernels for
# every layout); the sweeps' timing files and the comparison of every layout's cell files with the
# first's go to $OUT (log.txt, timing_<W>x<S>.json).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/drift_streams}
source tools/device_log.sh
source tools/device_env.sh
python -m pytest -q -m gpu -p no:cacheprovider tests/test_drift_fast.py -k cells_on_streams 2>&1 | tail -3
stamp "streams identity test done"
LAYOUTS=("$@")
[ ${#LAYOUTS[@]} -eq 0 ] && LAYOUTS=(8x1 1x8 2x4)
for L in "${LAYOUTS[@]}"; do
  W=${L%x*}; S=${L#*x}
  rm -rf "/tmp/drift-streams/$L"
  python -m replayssm drift --families mamba2,gdn --kernels triton-replay --modes s32a16,sfp16a16-sr \
    --scenarios long-memory --schedules standard,spec-random --geometry mamba2=nano4b,gdn=qwen35-4b \
    --rows 8 --tokens "${DRIFT_TOKENS:-12500}" --local-every 8 --budget 1e-2 --device cuda \
    --workers "$W" --streams "$S" --no-progress --out "/tmp/drift-streams/$L" 2>&1 | grep -E "cell\(s\) run|INCOMPLETE|rror"
  cp "/tmp/drift-streams/$L/timing.shard-0-of-1.json" "$OUT/timing_$L.json"
  stamp "layout $L done"
done
first=${LAYOUTS[0]}
for L in "${LAYOUTS[@]:1}"; do
  if diff -rq "/tmp/drift-streams/$first/cells" "/tmp/drift-streams/$L/cells" >/dev/null; then
    echo "cells of $L equal to $first's, byte for byte"
  else
    echo "cells of $L DIFFER from $first's"; diff -rq "/tmp/drift-streams/$first/cells" "/tmp/drift-streams/$L/cells"
  fi
done
