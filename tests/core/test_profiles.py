"""Named device profiles (replayssm/profiles.toml, ``replayssm profile``).

Oracle: the real argument parser (``replayssm.cli.build_parser``): every replayssm step of every
profile parses on every device the profile accepts, so a profile cannot name a flag, subcommand or
device that does not exist; pytest steps name test files that exist, nox steps sessions of
noxfile.py.  A malformed profile or a refused call (unknown profile, wrong device, a step that does
not parse) is a usage error (exit 2) with nothing run.  The tiny CPU profile runs end to end.
"""

import json
import re
from pathlib import Path

import pytest

from replayssm import cli
from replayssm.cli_profile import PROFILES, Step, check_step, expand, load_profiles

ROOT = Path(__file__).resolve().parents[2]
ALL = load_profiles()
CASES = [(name, dev) for name, p in ALL.items() for dev in p.devices]


def test_profiles_file_parses_and_names_the_device_recipes():
    assert {"smoke", "side-by-side", "drift-full", "gpu-merge-tier", "findings", "adapters-fuzz",
            "bench-gate"} <= set(ALL)
    for p in ALL.values():
        assert p.description and p.steps


@pytest.mark.parametrize("name,device", CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_every_step_parses_with_the_real_parser(name, device):
    for step in ALL[name].steps:
        args = expand(step, device, "out/x", None)
        assert not any("{" in a for a in args), (step.label, args)  # every placeholder filled
        if step.kind == "replayssm":
            check_step(step, args)
            assert device in args or "--device" not in args
        elif step.kind == "pytest":
            paths = [a for a in args if a.startswith("tests/")]
            assert all((ROOT / p.split("::")[0]).exists() for p in paths), paths
            markers = [args[i + 1] for i, a in enumerate(args) if a == "-m"]
            assert all(set(re.findall(r"[a-z_]+", m)) <= {"gpu", "slow", "bench", "not", "and", "or"} for m in markers)
        else:
            session = args[args.index("-s") + 1]
            assert re.search(rf"^def {session}\(", (ROOT / "noxfile.py").read_text(), re.M), session


def test_record_is_passed_to_replayssm_steps_only():
    step = Step("replayssm", ("validate", "--device", "{device}"), "v")
    assert expand(step, "cpu", "o", "/r.jsonl") == ["validate", "--device", "cpu", "--record", "/r.jsonl"]
    assert expand(Step("pytest", ("-q",), "t"), "cpu", "o", "/r.jsonl") == ["-q"]


def test_a_step_naming_a_missing_flag_is_refused_by_name():
    step = Step("replayssm", ("validate", "--no-such-flag"), "bad step")
    with pytest.raises(ValueError, match="bad step.*no-such-flag"):
        check_step(step, list(step.args))


@pytest.mark.parametrize("text,match", [
    ('[p]\ndescription = "d"\ndevices = ["cpu"]\nsteps = [{replayssm = ["list"], pytest = ["-q"]}]', "exactly one"),
    ('[p]\ndescription = "d"\ndevices = ["tpu"]\nsteps = [{replayssm = ["list"]}]', "devices"),
    ('[p]\ndescription = "d"\ndevices = ["cpu"]\nsteps = []', "at least one step"),
    ('[p]\ndescription = "d"\ndevices = ["cpu"]\nscript = "x.sh"\nsteps = [{replayssm = ["list"]}]', "unknown keys"),
], ids=["two-kinds", "bad-device", "no-steps", "unknown-key"])
def test_malformed_profiles_are_refused(tmp_path, text, match):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        load_profiles(path)


@pytest.mark.parametrize("argv,message", [
    (["profile", "no-such-profile"], "unknown profile"),
    (["profile", "side-by-side", "--device", "cpu"], "--device"),
    (["profile"], "NAME"),
], ids=["unknown", "wrong-device", "no-name"])
def test_refused_calls_run_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    assert cli.main([*argv, "--out", str(out)]) == cli.EXIT_USAGE
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_the_tiny_cpu_profile_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "smoke"
    assert cli.main(["profile", "smoke", "--device", "cpu", "--out", str(out)]) == cli.EXIT_PASS
    text = capsys.readouterr().out
    assert "2 of 2 step(s) run" in text and "[validate] exit 0" in text and "[drift] exit 0" in text
    report = json.loads((out / "drift" / "drift_report.json").read_text())
    assert report["cells"] and all(c["kernel"] == "literal-replay" for c in report["cells"])
    assert any((out / "validate").iterdir())
    assert PROFILES.exists()


@pytest.mark.parametrize("flag", ["--out", "--record"])
def test_an_unwritable_output_is_refused_before_any_step(tmp_path, capsys, flag):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    target = str(blocker / "below")
    argv = ["profile", "smoke", "--device", "cpu", "--out", str(tmp_path / "out")]
    argv = [*argv[:-2], "--out", target] if flag == "--out" else [*argv, "--record", target]
    assert cli.main(argv) == cli.EXIT_ENV
    assert flag in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
