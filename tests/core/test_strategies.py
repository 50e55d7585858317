"""The Hypothesis strategies draw valid, replayable scenarios covering what the fuzzer must reach.

Oracle: the Scenario constructor's own checks (every drawn value must pass them), its JSON
round trip, and the schedule's plan (the explicit schedule must replay the drawn counts
exactly); coverage is checked by drawing many scenarios and counting features.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayssm.families import geometry_from_dict
from replayssm.interface import PAD_SLOT, DecodeConfig, geometry_reason
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
from replayssm.validators.engine.runner import run_scenario
from replayssm.validators.jobs.fuzz.run import fuzz_settings


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


class _WideKeysOnly(get("literal-replay", "gdn")):
    """literal-replay declaring a key-dimension limit, as vLLM's GDN replay kernels do (K >= 9)."""

    name = "literal-replay-wide-keys"

    @classmethod
    def unsupported_geometry(cls, geometry):
        return None if geometry.head_k_dim >= 9 else f"K >= 9, got K = {geometry.head_k_dim}"


@fuzz_settings(max_examples=25)
@given(scenarios(kernel=_WideKeysOnly, max_steps=4, max_dim=4))
def test_drawn_geometries_are_ones_the_kernel_supports(sc):
    assert sc.geometry_obj.head_k_dim >= 9  # with max_dim 4 only the tiny preset (K = 16) remains


class _WideKeysSpeculative(get("literal-replay", "gdn")):
    """literal-replay declaring a key-dimension limit for speculative decode only (a limit that takes
    the decode, as vLLM's Mamba-2 speculative kernel's dstate >= 9)."""

    name = "literal-replay-wide-keys-spec"

    @classmethod
    def unsupported_geometry(cls, geometry, decode=None):
        if decode is not None and decode.speculative and geometry.head_k_dim < 9:
            return f"speculative: K >= 9, got K = {geometry.head_k_dim}"
        return None


@fuzz_settings(max_examples=25)
@given(scenarios(kernel=_WideKeysSpeculative, max_steps=4, max_dim=4))
def test_a_limit_that_takes_the_decode_is_drawn_per_decode(sc):
    assert sc.decode == "standard" or sc.geometry_obj.head_k_dim >= 9


def test_geometry_reason_passes_the_decode_where_the_override_takes_it():
    k4 = geometry_from_dict({"family": "gdn", "num_k_heads": 1, "num_v_heads": 1, "head_k_dim": 4, "head_v_dim": 4})
    spec, std = DecodeConfig(decode="speculative", window=2, buffer=2), DecodeConfig()
    assert geometry_reason(_WideKeysSpeculative, k4, spec) == "speculative: K >= 9, got K = 4"
    assert geometry_reason(_WideKeysSpeculative, k4, std) is None
    assert geometry_reason(_WideKeysOnly, k4, std) == "K >= 9, got K = 4"  # an override without decode


def test_a_run_on_an_unsupported_geometry_is_refused_before_anything_runs():
    sc = Scenario.build("gdn", decode="standard", geometry={"family": "gdn", "num_k_heads": 1, "num_v_heads": 1,
                                                           "head_k_dim": 4, "head_v_dim": 4}, steps=2)
    with pytest.raises(ValueError, match="geometry: kernel 'literal-replay-wide-keys' does not support this geometry"):
        run_scenario(sc, _WideKeysOnly)

    @settings(max_examples=1, database=None)
    @given(scenarios(kernel=_WideKeysOnly, geometry=sc.geometry))
    def draw(_sc):
        pass
    with pytest.raises(ValueError, match="does not support"):
        draw()
