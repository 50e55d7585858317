#!/usr/bin/env bash
# One device call: Nsight Compute sections of our kernels' launches for the configurations given as lines
# "FAMILY DECODE BATCH OPTIONS_JSON [MODE [KERNEL]]" on stdin (`tools/split_phases.py profile`; MODE default
# s32a16, KERNEL triton-replay or triton-baseline, default triton-replay).  NCU_KERNELS: the kernel-name
# regex (default: the pre-pass and stream kernels and the one-launch standard decode kernel; '^_': every
# launch of our Triton kernels, as for issue 17's batch-1 and batch-8 profiles); NCU_SKIP / NCU_COUNT:
# matching launches to skip / profile (default 2 / 2: the second verify's); PROFILE_STEPS: steps run
# (default 6).  Writes $OUT/ncu_<i>.txt; `tools/ncu_summary.py` makes one table of them.
set -uo pipefail
OUT=${OUT:-out/ncu}
mkdir -p "$OUT"
source tools/device_env.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
i=0
while read -r fam dec batch opts mode kern; do
  [ -z "$fam" ] && continue
  i=$((i+1))
  echo "== $fam $dec $batch $opts ${mode:-s32a16} ${kern:-triton-replay}"
  timeout 150 "$NCU" --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    -k "regex:${NCU_KERNELS:-coef_kernel|stream_kernel|replay_decode_kernel}" -s "${NCU_SKIP:-2}" -c "${NCU_COUNT:-2}" \
    python tools/split_phases.py profile "$fam" "$dec" "$batch" "$opts" "${mode:-s32a16}" \
    --kernel "${kern:-triton-replay}" > "$OUT/ncu_$i.txt" 2>&1
  grep -E "^  _|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Stall|One or More" "$OUT/ncu_$i.txt" | head -40
  grep -E -A3 "WRN|OPT" "$OUT/ncu_$i.txt" | grep -iE "stall|cycles|waiting|barrier|latency" | head -8
done
