"""Every case docs/calibration.md's resolving-power tables state is re-run: a claimed catch is caught, an unresolved
loss is stated unresolved (validators/jobs/calibration.py, ``replayssm calibrate --resolving``).

Oracle: the claims are the ledger's newest ``resolving/<family>/<loss>/<mode>`` records, the ones the doc's
tables are rendered from (the first test holds the doc to their rendering, the second the records to the
calibration's case list and settings).  Each case re-runs the same scenarios the calibration runs
(``resolving_scenarios``: every input distribution x the speculative ``exhaustive`` and standard ``random``
schedules, the record's steps and seed, ``tiny``, random initial state) and judges a catch as it does
(``catches``: a failed check; a marginal or an exception is none unless raising is the mutant's bug).

* a resolved case: every check of its ``caught_by`` fails the loss in some scenario (the quick run stops at
  the scenario where the last of them first does); the slow run also asserts the set of catching checks, the
  scenarios each caught and the checks that saw the loss only as a marginal equal the record's;
* an unresolved case: ``replayssm calibrate --resolving`` on it runs every scenario, no check fails the loss,
  it exits 1 and reports ``unresolved``, and its record is a ``fail`` whose reason says so (never a pass).

Quick run (``./dev test``): one mode per family and loss (its first unresolved mode, else its first ``-tf32``
mode, the dots issue 47 found switching the state checks off); the other cases are ``slow`` (``nox -s
tests_slow``).  Expected: every claim holds on CPU; the quick subset takes ~10 s on one thread.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from replayssm.cli import main
from replayssm.records import Recorder, load
from replayssm.records.jobs import resolving_records
from replayssm.scenarios.inputs import DISTRIBUTIONS
from replayssm.validators.engine.result import Failure, ValidationResult
from replayssm.validators.engine.runner import run_scenario
from replayssm.validators.jobs import calibration
from replayssm.validators.jobs.calibration import (
    LOSSES,
    RESOLVING_MODES,
    RESOLVING_SCHEDULES,
    catches,
    latest_records,
    loss_class,
    raising_is_its_bug,
    render_tables,
    resolving_cases,
    resolving_power,
    resolving_scenarios,
    update_doc,
)

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
LEDGER = ROOT / "docs" / "reports" / "ledger.jsonl"
DOC = ROOT / "docs" / "calibration.md"
RECORDS = load(LEDGER)
CLAIMS = [r for case, r in sorted(latest_records(RECORDS).items()) if case.startswith("resolving/")]
LOSS = {x.name: x for x in LOSSES}
REC = {"commit": "abcdef0", "dirty": False, "device_info_": {"kind": "cpu", "name": "test"},
       "versions_": {"python": "3", "torch": "2", "replayssm": "0"}}


def _quick(claims) -> set[str]:
    """Per family and loss, the record of its first unresolved mode, else of its first -tf32 mode."""
    out = set()
    for fam, loss in sorted({(r["family"], r["config"]["loss"]) for r in claims}):
        mine = sorted((r for r in claims if (r["family"], r["config"]["loss"]) == (fam, loss)),
                      key=lambda r: (r["metrics"]["resolved"], not r["mode"].endswith("-tf32"),
                                     RESOLVING_MODES.index(r["mode"])))
        out.add(mine[0]["id"])
    return out


QUICK = _quick(CLAIMS)


def _params(resolved: bool):
    return [pytest.param(r, id=f"{r['family']}-{r['config']['loss']}-{r['mode']}",
                         marks=() if r["id"] in QUICK else pytest.mark.slow)
            for r in CLAIMS if r["metrics"]["resolved"] is resolved]


def test_the_docs_tables_are_the_rendering_of_the_ledgers_records():
    text = DOC.read_text()
    assert update_doc(text, RECORDS) == text, "run replayssm calibrate --render docs/calibration.md"
    assert {r["id"] for r in CLAIMS} <= set(re.findall(r"\[rec:([0-9a-f]+)\]", text))


def test_the_records_are_the_cases_the_calibration_runs_with_its_settings():
    cases = {(fam, loss.name, mode) for fam, loss, _, mode in resolving_cases()}
    claimed = {(r["family"], r["config"]["loss"], r["mode"]) for r in CLAIMS}
    assert claimed == cases, (sorted(cases - claimed), sorted(claimed - cases))
    for r in CLAIMS:
        st = r["config"]["settings"]
        assert (st["geometry"], st["distributions"], st["schedules"]) == (
            "tiny", sorted(DISTRIBUTIONS), [f"{d}/{s}" for d, s in RESOLVING_SCHEDULES]), r["case"]
        assert r["verdict"] == ("pass" if r["metrics"]["resolved"] else "fail"), r["case"]
        assert bool(r["metrics"]["caught_by"]) is r["metrics"]["resolved"], r["case"]
    assert any(r["id"] in QUICK and not r["metrics"]["resolved"] for r in CLAIMS)  # the quick run states one


def _setting(r: dict, key: str):
    return r["config"]["settings"][key]


@pytest.mark.parametrize("rec", _params(True))
def test_each_claimed_check_catches_the_loss(rec, request):
    fam, loss, mode = rec["family"], LOSS[rec["config"]["loss"]], rec["mode"]
    cls = loss_class(loss, fam)
    claimed = set(rec["metrics"]["caught_by"])
    full = request.node.get_closest_marker("slow") is not None
    scenarios = resolving_scenarios(fam, cls, mode, _setting(rec, "steps"), _setting(rec, "seed"))
    assert len(scenarios) == rec["metrics"]["scenarios"], rec["case"]
    per: dict[str, int] = {}
    marginal: set[str] = set()
    for sc in scenarios:
        res = run_scenario(sc, cls, repeat_check=False)
        for c in catches(res, raising_is_its_bug(loss)):
            per[c] = per.get(c, 0) + 1
        marginal |= set(res.marginal_counts)
        if not full and claimed <= set(per):
            break
    assert claimed <= set(per), f"{rec['case']} ({rec['id']}): claimed {sorted(claimed)}, caught by {sorted(per)}"
    if full:
        m = rec["metrics"]
        assert set(per) == claimed, f"{rec['case']}: caught by {sorted(per)}, the record says {sorted(claimed)}"
        assert per == {c: m["scenarios_" + c.replace("-", "_")] for c in claimed}, rec["case"]
        assert sorted(marginal - set(per)) == m.get("marginal_by", []), rec["case"]


@pytest.mark.parametrize("rec", _params(False))
def test_each_unresolved_loss_is_stated_unresolved(rec, tmp_path, capsys):
    fam, loss, mode = rec["family"], rec["config"]["loss"], rec["mode"]
    out = tmp_path / "resolving.json"
    code = main(["calibrate", "--resolving", "--families", fam, "--losses", loss, "--modes", mode,
                 "--steps", str(_setting(rec, "steps")), "--seed", str(_setting(rec, "seed")), "--json", str(out)])
    assert code == 1, f"{rec['case']}: an unresolved loss must exit 1"
    assert "unresolved" in capsys.readouterr().out
    rep = json.loads(out.read_text())
    (case,) = rep["cases"]
    assert case["verdict"] == "unresolved" and case["caught_by"] == [] and case["scenarios_caught"] == 0, case
    assert case["scenarios"] == rec["metrics"]["scenarios"], case
    assert sorted(case["marginal"]) == rec["metrics"].get("marginal_by", []), case
    (again,) = resolving_records(Recorder("calibration", **REC), rep)
    assert again["verdict"] == "fail" and again["reason"].startswith("unresolved"), again
    assert rec["verdict"] == "fail" and rec["reason"].startswith("unresolved"), rec
    row = next(line for line in render_tables([rec]).splitlines() if f"rec:{rec['id']}" in line)
    assert "**unresolved**" in row and "no check failed" in row, row


def test_a_marginal_is_reported_and_is_no_catch(monkeypatch):
    """Runs that fail ``state`` and see ``output`` (and, once, ``state``) within the band: ``output`` is
    reported as marginal only, no catch, in the case, its record and the table."""
    def fake(sc, cls, **kw):
        res = ValidationResult(cls.name, sc.family, sc.mode, {})
        res.failures = [Failure(3, "state", "x", value=2.0, bound=1.0)]
        res.failure_counts = {"state": 1}
        res.marginals = [Failure(5, "output", "x", value=1.02, bound=1.0), Failure(1, "state", "x", value=1.01,
                                                                                   bound=1.0)]
        res.marginal_counts = {"output": 1, "state": 1}
        return res

    monkeypatch.setattr(calibration, "run_scenario", fake)
    rep = resolving_power(["gdn"], modes=["s32a16"], losses=["state-one-lower"], steps=2)
    (case,) = rep["cases"]
    assert case["caught_by"] == ["state"] and case["verdict"] == "resolved"
    assert case["marginal"] == {"output": {"scenarios": case["scenarios"], "steps": 6, "ratio": pytest.approx(1.02)}}
    (rec,) = resolving_records(Recorder("calibration", **REC), rep)
    assert rec["metrics"]["marginal_by"] == ["output"] and rec["metrics"]["caught_by"] == ["state"]
    assert f"marginal only: `output` ({case['scenarios']} scenarios, ratio 1.02)" in render_tables([rec])
