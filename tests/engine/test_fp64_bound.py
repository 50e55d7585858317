"""The fp64 running-error bound: on every step without the literal model the numerical checks still judge.

Oracle: ``validators/engine/checks/fp64_bound.py`` (a running-error analysis computed in fp64 beside the
reference).  ``literal_every=0`` used to turn every numerical check off (mutant-stale-read and
mutant-low-precision-state passed with exit 0); now both fail, while the literal models, judged
by the same bound, stay well below it (the full measurement is in the module's docstring).
"""

from __future__ import annotations

import pytest

from replayssm.scenarios import Scenario
from replayssm.validators import run_scenario

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("mutant,family,mode", [
    ("mutant-stale-read", "mamba2", "s32a16"),
    ("mutant-stale-read", "gdn", "s32a16"),
    ("mutant-low-precision-state", "mamba2", "s32a16"),
    ("mutant-low-precision-state", "mamba2", "s32a32"),
], ids=lambda v: str(v))
def test_literal_every_zero_still_catches_the_field_bugs(mutant, family, mode):
    sc = Scenario.tiny(family, "speculative", mode=mode, steps=10)
    res = run_scenario(sc, mutant, literal_every=0, repeat_check=False)
    assert not res.passed, res.to_markdown()
    assert res.first_failure.check in ("output", "state", "flush-checkpoint"), res.to_markdown()
    assert "fp64 running-error bound" in res.first_failure.message


@pytest.mark.parametrize("kernel", ["literal-replay", "literal-baseline"])
@pytest.mark.parametrize("decode,schedule", [("speculative", "exhaustive"), ("standard", "always-1")],
                         ids=["spec", "std"])
@pytest.mark.parametrize("family,mode,dist", [("mamba2", "s32a32", "large-delta"), ("gdn", "s32a16", "mild"),
                                              ("mamba2", "s16a16", "near-fp16-limit")],
                         ids=lambda v: str(v))
def test_literal_models_stay_within_the_fp64_bound(family, mode, dist, decode, schedule, kernel):
    sc = Scenario.tiny(family, decode, mode=mode, distribution=dist, schedule=schedule, steps=12,
                       initial_state="random")
    res = run_scenario(sc, kernel, literal_every=0, repeat_check=False)
    assert res.passed, res.to_markdown()
    worst = max(res.summary.get("worst bound_ratio", 0.0), res.summary.get("worst state_bound_ratio", 0.0))
    # measured <= 0.31 over 30 steps, all distributions (fp64_bound.py); 0.5 leaves room, not slack
    assert 0 < worst < 0.5, res.summary
