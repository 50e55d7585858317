#!/usr/bin/env bash
# Issue 20's device call: `nox -s bench` end to end on one GPU, and the regression gate shown to work.
#   run A  nox -s bench -- --gate                               (JSON in $OUT/a)
#   run B  the same commit again, --baseline $OUT/a             (must pass: the run-to-run noise)
#   run C  REPLAYSSM_BENCH_SLOW=$BENCH_GATE_SLOW, --baseline $OUT/a (must fail, on the slowed kernel only)
# then tools/bench_gate_report.py: per-case noise A -> B, the suggested thresholds, A -> C, the tables.
# Files in $OUT (8): a/, b/, c/ {kernels,suite}.json, report.md, log.txt.
# Parameters: BENCH_GATE_SLOW (default triton-replay=0.5: an extra memory pass of half the step's
# modelled bytes after every step of triton-replay, test-only), BENCH_GATE_LIMIT_A / BENCH_GATE_LIMIT
# (s for run A / for B and C: 200 / 130),
# REPLAYSSM_COMMIT (the device copy has no .git).  nox comes from $NOX_WHEELS (default .whl/nox)
# when it is not installed: nox, argcomplete, colorlog, dependency_groups, python_discovery, virtualenv.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/bench_gate}
SLOW=${BENCH_GATE_SLOW:-triton-replay=0.5}
LIMIT_A=${BENCH_GATE_LIMIT_A:-200}  # run A compiles every kernel (Triton's disk cache serves B and C)
LIMIT=${BENCH_GATE_LIMIT:-130}
source tools/device_log.sh
source tools/device_env.sh
source tools/nox_wheels.sh
nox_wheels bench_gate nox || exit 1
python -c "import nox, pytest_benchmark; print('nox', nox.__version__ if hasattr(nox, '__version__') else '?', 'pytest-benchmark', pytest_benchmark.__version__)"
# --no-venv --no-install: the machine has torch, Triton and pytest-benchmark and nothing can be fetched
NOX=(python -m nox --no-venv --no-install -s bench --)
stamp "run A"
timeout "$LIMIT_A" "${NOX[@]}" --gate --out "$OUT/a"; rcA=$?
stamp "run A exit $rcA"
timeout "$LIMIT" "${NOX[@]}" --gate --out "$OUT/b" --baseline "$OUT/a"; rcB=$?
stamp "run B (same commit, against A) exit $rcB"
REPLAYSSM_BENCH_SLOW="$SLOW" timeout "$LIMIT" "${NOX[@]}" --gate --out "$OUT/c" --baseline "$OUT/a"; rcC=$?
stamp "run C ($SLOW, against A) exit $rcC"
python tools/bench_gate_report.py "$OUT/a" "$OUT/b" "$OUT/c" --rc "$rcA" "$rcB" "$rcC" --slow "$SLOW" > "$OUT/report.md"
rcR=$?
cat "$OUT/report.md"
stamp "report exit $rcR"
sleep 1  # let tee finish log.txt
exit $rcR
