"""The pytest plugin: one-line validation from a kernel author's suite, assert_close-style failures.

Oracle: the plugin is a thin wrapper over run_scenario: a valid kernel passes and returns the
result, a broken one raises AssertionError naming the check, the first bad step and the bound.
"""

from __future__ import annotations

import pytest

from replayssm.ops.gdn.literal import GDNLiteralReplay
from replayssm.scenarios import Scenario
from replayssm.validators.pytest_plugin import assert_kernel_valid

pytestmark = pytest.mark.usefixtures("one_thread")


def test_fixture_is_registered_and_passes_a_valid_kernel(replayssm_validate):
    res = replayssm_validate(GDNLiteralReplay, Scenario.tiny("gdn", schedule="random", steps=8))
    assert res.passed and res.steps_run == 8


def test_default_scenario_from_the_kernel_family():
    res = assert_kernel_valid(GDNLiteralReplay, repeat_check=False)
    assert res.scenario["schedule"] == "exhaustive" and res.family == "gdn"


def test_failure_message_reads_like_assert_close(tmp_path):
    sc = Scenario.tiny("mamba2", mode="s16a16", schedule="always-T", steps=6)
    with pytest.raises(AssertionError) as e:
        assert_kernel_valid("mutant-stale-read", sc, out_dir=tmp_path, repeat_check=False)
    msg = str(e.value)
    assert msg.startswith("Kernel 'mutant-stale-read' is not valid for mamba2 at precision s16a16!")
    assert "First failure at step 1" in msg and "Greatest absolute difference" in msg and "allowed" in msg
    assert '"schedule": "always-T"' in msg
    assert len(list(tmp_path.glob("*.json"))) == 1 and len(list(tmp_path.glob("*.md"))) == 1


def test_a_name_needs_a_scenario():
    with pytest.raises(ValueError, match="scenario"):
        assert_kernel_valid("literal-replay")
