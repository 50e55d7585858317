"""The Hypothesis strategies draw valid, replayable scenarios covering what the fuzzer must reach.

Oracle: the Scenario constructor's own checks (every drawn value must pass them), its JSON
round trip, and the schedule's plan (the explicit schedule must replay the drawn counts
exactly); coverage is checked by drawing many scenarios and counting features.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayssm.interface import PAD_SLOT, DecodeConfig
from replayssm.precision import parse_mode
from replayssm.registry import get
from replayssm.scenarios.scenario import Scenario
from replayssm.scenarios.schedules import plan
from replayssm.scenarios.strategies import (
    accepted_plans,
    batch_layouts,
    decode_configs,
    geometries,
    precision_modes,
    scenarios,
)
from replayssm.validators.fuzz import fuzz_settings


@fuzz_settings(max_examples=60)
@given(scenarios())
def test_drawn_scenarios_are_valid_and_round_trip(sc):
    assert Scenario.from_json(sc.to_json()) == sc
    steps = plan(sc)
    acc = sc.schedule_params["accepted"]
    assert [p.accepted for p in steps] == acc
    lo = 0 if sc.decode == "speculative" else 1  # k = 0: every draft rejected (zero_accept "noop")
    for p in steps:
        for r, k in enumerate(p.accepted):
            pad = sc.resolved_slot_ids[r] == PAD_SLOT
            hi = sc.window if p.window_lens is None else p.window_lens[r]
            assert (k == 0) if pad else (lo <= k <= hi)
    for step, row, origin in sc.schedule_params.get("resets", []):
        assert row in steps[step].reset_rows
        assert steps[step].reset_origins[steps[step].reset_rows.index(row)] == origin


@fuzz_settings(max_examples=40)
@given(st.data())
def test_modes_respect_what_the_kernel_supports(data):
    cls = get("literal-baseline", "gdn")  # refuses tf32 readouts
    dec = data.draw(decode_configs())
    mode = data.draw(precision_modes(cls, dec))
    assert cls.unsupported_reason(parse_mode(mode), dec, {}) is None


def test_coverage_of_150_draws():
    seen = {"decode": set(), "mode": set(), "distribution": set(), "pad": False, "reset": False,
            "groups>1": False, "origin>0": False, "long": False, "preset": False}

    @settings(max_examples=150, database=None, derandomize=True, deadline=None)
    @given(scenarios())
    def draw(sc):
        seen["decode"].add(sc.decode)
        seen["mode"].add(sc.mode)
        seen["distribution"].add(sc.distribution)
        seen["pad"] |= PAD_SLOT in sc.resolved_slot_ids
        seen["reset"] |= bool(sc.schedule_params.get("resets"))
        g = sc.geometry
        seen["preset"] |= isinstance(g, str)
        if isinstance(g, dict):
            seen["groups>1"] |= g.get("ngroups", g.get("num_k_heads", 1)) > 1
        seen["origin>0"] |= any(o > 0 for o in sc.resolved_origins)
        seen["long"] |= len(sc.schedule_params["accepted"]) >= 32

    draw()
    assert seen["decode"] == {"speculative", "standard"}
    assert len(seen["mode"]) >= 10 and len(seen["distribution"]) == 6
    assert all(seen[k] for k in ("pad", "reset", "groups>1", "origin>0", "long", "preset")), seen


def test_bad_strategy_arguments_name_the_argument():
    with pytest.raises(ValueError, match="family"):
        geometries("rwkv")
    with pytest.raises(ValueError, match="decodes"):
        decode_configs(decodes=("medusa",))
    with pytest.raises(ValueError, match="max_rows"):
        batch_layouts(DecodeConfig(), max_rows=0)
    with pytest.raises(ValueError, match="max_steps"):
        accepted_plans(DecodeConfig(), (0,), max_steps=0)
    with pytest.raises(ValueError, match="modes"):
        precision_modes(get("literal-baseline", "gdn"), DecodeConfig(), modes=("s32a16-tf32",))
