#!/usr/bin/env bash
# One device call: Nsight Compute sections for the pre-pass and stream kernels (or the one-launch
# standard decode kernel, options {"prepass": false}) of the configurations
# given as lines "FAMILY DECODE BATCH OPTIONS_JSON [MODE]" on stdin (default: the second verify's
# launches; NCU_SKIP / NCU_COUNT: launches of the two kernels to skip / profile, PROFILE_STEPS: steps run).
set -uo pipefail
OUT=${OUT:-out/ncu}
mkdir -p "$OUT"
source tools/device_env.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
i=0
while read -r fam dec batch opts mode; do
  [ -z "$fam" ] && continue
  i=$((i+1))
  echo "== $fam $dec $batch $opts ${mode:-s32a16}"
  timeout 150 "$NCU" --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats -k "regex:coef_kernel|stream_kernel|replay_decode_kernel" -s ${NCU_SKIP:-2} -c ${NCU_COUNT:-2} \
    python tools/split_phases.py profile "$fam" "$dec" "$batch" "$opts" ${mode:-s32a16} > "$OUT/ncu_$i.txt" 2>&1
  grep -E "^  _|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Stall|One or More" "$OUT/ncu_$i.txt" | head -40
  grep -E -A3 "WRN|OPT" "$OUT/ncu_$i.txt" | grep -iE "stall|cycles|waiting|barrier|latency" | head -8
done
