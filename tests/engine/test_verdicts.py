"""Three verdicts: pass, marginal, fail; ``--strict``; the exit codes; the fuzzer past a marginal.

Oracle: the tolerance rule's bound (validators/engine/checks/tolerance_rule.py) and the marginal band
``tolerances.MARGINAL_FACTOR`` (docs/validation.md, "Verdicts").  The test double is the Mamba-2
literal baseline with a deliberately perturbed rounding: every state it stores is scaled by
``1 + eps`` (in fp64, then rounded to the state format: a biased rounding of about eps / u_fp32 ulps).
At s32a32 on the tiny scenario below its state error is 1.03 x the bound with eps = 0.87e-6 (inside
the band: a marginal; 0.80e-6 gives 0.98 x, a pass) and 5.8 x with eps = 5e-6 (a failure); with no band
(``marginal_factor=1``) the first fails too.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import Phase

from replayssm import cli, registry
from replayssm.precision import parse_mode
from replayssm.records import Recorder, errors
from replayssm.records.jobs import fuzz_records, validate_record
from replayssm.registry import get
from replayssm.scenarios import Scenario
from replayssm.validators import Lockstep, run_scenario
from replayssm.validators.engine.fuzz_artifacts import load_failure
from replayssm.validators.engine.result import ValidationResult
from replayssm.validators.engine.tolerances import MARGINAL_FACTOR, MARGINAL_FACTOR_SR, marginal_factor
from replayssm.validators.jobs.fuzz import run as fuzz

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = {"max_steps": 4, "max_rows": 2, "max_dim": 4, "modes": ("s32a32",)}


def _double(eps: float, name: str):
    base = get("literal-baseline", "mamba2")

    class PerturbedRounding(base):
        """The literal baseline storing ``s (1 + eps)`` where it stores ``s``."""

        def _store_state(self, slot, s, target, target_scale):
            super()._store_state(slot, (s.double() * (1 + eps)).to(s.dtype), target, target_scale)

    PerturbedRounding.name = name
    return PerturbedRounding


MARGINAL = _double(0.87e-6, "marginal-double")
FAILING = _double(5e-6, "failing-double")


def _scenario():
    return Scenario.tiny("mamba2", "speculative", mode="s32a32", steps=6, initial_state="random")


@pytest.fixture
def doubles(monkeypatch):
    for cls in (MARGINAL, FAILING):
        monkeypatch.setitem(registry._REGISTRY, ("mamba2", cls.name), cls)


def test_the_band_sits_below_the_weakest_gallery_catch_and_is_off_with_stochastic_rounding():
    # gdn mutant-low-precision-state at si8a16 (1.093 x), mamba2 mutant-int8-truncation (1.116 x): tolerances.py
    assert 1.0 < MARGINAL_FACTOR < 1.093
    assert marginal_factor(parse_mode("s32a16")) == MARGINAL_FACTOR
    assert marginal_factor(parse_mode("s16a16-sr")) == MARGINAL_FACTOR_SR == 1.0
    ls = Lockstep(Scenario.tiny("mamba2", "speculative", mode="s16a16-sr", steps=2), "literal-replay")
    ls.fail(0, "state", "just above", row=0, value=1.001, bound=1.0)
    assert ls.failure_counts == {"state": 1} and not ls.marginals


def test_an_error_just_above_the_bound_is_marginal_and_strict_fails_it():
    res = run_scenario(_scenario(), MARGINAL, repeat_check=False)
    assert res.verdict == "marginal", res.to_markdown()
    assert res.passed and res.ok() and not res.ok(strict=True)
    assert not res.failures and res.marginal_counts == {"state": len(res.marginals)} and res.marginals
    m = res.margin
    assert m["check"] == "state" and 1.0 < m["ratio"] <= MARGINAL_FACTOR and m["step"] >= 0 and m["row"] is not None
    assert res.headline().startswith("MARGINAL ") and "--strict" in res.headline()
    assert f"{m['ratio']:.3f} x the bound" in res.margin_line() and "Marginal errors" in res.to_markdown()
    back = ValidationResult.from_dict(json.loads(res.to_json()))
    assert back.verdict == "marginal" and back.margin == m and len(back.marginals) == len(res.marginals)


def test_without_the_band_the_same_error_fails():
    res = run_scenario(_scenario(), MARGINAL, repeat_check=False, marginal_factor=1.0)
    assert res.verdict == "fail" and not res.passed and res.first_failure.check == "state"


def test_an_error_beyond_the_band_fails():
    res = run_scenario(_scenario(), FAILING, repeat_check=False)
    assert res.verdict == "fail" and res.margin["ratio"] > MARGINAL_FACTOR and res.first_failure.check == "state"


def test_a_correct_kernel_passes_with_its_margin_below_one():
    res = run_scenario(_scenario(), "literal-baseline", repeat_check=False)
    assert res.verdict == "pass" and not res.marginals and res.margin is not None and res.margin["ratio"] <= 1.0
    assert res.headline().startswith("PASS ")


def test_only_banded_checks_have_a_band():
    ls = Lockstep(_scenario(), "literal-replay")
    ls.fail(0, "state", "just above", row=0, value=1.01, bound=1.0)
    ls.fail(0, "flush-checkpoint", "just above", row=0, value=1.01, bound=1.0)
    ls.fail(1, "output", "beyond", row=0, value=MARGINAL_FACTOR * 1.01, bound=1.0)
    ls.fail(2, "flush-increment", "not banded", row=0, value=1.01, bound=1.0)
    assert ls.marginal_counts == {"state": 1, "flush-checkpoint": 1}
    assert ls.failure_counts == {"output": 1, "flush-increment": 1}
    with pytest.raises(ValueError, match="marginal_factor"):
        Lockstep(_scenario(), "literal-replay", marginal_factor=0.5)


def _run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("kernel,strict,code,word", [
    ("marginal-double", False, 0, "MARGINAL"), ("marginal-double", True, 1, "MARGINAL"),
    ("failing-double", False, 1, "FAIL"), ("literal-baseline", True, 0, "PASS")],
    ids=["marginal", "marginal-strict", "fail", "pass-strict"])
def test_validate_exit_codes(capsys, tmp_path, doubles, kernel, strict, code, word):
    rec, scenario = tmp_path / "r.jsonl", tmp_path / "sc.json"
    _scenario().save(scenario)
    got, out = _run(capsys, "validate", "--kernel", kernel, "--scenario", scenario, "--no-repeat",
                    "--out", tmp_path / "o", "--record", rec, *(["--strict"] if strict else []))
    assert got == code, out
    assert out.splitlines()[0].startswith(word), out
    assert "margin: worst " in out
    (r,) = [json.loads(x) for x in rec.read_text().splitlines()]
    assert errors(r) == [] and r["verdict"] == word.lower()
    if word == "MARGINAL":
        assert "--strict: a failure" in out if strict else "--strict: a failure" not in out
        assert r["metrics"]["marginals"] > 0 and 1 < r["metrics"]["margin_ratio"] <= MARGINAL_FACTOR
        assert r["reason"].startswith("margin: worst")


def test_the_exit_contract_says_what_a_marginal_returns():
    assert "marginal" in cli.EXIT_CONTRACT and "--strict makes it 1" in cli.EXIT_CONTRACT


def test_the_fuzzer_records_a_marginal_and_keeps_searching(tmp_path, monkeypatch):
    seen = []
    real = fuzz.target

    def spy(value, label=""):
        seen.append((label, value))
        return real(value, label=label)

    monkeypatch.setattr(fuzz, "target", spy)
    # every error above the bound is in the band: each scenario is at worst marginal
    r = fuzz.fuzz_kernel(FAILING, "mamba2", max_examples=4, strategy=SMALL, failures_dir=tmp_path,
                         marginal_factor=1e9, profile="dev", seed=3)
    assert not r.caught and r.examples == 4 and r.marginals >= 1, r.summary()
    assert r.summary().startswith("MARGINAL ") and r.marginal_examples[0]["ratio"] > 1
    assert r.marginal_artifact is not None and r.marginal_artifact.name == "mamba2-failing-double-marginal.json"
    sc, rec = load_failure(r.marginal_artifact)
    assert rec.check == "state" and rec.note.startswith("marginal: ")
    assert [lab for lab, _ in seen] == [fuzz.TARGET_LABEL] * r.examples
    assert max(v for _, v in seen) == pytest.approx(r.worst_ratio)
    (record,) = fuzz_records(Recorder("fuzz", commit="0" * 12, dirty=False), [r])
    assert record["verdict"] == "marginal" and record["metrics"]["marginals"] == r.marginals


def test_strict_fuzzing_stops_at_a_marginal(tmp_path):
    r = fuzz.fuzz_kernel(FAILING, "mamba2", max_examples=4, strategy=SMALL, failures_dir=tmp_path,
                         marginal_factor=1e9, strict=True, shrink_budget_examples=2)
    assert r.caught and r.record.check == "state" and r.record.note.startswith("marginal: "), r.summary()


def test_the_example_database_is_replayed(tmp_path):
    db = tmp_path / "db"
    first = fuzz.fuzz_kernel("mutant-no-commit", "mamba2", max_examples=5, example_db=db, shrink_budget_examples=3)
    assert first.caught and any((db / "mamba2" / "mutant-no-commit").rglob("*"))
    replay_only = {"phases": (Phase.reuse,)}  # no generation: a catch can only come from the database
    again = fuzz.fuzz_kernel("mutant-no-commit", "mamba2", example_db=db, overrides=replay_only)
    assert again.caught and again.examples_to_first_failure == 1
    fresh = fuzz.fuzz_kernel("mutant-no-commit", "mamba2", example_db=tmp_path / "empty", overrides=replay_only)
    assert not fresh.caught and fresh.examples == 0 and "no scenario ran" in fresh.notes[0]


def test_fuzz_cli_strict_and_example_db(capsys, tmp_path):
    db = tmp_path / "db"
    code, out = _run(capsys, "fuzz", "--kernel", "mutant-no-commit", "--family", "mamba2", "--max-examples", "3",
                     "--failures", tmp_path / "f", "--example-db", db, "--strict", "--json", tmp_path / "r.json")
    assert code == 1 and "marginals fail" in out, out
    (rep,) = json.loads((tmp_path / "r.json").read_text())
    assert rep["strict"] is True and rep["caught"] and rep["worst_ratio"] > 1
    assert any((db / "mamba2" / "mutant-no-commit").rglob("*"))


def test_validate_record_of_a_marginal_result():
    res = run_scenario(_scenario(), MARGINAL, repeat_check=False)
    rec = validate_record(Recorder("validate", commit="0" * 12, dirty=False), res)
    assert rec["verdict"] == "marginal" and rec["metrics"]["margin_check"] == "state"
