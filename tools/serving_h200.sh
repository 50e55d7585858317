#!/usr/bin/env bash
# Issue 14 on an H200: the serving layouts (packed query_start_loc + ragged windows + permuted rows; standard
# steps on speculative slots) of every kernel declaring them, validated on CUDA at real geometry
# (tools/serving_layouts.py).
# Carry .peers/vllm-replayssm to include the vLLM adapters.  Env: SERVING_BATCHES (default 8,64),
# SERVING_STEPS (24), SERVING_DEADLINE (s before no new run starts, default 420), REPLAYSSM_COMMIT.
# Results in $OUT: serving.jsonl (one line per run), log.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/serving}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
echo "commit ${REPLAYSSM_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
source tools/device_env.sh
[[ -d .peers/vllm-replayssm ]] && export REPLAYSSM_VLLM_SRC=$PWD/.peers/vllm-replayssm
timeout 540 python tools/serving_layouts.py --out "$OUT" --batches "${SERVING_BATCHES:-8,64}" \
  --steps "${SERVING_STEPS:-24}" --deadline "${SERVING_DEADLINE:-420}"
echo "serving_layouts exit $?"
grep -c '"passed": true' "$OUT/serving.jsonl"; grep -c '"passed": false' "$OUT/serving.jsonl"
