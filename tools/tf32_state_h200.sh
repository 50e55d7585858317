#!/usr/bin/env bash
# Issue 47 on one GPU: the vLLM fork's Mamba-2 replay kernel and our triton-replay at s32a16-tf32 and
# s32a16, nano4b, batch 8, exhaustive schedule (tools/tf32_state.py).  Run from the repository root of a
# copy of the tree carrying .peers/vllm-replayssm (or set REPLAYSSM_VLLM_SRC).  Results in $OUT:
# tf32_state.jsonl (one record per run, then the table), tf32_state.json.
set -uo pipefail
OUT=${OUT:-out/tf32_state}; mkdir -p "$OUT"
export REPLAYSSM_VLLM_SRC=${REPLAYSSM_VLLM_SRC:-$PWD/.peers/vllm-replayssm}
export PYTHONUNBUFFERED=1
source tools/device_env.sh
timeout "${TF32_LIMIT:-540}" python tools/tf32_state.py --json "$OUT/tf32_state.json" ${TF32_ARGS:-} \
  2>"$OUT/tf32_state.err" | tee "$OUT/tf32_state.jsonl"
echo "tf32_state rc=${PIPESTATUS[0]}"
