#!/usr/bin/env bash
# One device call: launch-shape exploration (tools/explore_launch.py) and the register / spill
# count of every Triton kernel it compiled (cuobjdump on Triton's cache).  Output under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/explore}
mkdir -p "$OUT"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
source tools/device_env.sh
timeout ${EXPLORE_LIMIT:-420} python tools/explore_launch.py "${1:-all}" ${EXPLORE_ARGS:-} 2>&1 | tee "$OUT/explore.txt" | grep -v "^$"
for f in $(ls -tr $(find "$TRITON_CACHE_DIR" -name "*.cubin")); do
  nw=$(python -c "import json,sys; d=json.load(open(sys.argv[1])); print('warps', d.get('num_warps'), 'shared', d.get('shared'))" "${f%.cubin}.json" 2>/dev/null)
  echo "$(cuobjdump -res-usage "$f" 2>/dev/null | grep -E "REG" | head -1 | sed -E 's/\s+/ /g') $(basename "$f") $nw"
done > "$OUT/regs.txt"
grep -E "replay|baseline" "$OUT/regs.txt" | head -80
