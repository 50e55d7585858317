"""The evidence behind ``tolerances.MARGINAL_FACTOR`` (issue 47): how far above the tolerance rule's
bound correct kernels go, and how far above it the gallery's broken kernels are caught.

Oracle: the validation engine with no marginal band (``run_scenario(..., marginal_factor=1)``): every
error above the bound fails, as before the band existed.  A run's ratio is its margin (the worst error
/ bound of the banded checks ``output``, ``state``, ``flush-checkpoint``, ``ValidationResult.margin``).

* ``variants``: every correct literal kernel of every family (the literal models, each bookkeeping
  policy's literal, the legitimate operation-order variants: cumulative-sum and running-product decay
  weights, the recurrent in-window solve, staged folds) on ``tiny``, 12 steps, at s32a32 / s32a16 /
  s16a16, every input distribution, the exhaustive schedule: the worst ratio per kernel.
  A band must sit above them (they must never even be marginal).
* ``external``: the CPU reproducers of the findings on kernels written elsewhere
  (``tests/fixtures/findings``; the softplus of the Mamba-2 baselines, tests/adapters/test_findings_softplus.py):
  their ratio, for the adapters that load here (the vLLM fork from ``../shared/peers`` as the tests
  do); and ``EXTERNAL`` (SGLang's Mamba-2 baseline, under the Triton interpreter) swept like the
  variants at s32a32.
* ``gallery``: every gallery mutant the CI fuzzes (``gallery_run.gallery_cases``, the slow tier left
  out) fuzzed as the gallery does, its shrunk reproducer replayed, plus every mutant reproducer of the
  regression corpus (``golden/regressions``, the slow tier's among them): the catch strength of each,
  the largest error / bound of a banded check among its failures, or ``inf`` where a check that is not
  banded (bit-exact invariants, cursors, stored precision, ...) caught it.  A band must sit below the
  smallest (a band never turns a gallery catch into a marginal).

One record per kernel (``--record FILE``: JSON lines, ``docs/reports/ledger.jsonl``); a table on stdout.

    python tools/margin_evidence.py variants --record FILE
    python tools/margin_evidence.py external --record FILE
    python tools/margin_evidence.py gallery --record FILE [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from replayssm import adapters
from replayssm.records import Recorder, append
from replayssm.registry import kernels
from replayssm.scenarios.inputs import DISTRIBUTIONS
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.checks import CHECKS
from replayssm.validators.engine.fuzz_artifacts import load_failure
from replayssm.validators.engine.mutants import all_mutants
from replayssm.validators.engine.runner import run_scenario
from replayssm.validators.jobs.fuzz.gallery import SHRINK_EXAMPLES, gallery_cases
from replayssm.validators.jobs.fuzz.regressions import CORPUS
from replayssm.validators.jobs.fuzz.run import fuzz_kernel

MODES = ("s32a32", "s32a16", "s16a16")
SCHEDULES = ("exhaustive",)
FINDINGS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "findings"
PEERS = Path(__file__).resolve().parents[1].parent / "shared" / "peers"
EXTERNAL = (("mamba2", "sglang-baseline", "s32a32"),)
# The gallery cases whose fuzzing takes minutes (tests/jobs/test_mutation_gallery.py SLOW_FUZZ): their
# regression-corpus reproducers stand for them.
SLOW = {("mutant-sr-stale-seed", "mamba2"), ("mutant-softplus-threshold", "gdn"),
        ("mutant-softplus-threshold", "mamba2"), ("mutant-sr-biased", "mamba2"), ("mutant-sr-biased", "gdn")}


def _ratio(res) -> float:
    return float(res.margin["ratio"]) if res.margin else 0.0


def strength(res, raises: bool = True) -> tuple[float, list[str]]:
    """(catch strength, the checks that failed): ``inf`` where a check that is not banded failed (an
    ``exception`` only where ``raises``), else the largest error / bound of its banded failures."""
    checks = sorted({f.check for f in res.failures} | ({"exception"} if res.exception and raises else set()))
    hard = [c for c in checks if c in CHECKS and not CHECKS[c].banded and (raises or c != "exception")]
    if hard:
        return math.inf, checks
    ratios = [f.ratio for f in res.failures if f.ratio is not None]
    return (max(ratios) if ratios else 0.0), checks


def cmd_variants(a, rec: Recorder) -> list[dict]:
    names = [(f, n, MODES) for (f, n) in kernels() if n.startswith("literal-")]
    return _sweep(a, rec, names, "variants")


def _sweep(a, rec: Recorder, names, what: str) -> list[dict]:
    out = []
    for fam, name, modes in names:
        worst, where, runs, t0 = 0.0, None, 0, time.perf_counter()
        for mode in modes:
            for dist in sorted(DISTRIBUTIONS):
                for sched in SCHEDULES:
                    sc = Scenario.tiny(fam, "speculative", mode=mode, distribution=dist, steps=a.steps,
                                       initial_state="random", schedule=sched)
                    res = run_scenario(sc, name, repeat_check=False, marginal_factor=1.0)
                    runs += 1
                    r = _ratio(res)
                    if r > worst:
                        worst, where = r, {"mode": mode, "distribution": dist, "schedule": sched, **res.margin}
        print(f"{fam:7s} {name:34s} worst {worst:.3f} x the bound  {json.dumps(where)}", flush=True)
        out.append(rec.record(f"margin/{fam}/{name}/{what}", family=fam, kernel=name, geometry="tiny",
                              metrics={"worst_ratio": worst, "runs": runs, "wall_s": time.perf_counter() - t0},
                              verdict="none", reason=None if where is None else f"worst at {json.dumps(where)}",
                              config={"modes": list(modes), "distributions": sorted(DISTRIBUTIONS),
                                      "schedules": list(SCHEDULES), "steps": a.steps, "decode": "speculative",
                                      "marginal_factor": 1.0}))
    return out


def cmd_external(a, rec: Recorder) -> list[dict]:
    if "REPLAYSSM_VLLM_SRC" not in os.environ and (PEERS / "vllm-replayssm").is_dir():
        os.environ["REPLAYSSM_VLLM_SRC"] = str(PEERS / "vllm-replayssm")
    adapters.load(force=True)
    out = []
    for path in sorted(FINDINGS.glob("*.json")):
        d = json.loads(path.read_text())
        kernel, fam = d["failure"]["kernel"], d["failure"]["family"]
        if (fam, kernel) not in kernels():
            print(f"{path.stem}: {kernel} not registered here (its adapter did not load)", flush=True)
            continue
        sc = Scenario.from_json(path.read_text())
        res = run_scenario(sc, kernel, repeat_check=False, marginal_factor=1.0)
        s, checks = strength(res)
        print(f"{path.stem:40s} margin {_ratio(res):.3f}  strength {s:.3f}  {checks}", flush=True)
        out.append(rec.record(f"margin/{fam}/{kernel}/finding-{path.stem}", family=fam, kernel=kernel, mode=sc.mode,
                              metrics={"worst_ratio": _ratio(res), "catch_strength": s, "failed_checks": checks},
                              verdict="none", reason=res.margin_line(),
                              config={"fixture": path.name, "marginal_factor": 1.0}))
    return out + _sweep(a, rec, [(f, n, (m,)) for f, n, m in EXTERNAL if (f, n) in kernels()], "sweep")


def cmd_gallery(a, rec: Recorder) -> list[dict]:
    out = []
    specs = all_mutants()
    cases = [(n, f) for n, f in gallery_cases() if (n, f) not in SLOW and (not a.only or n in a.only)]
    tmp = Path(tempfile.mkdtemp(prefix="margin-gallery-"))
    for name, fam in cases:
        t0 = time.perf_counter()
        raises = specs[name].raises
        r = fuzz_kernel(name, fam, profile="ci", failures_dir=tmp, shrink_budget_s=None,
                        shrink_budget_examples=SHRINK_EXAMPLES, exceptions_fail=raises, marginal_factor=1.0)
        if r.scenario is None:
            s, checks, ratio = 0.0, [], None
        else:
            res = run_scenario(r.scenario, name, stop_on_failure=True, marginal_factor=1.0)
            (s, checks), ratio = strength(res, raises), _ratio(res)
        out.append(_gallery_record(rec, name, fam, s, checks, ratio, "fuzzed (ci profile), shrunk reproducer",
                                   time.perf_counter() - t0, None if r.scenario is None else r.scenario.mode))
    for path in sorted(CORPUS.glob("*.json")):
        sc, fr = load_failure(path)
        if fr.status != "mutant" or (a.only and fr.kernel not in a.only):
            continue
        t0 = time.perf_counter()
        res = run_scenario(sc, fr.kernel, stop_on_failure=True, marginal_factor=1.0)
        s, checks = strength(res, specs[fr.kernel].raises)
        out.append(_gallery_record(rec, fr.kernel, fr.family, s, checks, _ratio(res), f"corpus {path.name}",
                                   time.perf_counter() - t0, sc.mode))
    return out


def _gallery_record(rec, name, fam, s, checks, ratio, how, wall, mode) -> dict:
    print(f"{fam:7s} {name:40s} strength {s:10.3f}  margin {ratio}  {checks}  ({how})", flush=True)
    return rec.record(f"margin/{fam}/{name}/gallery-{'corpus' if how.startswith('corpus') else 'fuzz'}",
                      family=fam, kernel=name, mode=mode,
                      metrics={"catch_strength": s, "worst_ratio": ratio, "failed_checks": checks, "wall_s": wall},
                      verdict="fail" if s > 1.0 else "pass", reason=how, config={"how": how, "marginal_factor": 1.0})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["variants", "external", "gallery"])
    p.add_argument("--record", metavar="FILE", help="append the records here (JSON lines)")
    p.add_argument("--steps", type=int, default=12, help="steps per variant scenario (default 12)")
    p.add_argument("--only", action="append", default=[], help="gallery: only these mutants (repeatable)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rec = Recorder("gallery" if a.what == "gallery" else "validate", source="tools/margin_evidence.py "
                   + " ".join(sys.argv[1:] if argv is None else argv))
    recs = {"variants": cmd_variants, "external": cmd_external, "gallery": cmd_gallery}[a.what](a, rec)
    if a.record:
        append(a.record, recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
