#!/usr/bin/env bash
# One device call: Nsight Compute on the small-batch paths that issue 17's targets name (batch 1 and 8),
# every launch of our kernels in one verify/commit step (replay or baseline; no name filter beyond the
# module prefixes of our Triton kernels), after warm-up steps.  Input lines on stdin:
#   "FAMILY DECODE BATCH OPTIONS_JSON KERNEL [MODE]"   (KERNEL: triton-replay or triton-baseline)
# NCU_SKIP (default 6) / NCU_COUNT (default 6): launches of the matched kernels to skip / profile.
# Writes $OUT/ncu_small_<i>.txt (full sections) and prints the summary lines of each.
set -uo pipefail
OUT=${OUT:-out/ncu_small}
mkdir -p "$OUT"
source tools/device_env.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
i=0
while read -r fam dec batch opts kern mode; do
  [ -z "$fam" ] && continue
  i=$((i+1))
  echo "== $fam $dec batch $batch $opts $kern ${mode:-s32a16}"
  PROFILE_STEPS=${PROFILE_STEPS:-8} timeout 150 "$NCU" --clock-control none --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    -k "regex:^_" -s "${NCU_SKIP:-6}" -c "${NCU_COUNT:-6}" \
    python tools/split_phases.py profile "$fam" "$dec" "$batch" "$opts" "${mode:-s32a16}" --kernel "$kern" \
    > "$OUT/ncu_small_$i.txt" 2>&1
  grep -E "^  [_a-z].*kernel|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Registers Per|Grid Size|Block Size|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp Per|No Eligible" "$OUT/ncu_small_$i.txt" | head -60
  grep -E -A3 "WRN|OPT" "$OUT/ncu_small_$i.txt" | grep -iE "stall|cycles|waiting|latency|wave" | head -8
done
