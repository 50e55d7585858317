"""The jobs at the mixer level (validators/jobs/mixer/): fuzz, drift, bench, their command lines, the
pytest plugin's ``level="mixer"``; on CPU at tiny shapes.

Oracles: the mixer runner (fp64 whole step, literal mixer's tolerance rule, conv window bit for bit):
each field-report mutant is caught by the ``ci`` fuzz profile and a correct mixer passes; the drift
run counts a dropped conv rollback as inexact commits and keeps a correct mixer's conv exact and
its errors under the gross bound; the bench's table has its shape (no assertion on time).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from replayssm.cli import main
from replayssm.interface import PAD_SLOT
from replayssm.mixer.spec import mixer_preset
from replayssm.validators.engine.mixer.mutants import MUTANTS
from replayssm.validators.engine.mixer.runner import MixerPlan, default_plan, validate_mixer
from replayssm.validators.engine.mixer.scenario import MixerScenario, load_scenario
from replayssm.validators.jobs.mixer.bench import CONV_BYTES, bench_mixer, mixer_step_bytes
from replayssm.validators.jobs.mixer.drift import MixerDriftConfig, drift_mixer
from replayssm.validators.jobs.mixer.fuzz import fuzz_mixer
from replayssm.validators.pytest_plugin import assert_kernel_valid


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_ci_profile_catches_each_mixer_mutant(mutant, tmp_path):
    r = fuzz_mixer(mutant, profile="ci", shrink_budget_examples=5, failures_dir=tmp_path)
    assert r.caught, r.summary()
    assert r.failure.check in ("conv-state", "mixer-output", "ssm-state"), r.summary()
    sc, kernel = load_scenario(r.artifact)
    assert kernel == mutant and not sc.run(mutant).passed  # the reproducer replays the failure


@pytest.mark.parametrize("policy", ["lazy-offset", "circular"])
def test_correct_mixer_passes_a_short_ci_run(policy):
    r = fuzz_mixer(f"mixer-literal-{policy}", profile="ci", max_examples=4)
    assert not r.caught and r.examples == 4, r.summary()


def test_plan_with_resets_and_slot_reuse_passes_and_bad_plans_are_refused():
    plan = MixerPlan(2, 3, 4, (((0, PAD_SLOT), (3, 0)), ((1, 0), (2, 1)), ((0,), (3,))), ((), (0,), (0, 1)))
    assert validate_mixer("mixer-literal-draft-snapshots", mixer_preset("tiny", "gdn"), "s32a32", plan).passed
    assert MixerPlan.from_dict(plan.to_dict()) == plan
    with pytest.raises(ValueError, match=r"resets\[0\]"):
        MixerPlan(2, 3, 4, (((0,), (1,)),), ((5,),))
    with pytest.raises(ValueError, match=r"steps\[0\]"):
        MixerPlan(2, 3, 4, (((0,), (4,)),))


def test_drift_correct_mixer_conv_exact_and_errors_small():
    res = drift_mixer("mixer-literal-lazy-offset", MixerDriftConfig("gdn", "s32a32", tokens=96, rows=2))
    assert res["passed"], res["failures"]
    assert res["conv"]["inexact"] == 0 and res["conv"]["commits"] == res["steps"] * 2
    for what in ("output", "state"):
        assert math.isfinite(res[what]["peak"]) and res[what]["peak"] < 1e-5
    json.dumps(res)


def test_drift_reports_a_dropped_conv_rollback():
    res = drift_mixer("mutant-conv-no-rollback", MixerDriftConfig("mamba2", "s32a32", tokens=64))
    assert not res["passed"] and res["conv"]["inexact"] > 0
    assert res["failures"][0].startswith("conv-state:")


def test_bench_table_shape_and_bytes_model():
    res = bench_mixer("mixer-literal-circular", "mamba2", batches=(1, 2), window=4, reps=1, log=lambda *_: None)
    assert res["checked"] and [(r["k"], r["batch"]) for r in res["rows"]] == [(4, 1), (4, 2), (2, 1), (2, 2)]
    assert all(r["bytes"] > 0 and r["us"] > 0 for r in res["rows"])
    dec = default_plan(4, window=4).decode
    by = {p: mixer_step_bytes("mamba2", "tiny", "s32a16", dec, 4, p) for p in CONV_BYTES}
    assert by["circular"] < by["lazy-offset"] < by["compact-at-commit"] < by["draft-snapshots"]


def test_cli_fuzz_drift_bench_level_mixer(tmp_path, capsys):
    f = tmp_path / "f"
    assert main(["fuzz", "--level", "mixer", "--kernel", "mutant-conv-unwritten-snapshot", "--max-examples", "5",
                 "--failures", str(f), "--json", str(tmp_path / "fz.json")]) == 1
    [art] = f.glob("mixer-*-mutant-conv-unwritten-snapshot.json")
    assert main(["validate", "--level", "mixer", "--scenario", str(art), "--out", str(tmp_path / "v")]) == 1
    assert main(["fuzz", "--level", "mixer", "--kernel", "mixer-literal-compact-at-commit", "--max-examples", "2",
                 "--modes", "s32a32", "--failures", str(f)]) == 0
    assert main(["drift", "--level", "mixer", "--tokens", "128", "--out", str(tmp_path / "d"),
                 "--record", str(tmp_path / "d.jsonl")]) == 0
    runs = json.loads((tmp_path / "d" / "mixer_drift.json").read_text())["runs"]
    assert [(r["kernel"], r["family"], r["tokens"]) for r in runs] == [("mixer-literal-compact-at-commit", "mamba2",
                                                                        128)]
    assert json.loads((tmp_path / "d.jsonl").read_text())["verdict"] == "pass"
    assert main(["bench", "--level", "mixer", "--kernel", "mixer-literal-lazy-offset", "--batches", "1",
                 "--rep-ms", "1", "--json", str(tmp_path / "b.json")]) == 0
    assert "| k | batch |" in capsys.readouterr().out


@pytest.mark.parametrize("argv,flag", [
    (["fuzz", "--level", "mixer", "--strict"], "--strict"),
    (["fuzz", "--level", "mixer", "--shard", "1/2"], "--shard"),
    (["drift", "--level", "mixer", "--schedules", "standard"], "--schedules"),
    (["bench", "--level", "mixer", "--spec-batches", "4"], "--spec-batches"),
    (["bench", "--kernel", "mixer-literal-circular"], "--kernel"),
], ids=["fuzz-strict", "fuzz-shard", "drift-schedules", "bench-spec-batches", "bench-kernel-ssm-level"])
def test_cli_refuses_flags_the_mixer_level_does_not_read(argv, flag, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"error: {flag}:" in err[0]


def test_pytest_plugin_takes_a_mixer_kernel(tmp_path, replayssm_validate):
    res = assert_kernel_valid("mixer-literal-circular", level="mixer", family="kda", out_dir=tmp_path)
    assert res.passed and res.family == "kda" and (tmp_path / "mixer-literal-circular-kda-mixer.json").is_file()
    sc = MixerScenario("gdn", "s32a16", default_plan(4, steps=6))
    with pytest.raises(AssertionError) as e:
        replayssm_validate("mutant-conv-count-clamped", sc, level="mixer")
    msg = str(e.value)
    assert msg.startswith("Mixer kernel 'mutant-conv-count-clamped' is not valid for gdn at precision s32a16")
    assert "[conv-state]" in msg and '"level": "mixer"' in msg
    with pytest.raises(ValueError, match="repeat_check"):
        assert_kernel_valid("mixer-literal-circular", level="mixer", repeat_check=False)
