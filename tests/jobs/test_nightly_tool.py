"""tools/nightly_fuzz.py's bookkeeping of a run spread over calls: which shards a rerun skips and
which run of a shard the merged summary keeps.

Oracle: the rule its docstrings state (skip only shards that ran every planned scenario with no
error and no failure; merge keeps the run with more scenarios, the later file on a tie)."""

import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("nightly_fuzz", Path(__file__).resolve().parents[2] / "tools" /
                                              "nightly_fuzz.py")
nightly = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nightly)


def _job(shard, scenarios, failures=0, error=False, planned=50):
    r = {"family": "gdn", "kernel": "triton-replay", "shard": shard, "seed": 100 + shard, "planned": planned,
         "scenarios": scenarios, "failures": failures, "checks": {"exception": failures} if failures else {},
         "examples_failed": [], "wall_s": 1.0}
    if error:
        r["error"] = "RuntimeError: boom"
    return r


def _part(path, jobs):
    path.write_text(json.dumps({"jobs": jobs}))
    return str(path)


def test_skip_done_skips_only_complete_clean_shards(tmp_path):
    f = _part(tmp_path / "a.json", [_job(0, 50), _job(1, 20), _job(2, 50, failures=3), _job(3, 0, error=True)])
    assert nightly.done_shards([f]) == {("gdn", "triton-replay", 0, 100)}


def test_merge_keeps_the_longer_run_and_the_later_on_a_tie(tmp_path, capsys):
    old = _part(tmp_path / "old.json", [_job(0, 50, failures=2), _job(1, 20)])
    new = _part(tmp_path / "new.json", [_job(0, 50), _job(1, 10)])
    assert nightly.main(["merge", old, new]) == 0
    k = json.loads(capsys.readouterr().out)["kernels"]["gdn/triton-replay"]
    assert (k["scenarios"], k["false_alarms"]) == (70, 0)


@pytest.mark.parametrize("argv,needle", [(["run", "--parts", "0"], "--parts: expected an integer >= 1"),
                                         (["run", "--part", "3", "--parts", "2"], "--part: expected 1 <= part")])
def test_bad_arguments_name_the_flag(argv, needle, tmp_path):
    with pytest.raises(SystemExit, match=needle):
        nightly.main([*argv, "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


_PROV = {"commit": "0b38ceafcfd4", "dirty": False, "device": {"kind": "cpu", "name": "AMD EPYC", "count": 1,
                                                            "driver": None},
         "versions": {"python": "3.11", "torch": "2.13.0+cpu", "triton": "3.9.0", "replayssm": "0.1.0", "cuda": None}}


def _part_with(path, jobs, prov=_PROV):
    path.write_text(json.dumps({"jobs": jobs, "set": "cpu", "seed": 20261201, "provenance": prov}))
    return str(path)


def test_merge_records_one_schema_valid_fuzz_record_per_kernel_with_the_parts_provenance(tmp_path, capsys):
    from replayssm.records.ledger import load

    a = _part_with(tmp_path / "a.json", [_job(0, 50), _job(1, 50, failures=1)])
    rec = tmp_path / "rec.jsonl"
    assert nightly.main(["merge", a, "--record", str(rec), "--run", "run8"]) == 0
    [r] = load(rec)
    assert (r["job"], r["case"], r["commit"], r["dirty"], r["verdict"]) == (
        "fuzz", "gdn/triton-replay/nightly", "0b38ceafcfd4", False, "fail")
    assert (r["metrics"]["scenarios"], r["metrics"]["false_alarms"], r["config"]["run"]) == (100, 1, "run8")


@pytest.mark.parametrize("prov,needle", [(None, "no provenance"), (dict(_PROV, dirty=True), "one clean commit")],
                         ids=["no-provenance", "dirty"])
def test_merge_refuses_to_record_parts_it_cannot_vouch_for(tmp_path, capsys, prov, needle):
    a = _part_with(tmp_path / "a.json", [_job(0, 50)], prov)
    rec = tmp_path / "rec.jsonl"
    with pytest.raises(SystemExit, match=needle):
        nightly.main(["merge", a, "--record", str(rec)])
    assert not rec.exists()
