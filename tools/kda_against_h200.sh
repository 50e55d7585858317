#!/usr/bin/env bash
# Issue 19: our KDA kernels side by side with SGLang 0.5.23's KDA ReplaySSM kernels (and FLA 0.6.0's
# fused recurrent KDA as the external baseline) on one GPU, in one process per decode, through
# `replayssm bench --against` (validators/bench_against.py): the copy-bandwidth ceiling measured at
# the start of the same run, every configuration validated by the engine at kimi-linear-48b before
# it is timed (ours must pass; an external kernel is timed either way, its verdict beside its time),
# CUDA graphs of whole cursor cycles, do_bench median, L2 cleared.
#   1. standard decode L = 16, batches 1,8,32,128,256,512: triton-replay, triton-baseline,
#      sglang-replay (fused_recurrent_linear_replayssm, is_kda), fla-baseline (fused_recurrent_kda_fwd,
#      in place through ssm_state_indices);
#   2. speculative T' = 4 (B = 16), k = KDA_KS (default 4: every draft accepted), batches
#      KDA_SPEC_BATCHES (default 8,512; the batch-512 device-side index assertion of our replay was
#      the stored-precision check's float32 indices, fixed on main in ee2e075):
#      triton-replay, triton-baseline, sglang-replay-fold (recurrent verify + commit fold; its bytes
#      differ from the replay bytes model the %-copy column uses, fold-every-commit writes the state
#      every step).  Its own process: a CUDA fault there cannot take the standard table with it.
# Carry [".whl/sglang", ".whl/fla_core-0.6.0-py3-none-any.whl"] (39.3 MB + 1.1 MB; tools/README.md
# says how to fill .whl/); set REPLAYSSM_COMMIT (the device copy has no .git).
#   REPLAYSSM_COMMIT=<sha> bash tools/kda_against_h200.sh
# Env: KDA_MODE (s32a16), KDA_BATCHES, KDA_SPEC_BATCHES, KDA_KS, KDA_REP_MS (100), KDA_STD_LIMIT (180 s),
#      KDA_SPEC_LIMIT (80 s; 0 skips the speculative run; KDA_STD_LIMIT=0 the standard one), KDA_SWEEP=1 (our replay: the fastest
#      validated launch candidate).
# Results in $OUT (6 files): probe.txt, log.txt, std/against_kda_<commit>.{json,md},
#   spec/against_kda_<commit>.{json,md}.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/kda_against}; mkdir -p "$OUT"
t0=$(date +%s)
log() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$OUT/log.txt"; }
{
  echo "commit ${REPLAYSSM_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  ls -l .whl/sglang/ .whl/*.whl
} > "$OUT/probe.txt" 2>&1
WHEELS=(.whl/sglang/sglang-*.whl .whl/fla_core-*.whl)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "${WHEELS[@]}" \
  >> "$OUT/probe.txt" 2>&1 || { log "pip install of ${WHEELS[*]} failed (probe.txt)"; exit 1; }
export PYTHONPATH=/tmp/site
source tools/device_env.sh >> "$OUT/probe.txt" 2>&1
python -m replayssm list adapters >> "$OUT/probe.txt" 2>&1
BASE=fla-baseline
python -c "import fla.ops.kda.fused_recurrent" >> "$OUT/probe.txt" 2>&1 \
  || { BASE=""; log "import fla.ops.kda failed (probe.txt): standard decode without FLA's baseline"; }
python -c "from replayssm.adapters import sglang; sglang.modules()" >> "$OUT/probe.txt" 2>&1 \
  || { log "SGLang's kernel modules do not import (probe.txt)"; exit 1; }
log "installed; sglang + ${BASE:-no fla}"
COMMON=(--family kda --geometry kimi-linear-48b --precision "${KDA_MODE:-s32a16}" --rep-ms "${KDA_REP_MS:-100}"
        --buffer 16 --window 4 ${KDA_SWEEP:+--sweep-ours})
if [ "${KDA_STD_LIMIT:-180}" != 0 ]; then
  timeout "${KDA_STD_LIMIT:-180}" python -m replayssm bench "${COMMON[@]}" --against "sglang-replay${BASE:+,$BASE}" \
    --batches "${KDA_BATCHES:-1,8,32,128,256,512}" --out "$OUT/std" >> "$OUT/log.txt" 2>&1
  log "standard decode side by side (exit $?)"
fi
if [ "${KDA_SPEC_LIMIT:-80}" != 0 ]; then
  timeout "${KDA_SPEC_LIMIT:-80}" python -m replayssm bench "${COMMON[@]}" --against sglang-replay-fold \
    --spec-batches "${KDA_SPEC_BATCHES:-8,512}" --ks "${KDA_KS:-4}" --out "$OUT/spec" >> "$OUT/log.txt" 2>&1
  log "speculative side by side (exit $?)"
fi
grep -E "^\| standard|^\| spec|Copy ceiling|FAILS|Not timed" "$OUT"/std/*.md "$OUT"/spec/*.md 2>/dev/null | cut -c1-400
