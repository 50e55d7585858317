#!/usr/bin/env bash
# One H200 call for the GDN kernels (issue 5), run from the repository root on the device machine:
#   1. compile the benchmark's launch configurations in parallel processes (Triton's disk cache)
#      while the GPU tests validate the kernels through the engine (pytest -n $GDN_WORKERS,
#      selection $GDN_TESTS, default all);
#   2. the issue-5 benchmark table (copy bandwidth, baseline vs replay, traffic-model limit) and the
#      replay phases timed alone;
#   3. Nsight Compute sections (speed of light, occupancy, launch stats, warp states) for one launch
#      of each kernel phase at batch 128 (skipped when ncu is not there).
# Logs and the JSON result go to $OUT.  GDN_QUICK=1: one launch configuration per kernel.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/gdn}
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
echo "commit ${GDN_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
source tools/device_env.sh
python -c "import replayssm.ops.gdn.bench_cases" || { echo "replayssm does not import"; exit 1; }
stamp "setup done"
Q=${GDN_QUICK:+--quick}
python -m replayssm.ops.gdn.bench_cases warm $Q --workers 4 > "$OUT/gdn_warm.txt" 2>&1 &
warm=$!
python -m pytest tests/test_gdn_gpu.py -m gpu -q -n "${GDN_WORKERS:-8}" -p no:cacheprovider --durations=5 \
  -k "${GDN_TESTS:-gpu}" > "$OUT/gdn_tests.txt" 2>&1
stamp "tests done (exit $?)"
grep -E "passed|failed|FAILED|Error" "$OUT/gdn_tests.txt" | tail -15
wait $warm
stamp "warm done"; tail -1 "$OUT/gdn_warm.txt"
python -m replayssm.ops.gdn.bench_cases bench $Q --json "$OUT/gdn_bench.json" > "$OUT/gdn_bench.txt" 2>&1
stamp "bench done"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  timeout 120 "$NCU" --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats -k "regex:_replay_decode_kernel|_replay_spec_small_kernel|_baseline_kernel" -c 22 \
    python -m replayssm.ops.gdn.bench_cases profile > "$OUT/gdn_ncu.txt" 2>&1
  stamp "ncu done (exit $?)"
  grep -E "^  _|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit Registers|Warp Cycles Per Issued" "$OUT/gdn_ncu.txt" | head -150
fi
cat "$OUT/gdn_bench.txt"
