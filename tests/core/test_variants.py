"""Legitimate literal variants pass the tolerance rule: it is not calibrated on one operation order.

Oracle: the variants registered beside the literal models (decay weights as running products,
as exp of differences of cumulative sums of A Δ; GDN's in-window solve by stepping the
delta rule) are correct implementations; the rule (``validators/engine/checks/tolerance_rule.py``:
the larger of 2x the literal model's error and the fp64 arithmetic bound, + floor) must pass
each.  The cumulative-sum variant exceeds 2x the literal model's error (the false alarm of
issue 15, measured 12.4x at s32a16 before the envelope), so the envelope is what passes it.
The sweep behind the constants (every variant x s32a32 / s32a16 / s16a16 x five distributions
x three schedules, 20 steps: worst 0.50 of the bound) is in ``validators/engine/checks/fp64_bound.py``.
"""

from __future__ import annotations

import pytest

from replayssm.families import family_names
from replayssm.registry import kernels
from replayssm.scenarios import Scenario
from replayssm.validators import Lockstep, run_scenario

pytestmark = pytest.mark.usefixtures("one_thread")

VARIANTS = [(f, n) for (f, n) in kernels() if n.startswith("literal-replay-") and n != "literal-replay-state"]


def test_each_family_registers_variants():
    assert {f for f, _ in VARIANTS} == set(family_names())
    assert ("mamba2", "literal-replay-cumsum-exp") in VARIANTS and ("gdn", "literal-replay-recurrent") in VARIANTS
    assert ("kda", "literal-replay-cumprod") in VARIANTS and ("kda", "literal-replay-recurrent") in VARIANTS


@pytest.mark.parametrize("family,name", VARIANTS, ids=[f"{f}-{n}" for f, n in VARIANTS])
@pytest.mark.parametrize("mode,dist", [("s32a32", "large-delta"), ("s32a16", "fast-forget")], ids=lambda v: str(v))
def test_legitimate_variants_pass(family, name, mode, dist):
    sc = Scenario.tiny(family, "speculative", mode=mode, distribution=dist, steps=12, initial_state="random")
    res = run_scenario(sc, name, repeat_check=False)
    assert res.passed, res.to_markdown()


def test_the_cumsum_variant_needs_more_than_twice_the_literal_error():
    sc = Scenario.tiny("mamba2", "speculative", mode="s32a16", distribution="large-delta", steps=12,
                       initial_state="random")
    ls = Lockstep(sc, "literal-replay-cumsum-exp")
    ratios = []
    for _ in range(len(ls.plans)):
        ls.step()
        ref = ls.ref.index_select(0, ls.active_idx)
        err = [(x.committed_state(ls.ids).index_select(0, ls.active_idx) - ref).abs().amax().item()
               for x in (ls.kernel, ls.literal)]
        ratios.append(err[0] / err[1])
    assert not ls.failures, ls.failures[:1]
    assert max(ratios) > 2.0, ratios
