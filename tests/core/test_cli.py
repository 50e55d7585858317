"""The ``replayssm`` command: list, validate, exit codes, files written, one-line usage errors.

Oracle: the issue's contract: exit 0 pass, 1 mismatch (first bad step named), 2 usage error
with a one-line message naming the bad field; result JSON + Markdown written; throughput printed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from replayssm import cli
from replayssm.guard import LOCK_NAME

pytestmark = pytest.mark.usefixtures("one_thread")


def run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("family", ["gdn", "mamba2"])
def test_validate_literal_exhaustive_passes(capsys, tmp_path, family):
    code, out, err = run(capsys, "validate", "--kernel", "literal-replay", "--family", family, "--precision", "s16a16",
                         "--schedule", "exhaustive", "--out", str(tmp_path), "--threads", "1")
    assert code == 0, out + err
    assert out.startswith(f"PASS literal-replay [{family}, s16a16]")
    assert "tokens/s" in out and "throughput:" in out
    files = sorted(p.name for p in tmp_path.iterdir() if p.name != LOCK_NAME)
    assert len(files) == 2 and files[0].endswith(".json") and files[1].endswith(".md")
    d = json.loads((tmp_path / files[0]).read_text())
    assert d["passed"] and d["scenario"]["schedule"] == "exhaustive" and d["tokens_per_s"] > 0


@pytest.mark.parametrize("kernel,step", [("mutant-no-commit", 0), ("mutant-padding-writer", 0)])
def test_validate_mutant_exits_1_naming_the_step(capsys, tmp_path, kernel, step):
    code, out, _ = run(capsys, "validate", "--kernel", kernel, "--family", "gdn", "--precision", "s16a16",
                       "--out", str(tmp_path), "--stop-on-failure", "--no-repeat")
    assert code == 1
    assert out.startswith(f"FAIL {kernel}") and f"first failure at step {step}" in out


def test_scenario_file_round_trip_and_override(capsys, tmp_path):
    scen = tmp_path / "s.json"
    code, _, _ = run(capsys, "validate", "--kernel", "literal-replay", "--family", "mamba2", "--decode", "standard",
                     "--schedule", "random", "--steps", "6", "--save-scenario", str(scen), "--out", str(tmp_path))
    assert code == 0 and json.loads(scen.read_text())["decode"] == "standard"
    code, out, _ = run(capsys, "validate", "--kernel", "literal-baseline", "--scenario", str(scen), "--steps", "4",
                       "--precision", "s32a32", "--out", str(tmp_path))
    assert code == 0 and "[mamba2, s32a32]: 4 steps" in out


@pytest.mark.parametrize("change,field", [
    ({"window": 6, "buffer": 4}, "scenario.buffer"),
    ({"steps": -1}, "scenario.steps"),
    ({"colour": "red"}, "scenario.colour"),
    ({"rows": "three"}, "scenario.rows"),
    ({"schedule": "fixed", "schedule_params": {"k": 9}}, "scenario.schedule_params"),
])
def test_bad_scenario_file_exits_2_naming_the_field(capsys, tmp_path, change, field):
    from replayssm.scenarios import Scenario
    d = json.loads(Scenario.tiny("gdn").to_json())
    d.update(change)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    code, out, err = run(capsys, "validate", "--kernel", "literal-replay", "--scenario", str(p))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and field in err


@pytest.mark.parametrize("argv,needle", [
    (["validate"], "--kernel"),
    (["validate", "--kernel", "nope"], "no kernel 'nope'"),
    (["validate", "--kernel", "literal-replay", "--precision", "s99a16"], "scenario.mode"),
    (["validate", "--kernel", "literal-replay", "--device", "tpu"], "--device"),
    (["validate", "--kernel", "literal-replay", "--kernel-option", "route"], "--kernel-option"),
    (["frobnicate"], "invalid choice"),
])
def test_usage_errors_are_one_line_exit_2(capsys, argv, needle):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_list_shows_kinds_modes_geometries_schedules(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    assert "Kernels (replay):" in out and "Kernels (baseline):" in out
    head, mutants = out.split("Broken kernels (mutants")
    assert "mutant-" not in head and "mutant-stale-read" in mutants
    for word in ("s32a16", "nano4b", "qwen35-4b", "exhaustive", "slot-reuse", "near-fp16-limit"):
        assert word in out
    code, out, _ = run(capsys, "list", "kernels", "--family", "gdn", "--json")
    info = json.loads(out)
    assert {k["family"] for k in info["kernels"]} == {"gdn"}
    assert {"replay", "baseline", "mutant"} <= {k["kind"] for k in info["kernels"]}


def test_a_broken_subcommand_module_does_not_break_the_others(capsys, monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, "replayssm.cli_no_such_module"])
    code, out, _ = run(capsys, "list", "schedules")
    assert code == 0 and "exhaustive" in out
    code, _, err = run(capsys, "no_such_module")
    assert code == 3 and "failed to import" in err


def test_entry_points_are_installed_and_run(tmp_path):
    from importlib.metadata import entry_points
    scripts = {e.name: e for e in entry_points(group="console_scripts")}
    assert scripts["replayssm"].load() is cli.main
    assert {e.name: e.value for e in entry_points(group="pytest11")}["replayssm"] == \
        "replayssm.validators.pytest_plugin"
    p = subprocess.run([sys.executable, "-m", "replayssm", "validate", "--kernel", "literal-replay", "--family", "gdn",
                        "--schedule", "random", "--steps", "3", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "PASS" in p.stdout and "tokens/s" in p.stdout
