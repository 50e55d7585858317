#!/usr/bin/env bash
# Issue 13's findings run on one GPU: every adapter that runs there, beside our kernels (the correct
# implementations a verdict is measured against), through the suite's own commands:
#   1. the adapters' GPU tests (bridges at nano4b / qwen35-4b, batch 8 and 512);
#   2. validate (tools/findings.py: run_scenario, the CLI's path) at real geometry, batch 8: the
#      exhaustive schedule and a long random one, our kernels beside the adapters;
#   3. replayssm drift at real geometry, 8 rows, standard and speculative schedules, time-boxed.
# Needs the vLLM ReplaySSM tree at $REPLAYSSM_VLLM_SRC (default .peers/vllm-replayssm, carried) and,
# for fla-baseline, fla-core wheels in .whl (carried).  Results in $OUT: findings_tests.txt,
# findings_validate.jsonl, drift_*/drift_report.{md,json}, log.txt.
set -uo pipefail
OUT=${OUT:-out/findings}; mkdir -p "$OUT"
export REPLAYSSM_VLLM_SRC=${REPLAYSSM_VLLM_SRC:-$PWD/.peers/vllm-replayssm}
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
source tools/device_env.sh
python -m replayssm list adapters | tee -a "$OUT/log.txt"
STEPS=${FINDINGS_STEPS:-150}
DRIFT_TOKENS=${FINDINGS_TOKENS:-12500}
DRIFT_DEADLINE=${FINDINGS_DEADLINE:-100}
if [ "${FINDINGS_TESTS:-1}" = 1 ]; then
  timeout ${FINDINGS_TEST_LIMIT:-200} python -m pytest -q -s -m gpu tests/test_adapters_gpu.py -p no:cacheprovider \
    > "$OUT/findings_tests.txt" 2>&1; echo "adapter GPU tests rc=$?" | tee -a "$OUT/log.txt"
fi
if [ "${FINDINGS_VALIDATE:-1}" = 1 ]; then
  timeout ${FINDINGS_VALIDATE_LIMIT:-330} python tools/findings.py --steps "$STEPS" ${FINDINGS_ARGS:-} > "$OUT/findings_validate.jsonl" \
    2> "$OUT/findings_validate.err"; echo "validate rc=$?" | tee -a "$OUT/log.txt"
  cut -c1-260 "$OUT/findings_validate.jsonl" | tee -a "$OUT/log.txt"
fi
if [ "${FINDINGS_DRIFT:-1}" = 1 ]; then
  for spec in "mamba2 vllm-replay,triton-replay s32a16,s32a16-tf32" "gdn vllm-replay,triton-replay s32a16"; do
    set -- $spec
    geo=$([ "$1" = mamba2 ] && echo nano4b || echo qwen35-4b)
    timeout $((DRIFT_DEADLINE + 60)) python -m replayssm drift --families "$1" --kernels "$2" --modes "$3" \
      --geometry "$1=$geo" --rows 8 --tokens "$DRIFT_TOKENS" --schedules standard,spec-random --device cuda \
      --deadline "$DRIFT_DEADLINE" --no-progress --out "$OUT/drift_$1" > "$OUT/drift_$1.txt" 2>&1
    echo "drift $1 rc=$?" | tee -a "$OUT/log.txt"; tail -3 "$OUT/drift_$1.txt" | tee -a "$OUT/log.txt"
    rm -rf "$OUT/drift_$1/cells" "$OUT/drift_$1/checkpoints" "$OUT/drift_$1/drift_report.html"
  done
fi
