#!/usr/bin/env bash
# Issue 13's FlashInfer / SGLang / mamba_ssm adapters on one GPU, from carried wheels (the GPU
# machine has no package index).  One device call per source group, each within the 64 MiB that
# travels (the working tree is ~1.9 MB):
#   bash tools/flashinfer_h200.sh flashinfer   carry [".whl/flashinfer"]: flashinfer-python 0.7.2.post1
#                                              as its unpacked tree in tar.xz (15.7 MB; the wheel is 62 MB)
#                                              + apache-tvm-ffi 0.1.15.post2 (cp312, 3.3 MB)
#   bash tools/flashinfer_h200.sh sglang       carry [".whl/sglang"]: sglang 0.5.23
#                                              (cp312) + the mamba_ssm 2.3.2.post1 sdist, 39.3 MB
# How to fill .whl/ on the developer machine: tools/README.md ("FlashInfer / SGLang wheels").
# Steps: 1. probe (nvcc, ninja, CUDA headers, torch/CUDA versions; the wheels install offline into
# /tmp/site; `import flashinfer.mamba`); 2. (flashinfer) three validate runs in the background, each
# with its own --out (/tmp/fi_results_N); 3. alongside them the adapters' GPU tests of that group at
# batch 8 (tests/test_adapters_gpu.py -k SOURCE; pytest-xdist workers so the JIT builds run in
# parallel), then at batch 512 on FI_B512_WORKERS.  Results in $OUT (at most 8 files come back):
# probe.txt, validate.txt, tests.txt, tests.jsonl (one line per finished test: seconds, outcome, why a
# failure failed; kept when the limit cuts the run), log.txt.  Parameters: FI_WORKERS (8),
# FI_B512_WORKERS (2), FI_TEST_LIMIT (240 s per batch size), FI_VALIDATE_LIMIT (300 s).
set -uo pipefail
GROUP=${1:-flashinfer}
OUT=${OUT:-out/adapters_$GROUP}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "$*" | tee -a "$OUT/log.txt"; }
{
  echo "== group $GROUP"
  command -v nvcc && nvcc --version | tail -2 || echo "nvcc: NOT FOUND (FlashInfer's JIT needs it)"
  command -v ninja && ninja --version || echo "ninja: NOT FOUND (FlashInfer's JIT needs it)"
  NVCC=$(command -v nvcc || true)
  export CUDA_HOME=${CUDA_HOME:-${NVCC:+$(dirname "$(dirname "$NVCC")")}}
  echo "CUDA_HOME=$CUDA_HOME"; ls "$CUDA_HOME/include/cuda_runtime.h" 2>&1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
  ls -l .whl/"$GROUP"/
} > "$OUT/probe.txt" 2>&1
case "$GROUP" in
  flashinfer)
    # a wheel too large to travel comes as its unpacked tree in tar.xz (tools/README.md): a pure
    # py3-none-any wheel installs by unpacking into the target, which is what pip --target does with it
    mkdir -p /tmp/site
    for t in .whl/flashinfer/*.tar.xz; do
      [ -e "$t" ] || continue
      tar -xJf "$t" -C /tmp/site >> "$OUT/probe.txt" 2>&1 || { log "unpacking $t failed (probe.txt)"; exit 1; }
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/flashinfer/*.whl \
      >> "$OUT/probe.txt" 2>&1 || { log "pip install of .whl/flashinfer/*.whl failed (probe.txt)"; exit 1; }
    export PYTHONPATH=/tmp/site ;;
  sglang)  # the sglang wheel and the mamba_ssm sdist of .whl/sglang
    source tools/adapter_sources.sh
    adapter_sources "$OUT/probe.txt" || { log "pip install of the .whl/sglang wheels failed (probe.txt)"; exit 1; } ;;
  *) echo "usage: tools/flashinfer_h200.sh flashinfer|sglang" >&2; exit 2 ;;
esac
python3 -c "import flashinfer.mamba, flashinfer; print('flashinfer', flashinfer.__version__)" >> "$OUT/probe.txt" 2>&1 \
  || [ "$GROUP" != flashinfer ] || log "import flashinfer.mamba failed (probe.txt)"
source tools/device_env.sh
python -m replayssm list adapters | tee -a "$OUT/log.txt"
if [ "$GROUP" = flashinfer ]; then
  # the three runs in parallel: each JIT-builds its own FlashInfer module (minutes each, one core each)
  i=0
  for args in "flashinfer-baseline --decode standard --buffer 16 --schedule always-1 --steps 4" \
              "flashinfer-replay --decode speculative --window 4 --buffer 12 --steps 8" \
              "flashinfer-replay --decode speculative --window 4 --buffer 12 --steps 8 --precision si8a16"; do
    i=$((i + 1))
    # super120b (head dim 64): FlashInfer 0.7.2 built no kernel for nano4b's head dim 80 (2026-12-01)
    ( timeout ${FI_VALIDATE_LIMIT:-300} python -m replayssm validate --kernel $args --family mamba2 \
        --geometry "${FI_GEOMETRY:-super120b}" --device cuda --debug --out "/tmp/fi_results_$i" \
        > "$OUT/validate_$i.txt" 2>&1
      log "validate $args rc=$?" ) &
  done
  K="flashinfer"
else
  K="sglang or mamba-ssm"
fi
# the adapters' GPU tests, batch 8 alongside the validate runs (FlashInfer locks each module it
# builds, so a module two processes need is built once), then batch 512 on fewer workers: at
# super120b one B512 test holds tens of GB (the fp64 reference of 512 x 128 heads x 64 x 128 states);
# 6 workers beside another GPU job ran out of the H200's 140 GB (2026-12-01).  tests.jsonl: one
# line per finished test with its seconds and, for a failure, why (kept when the limit cuts the run).
for B in B8 B512; do
  W=${FI_WORKERS:-8}; [ "$B" = B512 ] && W=${FI_B512_WORKERS:-2}
  REPLAYSSM_TEST_LOG="$OUT/tests.jsonl" timeout ${FI_TEST_LIMIT:-240} python -m pytest -q -s -m gpu \
    tests/test_adapters_gpu.py -k "($K) and $B" -n "$W" -p no:cacheprovider -rfE --tb=short \
    >> "$OUT/tests.txt" 2>&1
  log "GPU tests $K $B rc=$?"
  [ "$B" = B8 ] && wait  # the validate runs
done
grep -v "INFO - core\|Warning\|warner" "$OUT/tests.txt" | tail -30 >> "$OUT/log.txt"
# at most 8 files come back from a device call: the validate runs' logs as one file
cat "$OUT"/validate_[0-9].txt > "$OUT/validate.txt" 2>/dev/null && rm -f "$OUT"/validate_[0-9].txt
grep -h "^PASS\|^FAIL\|^  [a-z]" "$OUT/validate.txt" >> "$OUT/log.txt"
