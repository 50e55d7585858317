#!/usr/bin/env bash
# The nightly fuzz profile on the device machine, for the lead to run (issue 14 "done when", issue
# 15 item 1): 2,000 scenarios for each correct kernel and each legitimate literal variant, in
# parallel processes (one per CPU core), counting false alarms.  One call runs one part and stays
# under the per-command limit (every job stops drawing at DEADLINE_S, default 480 s; the summary
# says how many scenarios ran of those planned).
#
#   tools/nightly_fuzz.sh PART PARTS [SET]      SET: cpu (literal kernels, default) | gpu | all
#
# cpu: the pure-PyTorch literal kernels (literal models, the policy literals, the legitimate variants)
#      on the 16 CPU cores; gpu: the Triton kernels compiled on the GPU, hosted for an engine on the
#      CPU (validators/engine/hosted.py; processes sharing the card).  Sizing (rec:41c77642ed0dccce, rec:31d9dfd4a68b6a32):
#      cpu 0.3-1.1 s per scenario on one core, 25 kernels, PARTS=6 on the 16-core machine; gpu 1.5-1.9 s
#      per scenario per process at 15 processes, 7 kernels, PARTS=4.  A part cut by its deadline is
#      finished by rerunning it with --skip-done (tools/nightly_fuzz.py; SKIP_DONE="files").
# Output under $OUT (<= 3 files): nightly_<set>_part<P>of<K>.json (per job and per kernel: scenarios,
# false alarms, the checks that fired, up to 3 failing scenarios per job for replay), log.txt.
# Merge the parts here: python tools/nightly_fuzz.py merge part*/nightly_*.json --markdown table.md
set -uo pipefail
PART=${1:?usage: tools/nightly_fuzz.sh PART PARTS [cpu|gpu|all]}
PARTS=${2:?usage: tools/nightly_fuzz.sh PART PARTS [cpu|gpu|all]}
SET=${3:-cpu}
OUT=${OUT:-out/nightly}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
unset TRITON_INTERPRET
source tools/device_env.sh > "$OUT/log.txt" 2>&1 || { cat "$OUT/log.txt"; exit 1; }
python -c "import hypothesis" 2>/dev/null || { echo "nightly_fuzz: hypothesis is not installed here" | tee -a "$OUT/log.txt"; exit 1; }
nproc --all | sed 's/^/cpu cores: /' >> "$OUT/log.txt"
timeout ${CALL_LIMIT_S:-540} python tools/nightly_fuzz.py run --set "$SET" --part "$PART" --parts "$PARTS" \
  --deadline-s "${DEADLINE_S:-480}" --seed "${SEED:-20261201}" --out "$OUT" \
  ${SKIP_DONE:+--skip-done $SKIP_DONE} 2>&1 | tee -a "$OUT/log.txt" | tail -25
echo "nightly_fuzz rc=${PIPESTATUS[0]}" | tee -a "$OUT/log.txt"
