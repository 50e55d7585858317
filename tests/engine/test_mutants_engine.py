"""Every broken kernel fails, and the engine names exactly the first step where its bug shows.

Oracle: each mutant's ``first_bad`` rule (validators/engine/mutants.py) derives that step from the
scenario's plan and the spec's cursor rules alone, independently of the runner.
"""

from __future__ import annotations

import pytest

from replayssm.registry import kernels
from replayssm.scenarios import Scenario
from replayssm.validators import run_scenario
from replayssm.validators.engine.mutants import FIELD_BUGS as MUTANTS
from replayssm.validators.engine.mutants import first_bad_step

CASES = [(name, fam, dec) for name, spec in MUTANTS.items() for fam in ("mamba2", "gdn") for dec in spec.decodes]


pytestmark = pytest.mark.usefixtures("one_thread")


def test_at_least_the_seven_field_bugs_are_registered():
    want = {"mutant-stale-read", "mutant-no-commit", "mutant-clamped-accept", "mutant-stale-ring-row",
            "mutant-low-precision-state", "mutant-late-flush", "mutant-padding-writer"}
    assert want <= set(MUTANTS)
    for name in MUTANTS:
        for fam in ("mamba2", "gdn"):
            cls = kernels(fam)[(fam, name)]
            assert cls.kind == "mutant" and cls.description


@pytest.mark.parametrize("name,family,decode", CASES, ids=[f"{n}-{f}-{d}" for n, f, d in CASES])
def test_mutant_fails_at_its_first_bad_step(name, family, decode):
    sc = Scenario.tiny(family, decode, mode="s16a16", schedule="exhaustive")
    want = first_bad_step(name, sc)
    assert want is not None
    res = run_scenario(sc, name, repeat_check=False, stop_on_failure=True)
    assert not res.passed
    f = res.first_failure
    assert f.step == want, res.to_markdown()
    if name != "mutant-padding-writer":
        assert f.row in sc.active_rows
    assert f.check != "exception"


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_mutants_fail_on_a_random_schedule_too(family):
    sc = Scenario.tiny(family, mode="s16a16", schedule="per-row", steps=30, seed=11)
    for name in MUTANTS:
        if "speculative" not in MUTANTS[name].decodes:
            continue
        res = run_scenario(sc, name, repeat_check=False, stop_on_failure=True)
        assert not res.passed, name
        want = first_bad_step(name, sc)
        if want is not None and name != "mutant-low-precision-state":
            assert res.first_failure.step == want, name
