#!/usr/bin/env bash
# One H200 call for the GDN kernels (issue 5), run from the repository root on the device machine:
#   1. compile the benchmark's launch configurations in parallel processes (Triton's disk cache)
#      while the GPU tests validate every kernel and mode through the engine (pytest -n 8);
#   2. the issue-5 benchmark table (copy bandwidth, baseline vs replay, traffic-model limit).
# Logs and the JSON result go to $OUT.  GDN_QUICK=1: one launch configuration per kernel.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/gdn}
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
if ! pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1; then
  ln -sfn ../validators replayssm/validators; ln -sfn ../scenarios replayssm/scenarios; export PYTHONPATH=$PWD
fi
python -c "import replayssm.validators.runner, replayssm.ops.gdn.bench_cases" || { echo "replayssm does not import"; exit 1; }
git rev-parse HEAD 2>/dev/null; git status --porcelain --untracked-files=no 2>/dev/null | head
stamp "setup done"
Q=${GDN_QUICK:+--quick}
python -m replayssm.ops.gdn.bench_cases warm $Q --workers 6 > "$OUT/gdn_warm.txt" 2>&1 &
warm=$!
python -m pytest tests/test_gdn_gpu.py -m gpu -q -n 8 -p no:cacheprovider --durations=10 ${GDN_TESTS:-} \
  > "$OUT/gdn_tests.txt" 2>&1
stamp "tests done (exit $?)"
tail -25 "$OUT/gdn_tests.txt"
wait $warm
stamp "warm done"; tail -3 "$OUT/gdn_warm.txt"
python -m replayssm.ops.gdn.bench_cases bench $Q --json "$OUT/gdn_bench.json" 2>&1 | tee "$OUT/gdn_bench.txt"
stamp "bench done"
