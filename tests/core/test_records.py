"""The record module (replayssm/records): records built by :class:`Recorder` satisfy the schema
file and the id rule; ``append`` writes whole lines; a refused ``--record`` path changes nothing.

Oracle: ``replayssm/records/record.schema.json`` itself (the jsonschema Draft 2020-12 validator),
and the id rule recomputed here with hashlib over the canonical JSON.
"""

import hashlib
import json
import os
import subprocess
import sys
import threading

import pytest

from replayssm import records as R
from replayssm.guard import EnvironmentProblem, check_record_path

PROV = dict(commit="0123456789ab", dirty=False, device_info_={"kind": "cpu", "name": "test cpu", "driver": None},
            versions_={"python": "3", "torch": "2", "triton": "3", "replayssm": "0.1.0"})


def _rec(**kw):
    return R.Recorder("validate", **PROV).record("mamba2/triton-replay/s32a16/tiny/exhaustive",
                                                 metrics={"tokens_per_s": 5.0, "worst bound_ratio": 0.1},
                                                 verdict="pass", config={"seed": 0}, **kw)


def test_a_record_satisfies_the_schema_file_and_the_id_rule():
    rec = _rec(family="mamba2", kernel="triton-replay", mode="s32a16", geometry="tiny")
    assert R.errors(rec) == []
    body = json.dumps({k: v for k, v in rec.items() if k != "id"}, sort_keys=True, separators=(",", ":"))
    assert rec["id"] == hashlib.sha256(body.encode()).hexdigest()[:16]
    assert rec["config_digest"] == hashlib.sha256(b'{"seed":0}').hexdigest()[:16]
    assert set(R.schema()["required"]) <= set(rec)


@pytest.mark.parametrize("change, where", [
    ({"verdict": "ok"}, "verdict"), ({"job": "lunch"}, "job"), ({"commit": "HEAD"}, "commit"),
    ({"device": {"kind": "tpu", "name": "x"}}, "device/kind"), ({"surprise": 1}, "(record)"),
    ({"metrics": {"x": {"nested": 1}}}, "metrics/x"), ({"created": "yesterday"}, "created"),
], ids=["verdict", "job", "commit", "device-kind", "extra-field", "nested-metric", "created"])
def test_the_validator_refuses_what_the_schema_refuses(change, where):
    rec = {**_rec(), **change}
    rec["id"] = R.record_id(rec)
    bad = R.errors(rec)
    assert bad and any(b.startswith(where) for b in bad), bad
    with pytest.raises(R.RecordError):
        R.validate(rec)


def test_a_changed_record_no_longer_matches_its_id():
    rec = {**_rec(), "verdict": "fail"}
    assert any(b.startswith("id:") for b in R.errors(rec))


def test_non_finite_metrics_are_kept_as_words():
    metrics = {"a": float("inf"), "b": float("nan"), "c": [1.0, -float("inf")]}
    rec = R.Recorder("drift", **PROV).record("c", metrics=metrics, verdict="none")
    assert rec["metrics"] == {"a": "inf", "b": "nan", "c": [1.0, "-inf"]}


def test_append_writes_one_line_per_record_and_load_reads_them(tmp_path):
    path = tmp_path / "sub" / "r.jsonl"
    recs = [_rec(), _rec(reason="again")]
    assert R.append(path, recs) == 2
    assert R.append(path, [_rec()]) == 1
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(x)["schema"] == R.SCHEMA_ID for x in lines)
    assert R.load(path)[:2] == recs


def test_append_refuses_an_invalid_record_before_writing_any(tmp_path):
    path = tmp_path / "r.jsonl"
    R.append(path, [_rec()])
    before = path.read_bytes()
    with pytest.raises(R.RecordError):
        R.append(path, [_rec(), {**_rec(), "verdict": "maybe"}])
    assert path.read_bytes() == before


def test_concurrent_appends_leave_whole_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    recs = [_rec(reason="x" * 5000)] * 20
    threads = [threading.Thread(target=R.append, args=(path, recs)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(R.load(path)) == 80


def test_load_names_the_file_and_line_of_a_bad_record(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_rec()) + "\n{not json\n")
    with pytest.raises(R.RecordError, match=r"r\.jsonl:2: not JSON"):
        R.load(path)
    assert len(R.load(path, strict=False)) == 1


def test_a_record_path_under_a_file_is_refused_naming_the_flag(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(EnvironmentProblem, match="--record"):
        check_record_path(tmp_path / "f" / "r.jsonl")
    with pytest.raises(EnvironmentProblem, match="--record"):
        check_record_path(tmp_path)
    check_record_path(tmp_path / "new" / "r.jsonl")
    assert not (tmp_path / "new").exists()


def test_git_state_sees_the_commit_and_the_environment_override(monkeypatch):
    commit, _dirty = R.git_state()
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                          cwd=os.path.dirname(R.__file__))
    if head.returncode == 0:
        assert commit == head.stdout.strip()
    monkeypatch.setenv("REPLAYSSM_COMMIT", "ABCDEF1234")
    assert R.git_state() == ("abcdef1234", False)
    monkeypatch.setenv("REPLAYSSM_COMMIT", "not-a-commit")
    assert R.git_state() == ("unknown", True)
    assert R.describe_commit("abc1234", True) == "abc1234+uncommitted"


def test_provenance_of_this_machine_is_schema_valid():
    rec = R.Recorder("bench").record("x", metrics={}, verdict="none")
    assert rec["device"]["kind"] == "cpu" and rec["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
