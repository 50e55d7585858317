"""The fuzzer catches every broken kernel under the ``ci`` profile, in few scenarios, with a small reproducer.

Oracle: the mutants (validators/engine/mutants/) each carry one known
bug, so the validation engine must fail each one; the fuzzer must find a failing scenario
within the first 100 generated scenarios (the ``ci`` profile's bound; work, not wall clock:
a loaded machine reaches the same verdict) and, with shrinking bounded to 150 more scenarios,
shrink bookkeeping bugs to <= 2 active rows and <= 8 verify steps.  The
shrunk reproducer is saved as a failure artifact, and ``replayssm validate --scenario FILE``
(no --kernel) must replay it: exit 1 with the same first failing check at the same step.
"""

import json

import pytest

from replayssm.cli import main
from replayssm.precision import STANDARD_MODES
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.fuzz_artifacts import load_failure
from replayssm.validators.engine.mutants import all_mutants
from replayssm.validators.engine.runner import run_scenario
from replayssm.validators.jobs.fuzz.gallery import (
    DOT_FAMILIES,
    dot_modes,
    failure_class,
    gallery_cases,
    problems,
    run_case,
    run_dot_case,
)
from replayssm.validators.jobs.fuzz.regressions import CORPUS
from replayssm.validators.jobs.fuzz.run import fuzz_kernel

CASES = gallery_cases()


pytestmark = pytest.mark.usefixtures("one_thread")


def test_gallery_has_at_least_fifteen_mutants_covering_the_classes():
    names = set(all_mutants())
    assert len(names) >= 15
    classes = {failure_class(n) for n in names}
    assert {"bookkeeping", "arithmetic", "precision"} <= classes
    for want in ("mutant-ring-wrap-off-by-one", "mutant-early-flush", "mutant-exclusive-cumsum",
                 "mutant-tiled-head-groups", "mutant-dt-bias-twice", "mutant-sr-biased", "mutant-fp8-scale-stale",
                 "mutant-sr-stale-seed", "mutant-boundary-backward-copy"):
        assert want in names


# The slowest fuzzer runs (their shrinking: tens of seconds each on a loaded 2-core machine) are in the
# slow tier for ./dev test's 10 minutes; every run still catches each of them through its shrunk reproducer in
# golden/regressions (tests/jobs/test_regressions.py; checked below) and sr-stale-seed through its named
# scenario too.
SLOW_FUZZ = {("mutant-sr-stale-seed", "mamba2"), ("mutant-softplus-threshold", "gdn"),
             ("mutant-softplus-threshold", "mamba2"), ("mutant-sr-biased", "mamba2"), ("mutant-sr-biased", "gdn"),
             ("mutant-sr-biased", "kda"), ("mutant-int8-truncation", "kda"),
             ("mutant-stale-read", "mamba2"), ("mutant-int8-truncation", "gdn"),
             ("mutant-reset-none-keeps-state", "mamba2")}


def _case(name, family):
    return pytest.param(name, family, marks=pytest.mark.slow) if (name, family) in SLOW_FUZZ else (name, family)


def test_slow_tier_mutants_keep_a_reproducer_in_the_corpus():
    held = {(rec.kernel, rec.family) for rec in (load_failure(p)[1] for p in sorted(CORPUS.glob("*.json")))
            if rec.status == "mutant"}
    assert SLOW_FUZZ <= set(CASES) and SLOW_FUZZ <= held, SLOW_FUZZ - held


@pytest.mark.parametrize("name,family", [_case(n, f) for n, f in CASES], ids=[f"{f}-{n}" for n, f in CASES])
def test_fuzzer_catches_mutant(name, family, tmp_path, capsys):
    report = run_case(name, family, tmp_path / "failures")
    assert not problems(report), f"{report.summary()}: {problems(report)}"
    # The saved reproducer replays exactly through the CLI, which reads the kernel from the file.
    sc, record = load_failure(report.artifact)
    assert sc == report.scenario and record.kernel == name
    out = tmp_path / "replay"
    assert main(["validate", "--scenario", str(report.artifact), "--out", str(out), "--quiet"]) == 1
    (res_file,) = out.glob("*.json")
    first = json.loads(res_file.read_text())["first_failure"]
    assert (first["check"], first["step"]) == (record.check, record.first_bad_step)
    assert "FAIL" in capsys.readouterr().out


# Standard decode with L = 1 (a flush every step), fp8 state with stochastic rounding, decay near 1:
# 120 flushes of correlated rounding.  Measured 2026-12-01, seeds 0-2: the mutant fails
# flush-checkpoint at steps 20-61 in both families; literal-replay passes at <= 0.48 of the bound.
NAMED = dict(decode="standard", mode="sfp8a16-sr", buffer=1, schedule="always-1", steps=120,
             distribution="long-memory")


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_statistical_mutants_on_named_scenarios(family):
    """mutant-sr-stale-seed on its named scenario (the gdn case is not fuzzed in CI: see its registration)."""
    sc = Scenario.tiny(family, **NAMED)
    assert run_scenario(sc, "literal-replay", repeat_check=False).passed
    res = run_scenario(sc, "mutant-sr-stale-seed", repeat_check=False)
    assert not res.passed and res.failures[0].check in ("flush-checkpoint", "flush-increment", "state")


@pytest.mark.slow  # 21 s of a loaded 2-core run; nox -s tests_slow
def test_shrinking_stops_after_its_scenario_budget():
    # The count bound the gallery relies on: after the first failure at most the budget of new
    # scenarios runs (0 here, so the first failing scenario is the reproducer).
    full = fuzz_kernel("mutant-stale-read", "gdn", profile="ci", shrink_budget_s=None)
    cut = fuzz_kernel("mutant-stale-read", "gdn", profile="ci", shrink_budget_s=None, shrink_budget_examples=0)
    assert full.caught and cut.caught and cut.shrink_stopped_by_budget and not full.shrink_stopped_by_budget
    assert cut.examples == cut.examples_to_first_failure == full.examples_to_first_failure < full.examples
    assert cut.scenario is not None and cut.record is not None


def test_a_raise_is_a_catch_only_where_the_mutant_declares_it():
    # ring-index-unwrapped declares raising as its bug (an out-of-range index); judged as if it did not,
    # the scenarios where it only raises pass, and the gallery would report it not caught.
    assert all_mutants()["mutant-ring-index-unwrapped"].raises
    assert not any(s.raises for n, s in all_mutants().items() if n != "mutant-ring-index-unwrapped")
    r = fuzz_kernel("mutant-ring-index-unwrapped", "mamba2", profile="ci", shrink_budget_s=None,
                    shrink_budget_examples=0, exceptions_fail=False, max_examples=20)
    assert r.raised > 0 and not r.caught and problems(r)
    assert run_case("mutant-ring-index-unwrapped", "mamba2").caught


# ---- the gallery in every declared readout-dot mode family (-tf32, -tf32x3) ------------------------------------
# The three mutants a -tf32 mode once let pass (issue 47: the state bound grew with the readout dot's u),
# a KDA arithmetic slip and a bookkeeping one: CI's representative subset; the profile gallery-dots
# runs every gallery case (test_gallery_in_every_dot_family).
DOT_SUBSET = [("mutant-fold-weighted-input-bf16", "mamba2"), ("mutant-flush-bf16-arithmetic", "gdn"),
              ("mutant-decay-records-bf16", "kda"), ("mutant-exclusive-cumsum", "kda"), ("mutant-early-flush", "gdn")]


def _judged_in_dot_families(name, family):
    report = run_case(name, family)
    assert report.caught, report.summary()
    for dot in DOT_FAMILIES:
        v = run_dot_case(report, dot)
        assert v.caught is not False, v.summary()
        if v.caught is None:  # only a kernel that refuses every mode of the family (a baseline)
            assert all_mutants()[name].classes[family].base_kind == "baseline", v.summary()


@pytest.mark.parametrize("name,family", DOT_SUBSET, ids=[f"{f}-{n}" for n, f in DOT_SUBSET])
def test_gallery_in_the_dot_families_subset(name, family):
    _judged_in_dot_families(name, family)


@pytest.mark.slow
@pytest.mark.parametrize("name,family", CASES, ids=[f"{f}-{n}" for n, f in CASES])
def test_gallery_in_every_dot_family(name, family):
    _judged_in_dot_families(name, family)


def test_dot_modes_are_the_sweep_with_the_dot():
    assert dot_modes("tf32")[:2] == ("s32a32-tf32", "s32a16-tf32") and "s16a16-tf32-sr" in dot_modes("tf32")
    assert len(dot_modes("tf32x3")) == len(STANDARD_MODES) - 1
