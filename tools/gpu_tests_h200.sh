#!/usr/bin/env bash
# Issue 18 item 4: `nox -s gpu` (the merge tier, tests/gpu_tiers.py) end to end on one GPU, timed,
# or one shard of the slow GPU tier.
#   bash tools/gpu_tests_h200.sh merge          nox -s gpu: wall time, pass/fail, per-test durations
#   bash tools/gpu_tests_h200.sh slow K N       nox -s gpu_slow -- --splits N --group K
# Files in $OUT: log.txt (the run, its wall time and exit status), junit.xml, durations.json
# (pytest-split's format, from tests.jsonl: commit it as .test_durations to balance the shards), and the 30
# slowest tests in log.txt (--durations=30), tests.jsonl (one line per finished test, kept when the
# limit cuts the run: tests/progress_log.py).  nox and pytest-split come from $NOX_WHEELS (default
# .whl/nox: carry it) when not installed; REPLAYSSM_COMMIT names the commit (the device copy has no
# .git).  GPU_TESTS_LIMIT (s, default 570): the run's timeout; a run cut by it exits 124 and says so.
# The adapters' GPU tests run where their sources are carried too (tools/adapter_sources.sh): carry
# [".whl/nox", ".whl/sglang", ".whl/fla_core-0.6.0-py3-none-any.whl", ".peers/vllm-replayssm"]
# (6.6 + 39.3 + 1.1 + 0.8 MB; FlashInfer's 64 MB goes with tools/flashinfer_h200.sh alone).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/gpu_tests}
TIER=${1:-merge}
LIMIT=${GPU_TESTS_LIMIT:-570}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
echo "commit ${REPLAYSSM_COMMIT:-unknown} tier $TIER ${2:-} ${3:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
source tools/device_env.sh
source tools/nox_wheels.sh
nox_wheels gpu_tests nox pytest_split || exit 1
source tools/adapter_sources.sh
# the adapters' sources where carried (their GPU tests skip otherwise)
adapter_sources "$OUT/log.txt" || echo "gpu_tests: pip install of the carried adapter wheels failed"
python -m replayssm list adapters
ARGS=(--durations=30 --junitxml "$OUT/junit.xml")
case "$TIER" in
  merge) SESSION=gpu ;;
  slow) SESSION=gpu_slow; ARGS+=(--splits "${3:?usage: slow K N}" --group "${2:?usage: slow K N}") ;;
  *) echo "usage: tools/gpu_tests_h200.sh merge | slow K N" >&2; exit 2 ;;
esac
export REPLAYSSM_TEST_LOG="$OUT/tests.jsonl"
t0=$(date +%s.%N)
# --no-venv --no-install: the machine has torch, Triton and pytest and nothing can be fetched
timeout "$LIMIT" python -m nox --no-venv --no-install -s "$SESSION" -- "${ARGS[@]}"; rc=$?
t1=$(date +%s.%N)
wall=$(python -c "print(f'{$t1 - $t0:.1f}')")
if [ "$rc" = 124 ]; then
  echo "gpu_tests: $SESSION CUT by the ${LIMIT} s limit after ${wall} s (not a pass)"
else
  echo "gpu_tests: $SESSION exit $rc, wall ${wall} s"
fi
# durations.json (pytest-split's format, {test id: seconds}) from tests.jsonl, also of a cut run
python -c "
import json, sys
d = {}
for line in open(sys.argv[1]):
    t = json.loads(line)
    d[t['test']] = round(d.get(t['test'], 0.0) + t['seconds'], 3)
json.dump(d, open(sys.argv[2], 'w'), indent=1, sort_keys=True)
print(f'durations of {len(d)} tests: {sum(d.values()):.0f} s in all')
" "$REPLAYSSM_TEST_LOG" "$OUT/durations.json"
sleep 1  # let tee finish log.txt
exit $rc
