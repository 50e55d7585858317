#!/usr/bin/env bash
# KDA kernels on an H200 (issue 19 item 2), from a copy of a committed tree:
#   tools/kda_h200.sh tests   GPU engine tests of the KDA Triton kernels at kimi-linear-48b (every supported
#                             mode, both standard-decode paths, speculative, batch 1 and 512)
#   tools/kda_h200.sh bench   baseline vs replay standard decode, batch 1..512, launch sweep (tools/kda_bench.py),
#                             then the table of record (replayssm bench --family kda, default launches)
#   tools/kda_h200.sh phases  where a batch-512 replay step goes (tools/split_phases.py times kda standard 512:
#                             non-flush step, flush step, pre-pass alone, stream alone)
#   tools/kda_h200.sh profile the batch-512 standard step beside Gated DeltaNet's (same state size): phases of
#                             both (split_phases.py times), then Nsight Compute of both families' pre-pass and
#                             stream at write_pos 8-15 (the flush included; tools/ncu_split.sh, ncu_{1,2}.txt)
#   tools/kda_h200.sh all     tests, bench and phases
# Env: KDA_TEST_LIMIT (s, default 240), KDA_BENCH_LIMIT (default 300), KDA_BATCHES (default 1,8,32,128,256,512),
#      KDA_QUICK=1 (two launch candidates per kernel), REPLAYSSM_COMMIT (the device copy has no .git).
# Results in $OUT: kda_tests.txt, kda_bench.{json,md}, kda_bench_log.txt, kda_bench_family.{json,txt},
#   kda_phases.jsonl.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/kda}
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
echo "commit ${REPLAYSSM_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
source tools/device_env.sh
what=${1:-all}
if [[ $what == tests || $what == all ]]; then
  workers=$(python -c "import xdist" 2>/dev/null && echo "-n 6" || echo "")
  timeout ${KDA_TEST_LIMIT:-240} python -m pytest tests/test_kda_gpu.py -m gpu -q $workers -p no:cacheprovider \
    -k "not batch512" > "$OUT/kda_tests.txt" 2>&1
  stamp "kda gpu tests (exit $?)"; tail -3 "$OUT/kda_tests.txt"; grep -E "^FAILED" "$OUT/kda_tests.txt" | head
  timeout 150 python -m pytest tests/test_kda_gpu.py -m gpu -q -p no:cacheprovider -k batch512 \
    >> "$OUT/kda_tests.txt" 2>&1
  stamp "kda gpu batch-512 tests (exit $?)"; tail -2 "$OUT/kda_tests.txt"; grep -E "^FAILED" "$OUT/kda_tests.txt" | head
fi
if [[ $what == bench || $what == all ]]; then
  timeout ${KDA_BENCH_LIMIT:-300} python tools/kda_bench.py --out "$OUT" --batches "${KDA_BATCHES:-1,8,32,128,256,512}" \
    ${KDA_QUICK:+--quick} > /dev/null 2>&1
  stamp "kda launch sweep (exit $?)"; tail -12 "$OUT/kda_bench_log.txt"
  timeout 200 python -m replayssm bench --family kda --no-sweep --rep-ms 100 --json "$OUT/kda_bench_family.json" \
    > "$OUT/kda_bench_family.txt" 2>&1
  stamp "replayssm bench --family kda (exit $?)"; tail -14 "$OUT/kda_bench_family.txt"
fi
if [[ $what == phases || $what == all ]]; then
  for opts in '{}' '{"coef_warps": 1}' '{"block_v": 16, "num_warps": 2}'; do
    timeout 90 python tools/split_phases.py times kda standard 512 "$opts" s32a16 >> "$OUT/kda_phases.jsonl" 2>&1
  done
  stamp "kda phases (exit $?)"; cat "$OUT/kda_phases.jsonl"
fi
if [[ $what == profile ]]; then
  for fam in kda gdn; do
    timeout 90 python tools/split_phases.py times $fam standard 512 '{}' s32a16 >> "$OUT/kda_phases.jsonl" 2>&1
  done
  stamp "phases, kda and gdn (exit $?)"; cat "$OUT/kda_phases.jsonl"
  printf 'kda standard 512 {}\ngdn standard 512 {}\n' | OUT="$OUT" PROFILE_STEPS=16 NCU_SKIP=16 NCU_COUNT=16 \
    bash tools/ncu_split.sh
  stamp "ncu (exit $?)"
fi
