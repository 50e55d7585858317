"""KDA is judged by every shared mutant that applies to it (issue 47 item 5).

Oracle: the mutant registry (validators/engine/mutants/) and the family's declared mechanisms
(``Family.capabilities``): every mutant that is not another family's own slip and whose ``needs`` KDA
has is registered on KDA; each that the CI gallery does not fuzz on KDA fails, on KDA, the named
scenario docs/field_bugs.md gives it (the other families' runs: tests/engine/test_serving.py,
tests/engine/test_seams.py, tests/engine/test_red_team.py, tests/jobs/test_mutation_gallery.py), with
the check named there first.  Expected: no shared mutant missing; every run fails as named.
"""

from __future__ import annotations

import pytest

from replayssm.families import families
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.mutants import all_mutants
from replayssm.validators.engine.runner import run_scenario

pytestmark = pytest.mark.usefixtures("one_thread")

ZERO_ACCEPT = {"schedule": "zero-accept", "steps": 4, "schedule_params": {"zero_prob": 0.5}}
# mutant -> (Scenario.tiny overrides, the checks that may catch it first), as for the family each was fuzzed or named on
NAMED = {
    "mutant-reset-none-keeps-state": ({"schedule": "exhaustive"}, ("state",)),
    "mutant-zero-accept-commits-drafts": (ZERO_ACCEPT, ("zero-accept",)),
    "mutant-zero-accept-reads-draft-minus-1": (ZERO_ACCEPT, ("zero-accept",)),
    "mutant-accepted-for-compacted-rows": ({"schedule": "per-row", "steps": 4}, ("cursor",)),
    "mutant-recycled-slot-keeps-state": (
        {"schedule": "slot-reuse", "steps": 12, "schedule_params": {"reset_prob": 0.3, "poison": "large"}}, ("state",)),
    "mutant-padding-lane-writes": ({"schedule": "ragged", "steps": 3}, ("window-tail",)),
    "mutant-nonspec-reads-draft-slot-0": ({"schedule": "ragged", "steps": 12}, ("state",)),
    "mutant-packed-window-overrun": (
        {"schedule": "ragged", "steps": 4, "schedule_params": {"layout": "packed"}}, ("padding-output",)),
    "mutant-host-cursors-stale": ({"schedule": "per-row", "steps": 4}, ("state",)),
    "mutant-out-assumes-contiguous": ({"schedule_params": {"layout": "views"}}, ("view-gaps",)),
    "mutant-slot-ids-unit-stride": ({"schedule_params": {"layout": "views"}}, ("unused-slot",)),
    "mutant-input-rescaled-in-place": ({}, ("inputs-unchanged",)),
    "mutant-accepted-clamped": ({}, ("accepted-range",)),
    "mutant-padding-count-commits": ({}, ("unused-slot",)),
    "mutant-unwritten-slab-adopted": ({"poison_allocations": "nan"}, ("non-finite",)),
    "mutant-staged-fold-kept-at-zero": ({**ZERO_ACCEPT, "steps": 16}, ("staged-fold",)),
    "mutant-next-verify-fold-skipped": ({}, ("flush-checkpoint",)),
    "mutant-materialize-off-by-one": ({"schedule_params": {"publish": 1.0}}, ("materialize",)),
    "mutant-materialize-rewrites-source": ({"schedule_params": {"publish": 1.0}}, ("materialize",)),
    "mutant-transposed-state": ({"geometry": "tiny-square"}, ("state",)),
    "mutant-sr-stale-seed": ({"decode": "standard", "mode": "sfp8a16-sr", "buffer": 1, "schedule": "always-1",
                              "steps": 120, "distribution": "long-memory"},
                             ("flush-checkpoint", "flush-increment", "state")),
}


def test_every_shared_mutant_whose_mechanism_kda_has_applies_to_kda():
    kda = families()["kda"]
    own = {m.name for f in families().values() for m in f.mutants}
    missing = [n for n, s in all_mutants().items() if n not in own and set(s.needs) <= kda.capabilities
               and "kda" not in s.classes]
    assert not missing, missing
    assert {n for n, s in all_mutants().items() if "kda" in s.classes and not s.fuzzed("kda")} == set(NAMED)


# sr-stale-seed's 120 steps and transposed-state (its KDA run is in tests/engine/test_seams.py too) in the slow tier.
SLOW = {"mutant-sr-stale-seed", "mutant-transposed-state"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(NAMED)])
def test_a_shared_mutant_not_fuzzed_on_kda_fails_its_named_scenario_there(name):
    overrides, checks = NAMED[name]
    kw = dict(overrides)
    poison = kw.pop("poison_allocations", None)
    res = run_scenario(Scenario.tiny("kda", **kw), all_mutants()[name].classes["kda"], poison_allocations=poison)
    assert not res.passed and res.first_failure.check in checks, res.to_markdown()
