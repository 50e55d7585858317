#!/usr/bin/env bash
# Issue 13 item 4 (fuzz with a budget): every adapter that loads on the GPU machine fuzzed with its
# kernel hosted on the GPU (`replayssm fuzz --kernel-device cuda`: the engine, literal model and
# fp64 reference on the CPU cores, validators/hosted.py), one process per adapter kernel in
# parallel, each with the same budget; a failure is shrunk and kept (a finding to read, or a false
# alarm to fix: docs/findings.md says which).  On a GPU every mode the adapter declares is drawn
# (bf16 included); a CPU dry run (ADAPTERS_KDEV=cpu) draws only fp32-activation modes (bf16 tl.dot
# is wrong under the Triton interpreter).
# Carry [".whl/sglang", ".whl/fla_core-0.6.0-py3-none-any.whl", ".peers/vllm-replayssm"] (39.3 + 1.1 +
# 0.8 MB); set REPLAYSSM_COMMIT (the device copy has no .git).
#   REPLAYSSM_COMMIT=<sha> bash tools/adapters_fuzz_h200.sh
# Env: ADAPTERS_BUDGET_S (420 per kernel), ADAPTERS_PROFILE (dev), ADAPTERS_KERNELS (default: every
# registered adapter kernel), ADAPTERS_KDEV (cuda).
# Results in $OUT (at most 8 files come back from a device call): probe.txt, log.txt, and
# results.tar.gz holding <family>-<kernel>.{json,txt} and failures/<family>-<kernel>.json.
set -uo pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=${OUT:-out/adapters_fuzz}; RES=/tmp/adapters_fuzz_results; mkdir -p "$OUT" "$RES/failures"
BUDGET=${ADAPTERS_BUDGET_S:-420}
KDEV=${ADAPTERS_KDEV:-cuda}
t0=$(date +%s)
log() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$OUT/log.txt"; }
{
  echo "commit ${REPLAYSSM_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} > "$OUT/probe.txt" 2>&1
source tools/adapter_sources.sh
adapter_sources "$OUT/probe.txt" || log "pip install of the carried adapter wheels failed (probe.txt)"
[ "$KDEV" = cpu ] && export TRITON_INTERPRET=1 || unset TRITON_INTERPRET
source tools/device_env.sh >> "$OUT/probe.txt" 2>&1
python -m replayssm list adapters | tee -a "$OUT/log.txt"
# family/kernel of every registered adapter kernel (SlotAdapter subclasses), or ADAPTERS_KERNELS
TARGETS=${ADAPTERS_KERNELS:-$(python - <<'PY'
from replayssm import adapters
from replayssm.adapters._base import SlotAdapter
from replayssm.registry import kernels
adapters.load(force=True)
print(" ".join(f"{f}/{n}" for (f, n), c in sorted(kernels().items()) if issubclass(c, SlotAdapter)))
PY
)}
log "targets: $TARGETS; budget ${BUDGET} s each, kernel on $KDEV"
MODES=()
[ "$KDEV" = cpu ] && MODES=(--modes s32a32,s16a32,sfp16a32,s32a32-tf32)
for t in $TARGETS; do
  fam=${t%%/*}; name=${t#*/}
  timeout $(( BUDGET + 120 )) python -m replayssm fuzz --family "$fam" --kernel "$name" --device cpu \
    --kernel-device "$KDEV" --profile "${ADAPTERS_PROFILE:-dev}" --budget-s "$BUDGET" "${MODES[@]}" \
    --failures "$RES/failures" --json "$RES/$fam-$name.json" > "$RES/$fam-$name.txt" 2>&1 &
done
wait
for f in "$RES"/*.txt; do echo "== $(basename "$f"): $(tail -1 "$f")"; done >> "$OUT/log.txt"
tar -czf "$OUT/results.tar.gz" -C "$RES" .
log "done"
