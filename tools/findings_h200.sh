#!/usr/bin/env bash
# Issue 13's findings run on one GPU: every adapter that runs there, beside our kernels (the correct
# implementations a verdict is measured against), through the suite's own commands:
#   1. the adapters' GPU tests (bridges at nano4b / qwen35-4b, batch 8 and 512);
#   2. replayssm validate at real geometry, batch 8: the exhaustive schedule and a long random one;
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
STEPS=${FINDINGS_STEPS:-300}
DRIFT_TOKENS=${FINDINGS_TOKENS:-12500}
DRIFT_DEADLINE=${FINDINGS_DEADLINE:-100}
if [ "${FINDINGS_TESTS:-1}" = 1 ]; then
  timeout ${FINDINGS_TEST_LIMIT:-200} python -m pytest -q -s -m gpu tests/test_adapters_gpu.py -p no:cacheprovider \
    > "$OUT/findings_tests.txt" 2>&1; echo "adapter GPU tests rc=$?" | tee -a "$OUT/log.txt"
fi
# family kernel decode mode
while read -r fam kern dec mode; do
  [ -z "$fam" ] && continue
  geo=$([ "$fam" = mamba2 ] && echo nano4b || echo qwen35-4b)
  for sched in exhaustive random; do
    extra=$([ "$sched" = random ] && echo "--steps $STEPS" || echo "")
    win=$([ "$dec" = speculative ] && echo "--window 4 --buffer 12" || echo "--buffer 16")
    timeout 120 python -m replayssm validate --kernel "$kern" --family "$fam" --precision "$mode" --decode "$dec" \
      $win --geometry "$geo" --batch 8 --schedule "$sched" $extra --device cuda --out "$OUT/vtmp" \
      > "$OUT/v.txt" 2>&1; rc=$?
    python - "$fam" "$kern" "$dec" "$mode" "$sched" "$rc" "$OUT" <<'PY' >> "$OUT/findings_validate.jsonl"
import json, sys, pathlib
fam, kern, dec, mode, sched, rc, out = sys.argv[1:]
found = sorted((pathlib.Path(out) / "vtmp").glob("*.json"))
p = found[0] if found else pathlib.Path(out) / "none.json"
rec = {"family": fam, "kernel": kern, "decode": dec, "mode": mode, "schedule": sched, "exit": int(rc),
       "stdout": (pathlib.Path(out) / "v.txt").read_text()[-1500:]}
if p.exists() and rc in ("0", "1"):
    r = json.loads(p.read_text())
    rec.update({k: r.get(k) for k in ("passed", "summary", "failure_counts", "steps_run", "tokens_accepted", "wall_s")})
    rec["first_failures"] = r.get("failures", [])[:3]
print(json.dumps(rec))
for f in (pathlib.Path(out) / "vtmp").glob("*"):
    f.unlink()
PY
    tail -1 "$OUT/findings_validate.jsonl" | cut -c1-300 | tee -a "$OUT/log.txt"
  done
done <<'CASES'
mamba2 vllm-replay standard s32a16
mamba2 vllm-replay-state standard s32a16
mamba2 triton-replay standard s32a16
mamba2 vllm-baseline standard s32a16
mamba2 vllm-replay speculative s32a16-tf32
mamba2 triton-replay speculative s32a16-tf32
mamba2 vllm-baseline speculative s32a16
mamba2 triton-baseline speculative s32a16
gdn vllm-replay standard s32a16
gdn triton-replay standard s32a16
gdn vllm-replay speculative s32a16
gdn triton-replay speculative s32a16
gdn vllm-baseline speculative s32a16
gdn fla-baseline speculative s32a16
gdn triton-baseline speculative s32a16
CASES
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
