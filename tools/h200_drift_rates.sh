#!/usr/bin/env bash
# One H200 call for the drift fast path's new routes (issue 18 items 2-3), run from the repository root on
# the device machine: (1) the GPU identity tests of tests/test_drift_fast.py (CUDA graphs + fused fp64
# reference against Lockstep.step, bit for bit: Mamba-2 and GDN, standard and spec-random; the fp64 bound scan against
# its torch window, tests/test_bound_scan.py); (2) validated
# tokens/s of single cells, one process, one cell at a time (tools/drift_rates.py: Mamba-2 / GDN / KDA
# triton-replay s32a16 at nano4b / qwen35-4b / kimi-linear-48b, 8 rows, RATE_SECONDS each after a
# first chunk that pays the compiles); (3, PROFILE=1) where a step's device time goes (tools/drift_profile.py:
# device kernels and us per step eagerly, against the graphed step time; Mamba-2 standard, GDN spec-random).
# (ROWS64=1) the Mamba-2 standard cell at 64 rows; (PROFILE64=1) its profile.  RATE_CELLS: the cells of (2)
# (default: the six above).  $OUT: log.txt, tests.txt, rates.json, rates_b64.json, profile.json, profile_b64.json.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/drift_rates}
source tools/device_log.sh
source tools/device_env.sh
stamp "setup done"
python -m pytest -q -m gpu -p no:cacheprovider tests/test_drift_fast.py tests/test_bound_scan.py tests/test_scenarios.py \
  -rA 2>&1 | tail -40 | tee "$OUT/tests.txt"
stamp "tests done"
python tools/drift_rates.py "$OUT/rates.json" --seconds "${RATE_SECONDS:-25}" --rows 8 ${RATE_CELLS:-\
  mamba2.triton-replay.s32a16.long-memory.standard mamba2.triton-replay.s32a16.long-memory.spec-random \
  gdn.triton-replay.s32a16.long-memory.standard gdn.triton-replay.s32a16.long-memory.spec-random \
  kda.triton-replay.s32a16.long-memory.standard kda.triton-replay.s32a16.long-memory.spec-random}
stamp "rates done"
if [[ ${ROWS64:-0} == 1 ]]; then  # issue 18's second drift target: the share of the fp64 floor at batch 64
  python tools/drift_rates.py "$OUT/rates_b64.json" --seconds "${RATE_SECONDS:-25}" --rows 64 \
    mamba2.triton-replay.s32a16.long-memory.standard
  stamp "batch-64 rate done"
fi
if [[ ${PROFILE:-0} == 1 ]]; then
  python tools/drift_profile.py "$OUT/profile.json" --chunks 2 --rows 8 \
    mamba2.triton-replay.s32a16.long-memory.standard gdn.triton-replay.s32a16.long-memory.spec-random
  stamp "profile done"
fi
if [[ ${PROFILE64:-0} == 1 ]]; then
  python tools/drift_profile.py "$OUT/profile_b64.json" --chunks 2 --rows 64 mamba2.triton-replay.s32a16.long-memory.standard
  stamp "batch-64 profile done"
fi
