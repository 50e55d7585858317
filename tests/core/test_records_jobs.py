"""``--record FILE`` on every job: the records each job appends validate against the schema file
(``replayssm/records/record.schema.json``) and carry the numbers and verdict the job reported; a
``--record`` path that cannot be written is refused before any work (exit 3 naming ``--record``).

Oracle: the schema (jsonschema) and the job's own printed verdict / exit code, at tiny settings
(Triton through the interpreter on the CPU).
"""

from __future__ import annotations

import json

import pytest

from replayssm import cli
from replayssm.records import errors

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def _records(path):
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert recs and all(errors(r) == [] for r in recs), [errors(r) for r in recs]
    return recs


@pytest.mark.parametrize("kernel, verdict", [("literal-replay", "pass"), ("mutant-no-commit", "fail")])
def test_validate_records_its_verdict_and_worst_ratios(capsys, tmp_path, kernel, verdict):
    path = tmp_path / "rec" / "r.jsonl"
    code, out = _run(capsys, "validate", "--kernel", kernel, "--steps", "6", "--out", tmp_path / "o", "--threads", "1",
                     "--record", path)
    assert code == (0 if verdict == "pass" else 1), out
    (rec,) = _records(path)
    assert rec["job"] == "validate" and rec["verdict"] == verdict
    assert rec["case"] == f"mamba2/{kernel}/s32a16/tiny/exhaustive"
    assert rec["metrics"]["steps_run"] >= 1 and rec["metrics"]["tokens_per_s"] > 0
    if verdict == "pass":
        assert rec["metrics"]["failures"] == 0 and 0 <= rec["metrics"]["worst_bound_ratio"] <= 1
    else:
        assert rec["metrics"]["failures"] > 0 and rec["reason"]
    assert rec["source"].startswith("replayssm validate --kernel")


def test_fuzz_records_one_record_per_kernel(capsys, tmp_path):
    path = tmp_path / "r.jsonl"
    code, out = _run(capsys, "fuzz", "--kernel", "literal-replay", "--family", "mamba2", "--max-examples", "2",
                     "--failures", tmp_path / "f", "--record", path)
    assert code == 0, out
    (rec,) = _records(path)
    assert rec["case"] == "mamba2/literal-replay/fuzz-ci" and rec["verdict"] == "pass"
    assert rec["metrics"]["examples"] >= 1 and rec["metrics"]["caught"] is False


def test_drift_records_each_cell_and_the_sweep(capsys, tmp_path):
    path = tmp_path / "r.jsonl"
    code, out = _run(capsys, "drift", "--families", "mamba2", "--kernels", "literal-replay", "--modes", "s32a32",
                     "--schedules", "standard", "--scenarios", "long-memory", "--tokens", "256", "--rows", "1",
                     "--workers", "1", "--device", "cpu", "--no-progress", "--check", "--out", tmp_path / "d",
                     "--record", path)
    assert code == 0, out
    cell, sweep = _records(path)
    report = json.loads((tmp_path / "d" / "drift_report.json").read_text())
    assert cell["case"] == "mamba2/literal-replay/s32a32/tiny/long-memory/standard" and cell["verdict"] == "pass"
    assert cell["metrics"]["output_peak"] == report["cells"][0]["output"]["peak"]
    assert cell["metrics"]["state_bits_eff"] == report["cells"][0]["state"]["effective_precision"]["bits_eff"]
    assert sweep["case"] == "drift/sweep/mamba2=tiny/1x256" and sweep["verdict"] == "none"
    assert sweep["metrics"]["tokens"] == 256 and sweep["metrics"]["tokens_per_s"] > 0


def test_golden_verify_records_each_trajectory(capsys, tmp_path):
    path = tmp_path / "r.jsonl"
    code, out = _run(capsys, "golden", "verify", "--record", path)
    assert code == 0, out
    recs = _records(path)
    assert all(r["case"].startswith("golden/") and r["verdict"] == "pass" for r in recs)
    assert all(r["metrics"]["max_rel_difference"] <= r["metrics"]["tolerance"] for r in recs)
    assert len({r["case"] for r in recs}) == len(recs) >= 2


JOBS = {
    "validate": ["validate", "--kernel", "literal-replay", "--steps", "2"],
    "fuzz": ["fuzz", "--kernel", "literal-replay", "--max-examples", "1"],
    "drift": ["drift", "--families", "mamba2", "--kernels", "literal-replay", "--modes", "s32a32", "--schedules",
              "standard", "--scenarios", "mild", "--tokens", "128", "--rows", "1", "--device", "cpu", "--no-progress"],
    "bench": ["bench"],
    "golden": ["golden", "verify"],
}


@pytest.mark.parametrize("job", sorted(JOBS))
def test_an_unwritable_record_path_is_refused_before_work(capsys, tmp_path, job):
    (tmp_path / "file").write_text("x")
    argv = [*JOBS[job], "--record", tmp_path / "file" / "r.jsonl"]
    if job in ("validate", "drift"):
        argv += ["--out", tmp_path / "out"]
    if job == "fuzz":
        argv += ["--failures", tmp_path / "fail"]
    code, out = _run(capsys, *argv)
    assert code == 3 and "--record" in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing created, no work done


def test_golden_regenerate_takes_no_record(capsys, tmp_path):
    code, out = _run(capsys, "golden", "regenerate", "--dir", tmp_path / "g", "--record", tmp_path / "r.jsonl")
    assert code == 2 and "--record" in out and not (tmp_path / "g").exists()
