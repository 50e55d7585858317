#!/usr/bin/env bash
# Programmatic dependent launch of the replay pairs (the `pdl` option), in one call (<= 9 minutes on
# one H200): (1) the GPU engine tests of the option (tests/test_gdn_gpu.py replay-prepass-pdl-*,
# tests/test_mamba2_gpu.py test_replay_pdl_nano4b, both tiers); (2) whether the compiled kernels carry
# the grid dependency control instructions (griddepcontrol in the PTX of Triton's cache); (3) the
# side-by-side table with our launch candidates swept (tools/speed_h200.sh: the pdl candidates among
# them, each validated by the engine before it is timed; the JSON keeps every candidate's time).
# Run from the repository root of a copy of the tree, carrying .peers/vllm-replayssm:
#   REPLAYSSM_COMMIT=$(git rev-parse --short=12 HEAD) bash tools/pdl_h200.sh
# Knobs: PDL_TESTS=0 skips (1); the speed_h200.sh knobs (defaults here: SPEED_BATCHES 1,8,32,128,512,
# SPEED_SPEC_BATCHES 8,128,512, SPEED_KS 4, SPEED_LIMIT 400).
set -uo pipefail
OUT=${OUT:-out/pdl}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/replayssm-pdl-triton-cache}
source tools/device_env.sh
if [ "${PDL_TESTS:-1}" = 1 ]; then
  timeout 200 python -m pytest -q -p no:cacheprovider -m gpu -k "pdl" tests/test_gdn_gpu.py tests/test_mamba2_gpu.py \
    2>&1 | tail -n 15 | tee "$OUT/tests.txt"
fi
n=$(grep -l griddepcontrol -r "$TRITON_CACHE_DIR" --include='*.ptx' 2>/dev/null | wc -l)
echo "PTX files with griddepcontrol in the Triton cache: $n" | tee -a "$OUT/tests.txt"
SPEED_BATCHES=${SPEED_BATCHES:-1,8,32,128,512} SPEED_SPEC_BATCHES=${SPEED_SPEC_BATCHES:-8,128,512} \
  SPEED_KS=${SPEED_KS:-4} SPEED_LIMIT=${SPEED_LIMIT:-400} OUT=$OUT bash tools/speed_h200.sh
