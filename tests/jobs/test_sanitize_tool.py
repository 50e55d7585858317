"""tools/sanitize.py (``nox -s sanitize``): the compute-sanitizer runs it makes and how it reads their verdict.

Oracle: compute-sanitizer prints ``========= ERROR SUMMARY: N errors`` per process; a run passes
only with every summary at 0 and validate's exit code 0.  The runs themselves need a GPU (the
session skips without one); here only the command lines and the parsing, on the CPU.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from replayssm.records import Recorder
from replayssm.records.provenance import device_info
from replayssm.records.record import validate

spec = importlib.util.spec_from_file_location("sanitize", Path(__file__).resolve().parents[2] / "tools" / "sanitize.py")
sanitize = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sanitize)


def test_the_error_summary_is_summed_over_processes_and_missing_is_none():
    assert sanitize.errors_of("========= ERROR SUMMARY: 0 errors\n") == 0
    assert sanitize.errors_of("========= ERROR SUMMARY: 2 errors\nx\n========= ERROR SUMMARY: 1 error\n") == 3
    assert sanitize.errors_of("Traceback (most recent call last):") is None


def test_each_run_is_one_small_cuda_validate_under_the_named_tool(tmp_path):
    cmd = sanitize.command("initcheck", "gdn", "triton-replay", "standard", tmp_path)
    assert cmd[:3] == ["compute-sanitizer", "--tool", "initcheck"] and "--error-exitcode" in cmd
    tail = cmd[cmd.index("validate"):]
    assert tail[tail.index("--device") + 1] == "cuda" and tail[tail.index("--kernel") + 1] == "triton-replay"
    assert set(sanitize.DEFAULT) >= {"mamba2:triton-replay", "gdn:triton-baseline", "kda:triton-replay"}
    assert "--precision" not in cmd
    moded = sanitize.command("memcheck", "mamba2", "vllm-replay", "speculative", tmp_path, "s32a16-tf32")
    assert moded[moded.index("--precision") + 1] == "s32a16-tf32"


def _fake(script: str):
    return lambda tool, family, kernel, decode, out, mode=None: [sys.executable, "-c", script]


@pytest.mark.parametrize("script,passed,errors", [
    ("print('========= ERROR SUMMARY: 0 errors')", True, 0),
    ("print('========= ERROR SUMMARY: 2 errors'); raise SystemExit(99)", False, 2),
    ("import time; time.sleep(30)", False, None),
], ids=["clean", "errors", "timeout"])
def test_a_run_is_judged_by_exit_code_and_summary_and_stopped_at_its_timeout(monkeypatch, tmp_path, script, passed,
                                                                              errors):
    monkeypatch.setattr(sanitize, "command", _fake(script))
    run = sanitize.one_run("memcheck", "gdn", "triton-replay", "standard", tmp_path, dict(os.environ), 3.0)
    assert run["passed"] is passed and run["errors"] == errors
    assert ("--timeout" in run["tail"]) is (script.startswith("import time"))


def test_each_finished_run_is_kept_in_the_summary_and_recorded(monkeypatch, tmp_path):
    monkeypatch.setattr(sanitize, "command", _fake("print('========= ERROR SUMMARY: 0 errors')"))
    monkeypatch.setattr(sanitize.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(sanitize, "Recorder", functools.partial(Recorder, device_info_=device_info("cpu", 1)))
    rec = tmp_path / "rec.jsonl"
    assert sanitize.main(["gdn:triton-replay", "--out", str(tmp_path / "o"), "--record", str(rec)]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert len(summary["runs"]) == 4 and summary["failed"] == 0
    records = [json.loads(line) for line in rec.read_text().splitlines()]
    for r in records:
        validate(r)
    assert {r["case"] for r in records} == {f"gdn/triton-replay/{d}/{t}" for d in sanitize.DECODES
                                           for t in sanitize.TOOLS}
    assert all(r["job"] == "sanitize" and r["verdict"] == "pass" for r in records)


def test_a_bad_timeout_is_refused_before_any_run(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sanitize.shutil, "which", lambda name: "/usr/bin/" + name)
    assert sanitize.main(["--timeout", "0", "--out", str(tmp_path / "o")]) == 2
    assert "--timeout" in capsys.readouterr().err and not (tmp_path / "o").exists()
