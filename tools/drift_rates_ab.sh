#!/usr/bin/env bash
# Same-call A/B of single drift cells' validated tokens/s (issue 18): this tree (B) against a base tree (A)
# carried beside it, in the order B A A B, so that a drift of the machine over the call cancels in the
# pairs' means.  Rates of different calls and machines differ by up to ~20 % (docs/benchmarks.md), so a
# change is judged by pairs from one call only.
#
#   git archive <base-commit> | (mkdir -p .bench/base && tar -x -C .bench/base)   # here, before the call
#   OUT=/path bash tools/drift_rates_ab.sh [CELL ...]                            # on the device; carry .bench
#
# Parameters: AB_SECONDS (35) timed seconds per cell and run, AB_BASE (.bench/base) the base tree,
# AB_ROWS (8).  Default cells: the two spec-random s32a16 cells at nano4b / qwen35-4b.  Each run installs
# its tree as the `replayssm` package first (its tools/device_env.sh: the install and the import check), and
# this tree is installed again at the end.  Writes $OUT/rates_{B1,A1,A2,B2}.json and prints one line per cell and run.
set -uo pipefail
ROOT=$PWD
OUT=${OUT:-out/drift_rates_ab}
AB_SECONDS=${AB_SECONDS:-35}
AB_BASE=${AB_BASE:-.bench/base}
AB_ROWS=${AB_ROWS:-8}
mkdir -p "$OUT"
[ -d "$AB_BASE/replayssm" ] || { echo "drift_rates_ab: no base tree at $AB_BASE (git archive it there first)" >&2; exit 2; }
CELLS=("$@")
[ ${#CELLS[@]} -gt 0 ] || CELLS=(mamba2.triton-replay.s32a16.long-memory.spec-random
                                   gdn.triton-replay.s32a16.long-memory.spec-random)
# each tree installed by its own tools/device_env.sh, which also checks that `replayssm` then imports from it
install() { source tools/device_env.sh >/dev/null; }
status=0
for run in B1 A1 A2 B2; do
  tree=$ROOT
  [ "${run:0:1}" = A ] && tree=$ROOT/$AB_BASE
  (cd "$tree" && install && cd tools \
     && python drift_rates.py "$OUT/rates_$run.json" --seconds "$AB_SECONDS" --rows "$AB_ROWS" "${CELLS[@]}") \
    | python -c "import json, sys; [print('$run', d['cell'], d['tokens_per_s'], d.get('pieces'), d['replays'])
                 for d in (json.loads(x) for x in sys.stdin if x.startswith('{'))]" || status=1
done
(cd "$ROOT" && install)
exit $status
