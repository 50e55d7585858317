"""Red team: every bad input a new user tries, refused by the exit-code contract with one line naming
the flag or field, and nothing under ``--out`` changed.

Oracle: the contract of ``replayssm.cli`` (README "Exit codes"): 2 bad usage or input, 3 environment
(a user module that fails to import, an unwritable output, no device, a run that would not fit in
memory); one line on stderr, no traceback; the files under the output folder have the same sha256
before and after the refused call.  Every call is in-process and refused before any work.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from replayssm.cli import EXIT_ENV, EXIT_USAGE, main
from replayssm.cli_guard import output_lock
from replayssm.scenarios import Scenario

pytestmark = pytest.mark.usefixtures("one_thread")

NO_CUDA = not torch.cuda.is_available()


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def env(tmp_path):
    """Files the cases point at: an output folder with a file in it, a regular file (a parent that is
    not a folder), a module with a syntax error, a binary file, scenario files."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "earlier.json").write_text('{"kept": true}\n')
    (tmp_path / "afile").write_text("not a folder\n")
    (tmp_path / "syntax_error.py").write_text("def broken(:\n")
    (tmp_path / "raises.py").write_text("raise RuntimeError('user module exploded')\n")
    (tmp_path / "binary.bin").write_bytes(b"\xff\xfe\x00\x81binary")
    (tmp_path / "only_family.json").write_text('{"family": "gdn"}\n')
    d = json.loads(Scenario.tiny("mamba2", schedule="random").to_json())
    d["schedule_params"] = {"k_weights": [float("inf"), 1, 1, 1]}
    (tmp_path / "inf_weights.json").write_text(json.dumps(d))
    return tmp_path


def _sub(env: Path, text: str) -> str:
    return text.replace("{T}", str(env))


VALIDATE = ["validate", "--kernel", "literal-replay", "--out", "{T}/out"]
DRIFT = ["drift", "--families", "mamba2", "--modes", "s32a32", "--schedules", "standard", "--no-progress",
         "--out", "{T}/out"]
FUZZ = ["fuzz", "--kernel", "literal-replay", "--family", "mamba2", "--max-examples", "1", "--failures", "{T}/out"]

CASES = [
    # exit 3: environment
    ("import-syntax-error", [*VALIDATE, "--import", "{T}/syntax_error.py"], EXIT_ENV, "--import"),
    ("import-raises", ["list", "--import", "{T}/raises.py"], EXIT_ENV, "--import"),
    ("import-no-module", [*DRIFT, "--import", "no_such_module_replayssm_xyz"], EXIT_ENV, "--import"),
    ("validate-out-under-a-file", ["validate", "--kernel", "literal-replay", "--out", "{T}/afile/sub"], EXIT_ENV,
     "--out"),
    ("validate-save-scenario-under-a-file", [*VALIDATE, "--save-scenario", "{T}/afile/s.json"], EXIT_ENV,
     "--save-scenario"),
    ("validate-steps-1e9", [*VALIDATE, "--steps", "1000000000"], EXIT_ENV, "--steps"),
    ("drift-tokens-1e9", [*DRIFT, "--tokens", "1e9"], EXIT_ENV, "--tokens"),
    ("drift-out-under-a-file", [*DRIFT[:-1], "{T}/afile/x"], EXIT_ENV, "--out"),
    ("drift-write-budgets-under-a-file", [*DRIFT, "--write-budgets", "{T}/afile/b.toml"], EXIT_ENV,
     "--write-budgets"),
    ("fuzz-json-under-a-file", [*FUZZ, "--json", "{T}/afile/r.json"], EXIT_ENV, "--json"),
    ("fuzz-failures-under-a-file", [*FUZZ[:-1], "{T}/afile/f"], EXIT_ENV, "--failures"),
    ("bench-json-under-a-file", ["bench", "--json", "{T}/afile/b.json"], EXIT_ENV, "--json"),
    ("validate-no-cuda", [*VALIDATE, "--device", "cuda"], EXIT_ENV, "--device", "no-cuda"),
    ("drift-no-cuda", [*DRIFT, "--device", "cuda"], EXIT_ENV, "--device", "no-cuda"),
    ("bench-no-cuda", ["bench"], EXIT_ENV, "CUDA", "no-cuda"),
    # exit 2: bad usage or input
    ("import-missing-file", [*VALIDATE, "--import", "{T}/does_not_exist.py"], EXIT_USAGE, "--import"),
    ("validate-no-kernel", ["validate", "--out", "{T}/out"], EXIT_USAGE, "--kernel"),
    ("validate-unknown-kernel", ["validate", "--kernel", "nope", "--out", "{T}/out"], EXIT_USAGE, "nope"),
    ("validate-bad-mode", [*VALIDATE, "--precision", "s99a16"], EXIT_USAGE, "scenario.mode"),
    ("validate-bad-device", [*VALIDATE, "--device", "tpu"], EXIT_USAGE, "--device"),
    ("validate-option-no-value", [*VALIDATE, "--kernel-option", "route"], EXIT_USAGE, "--kernel-option"),
    ("validate-option-typo", ["validate", "--kernel", "triton-replay", "--kernel-option", "prepas=false",
                              "--out", "{T}/out"], EXIT_USAGE, "prepas"),
    ("validate-prepass-on-literal", [*VALIDATE, "--kernel-option", "prepass=false"], EXIT_USAGE, "prepass"),
    ("validate-literal-every-negative", [*VALIDATE, "--literal-every", "-1"], EXIT_USAGE, "--literal-every"),
    ("validate-state-every-zero", [*VALIDATE, "--state-every", "0"], EXIT_USAGE, "--state-every"),
    ("validate-invariants-every-zero", [*VALIDATE, "--invariants-every", "0"], EXIT_USAGE, "--invariants-every"),
    ("validate-threads-zero", [*VALIDATE, "--threads", "0"], EXIT_USAGE, "--threads"),
    ("validate-steps-zero", [*VALIDATE, "--steps", "0"], EXIT_USAGE, "--steps"),
    ("validate-window-text", [*VALIDATE, "--window", "four"], EXIT_USAGE, "--window"),
    ("scenario-only-family", [*VALIDATE, "--scenario", "{T}/only_family.json"], EXIT_USAGE, "missing"),
    ("scenario-binary", [*VALIDATE, "--scenario", "{T}/binary.bin"], EXIT_USAGE, "binary.bin"),
    ("scenario-missing-file", [*VALIDATE, "--scenario", "{T}/nope.json"], EXIT_USAGE, "nope.json"),
    ("scenario-inf-k-weights", [*VALIDATE, "--scenario", "{T}/inf_weights.json"], EXIT_USAGE, "k_weights"),
    ("drift-tokens-64", [*DRIFT, "--tokens", "64"], EXIT_USAGE, "--tokens"),
    ("drift-checkpoint-every-negative", [*DRIFT, "--checkpoint-every", "-1"], EXIT_USAGE, "--checkpoint-every"),
    ("drift-budget-factor", [*DRIFT, "--budget-factor", "0.5"], EXIT_USAGE, "--budget-factor"),
    ("drift-budget-zero", [*DRIFT, "--budget", "0"], EXIT_USAGE, "--budget"),
    ("drift-alpha", [*DRIFT, "--alpha", "2"], EXIT_USAGE, "--alpha"),
    ("drift-deadline", [*DRIFT, "--deadline", "-5"], EXIT_USAGE, "--deadline"),
    ("drift-workers-zero", [*DRIFT, "--workers", "0"], EXIT_USAGE, "--workers"),
    ("drift-rows-zero", [*DRIFT, "--rows", "0"], EXIT_USAGE, "--rows"),
    ("drift-window-one", [*DRIFT, "--window", "1"], EXIT_USAGE, "--window"),
    ("drift-history-below-window", [*DRIFT, "--history", "3"], EXIT_USAGE, "--history"),
    ("drift-budgets-binary", [*DRIFT, "--check", "--budgets", "{T}/binary.bin"], EXIT_USAGE, "binary.bin"),
    ("drift-bad-mode", [*DRIFT, "--modes", "s32a99"], EXIT_USAGE, "--modes"),
    ("drift-bad-shard", [*DRIFT, "--shard", "2/2"], EXIT_USAGE, "shard"),
    ("fuzz-max-examples-zero", [*FUZZ, "--max-examples", "0"], EXIT_USAGE, "--max-examples"),
    ("fuzz-budget-negative", [*FUZZ, "--budget-s", "-1"], EXIT_USAGE, "--budget-s"),
    ("fuzz-unknown-kernel", ["fuzz", "--kernel", "nope", "--failures", "{T}/out"], EXIT_USAGE, "nope"),
    ("fuzz-bad-mode", [*FUZZ, "--modes", "s32a99"], EXIT_USAGE, "--modes"),
    ("fuzz-empty-modes", [*FUZZ, "--modes", ","], EXIT_USAGE, "--modes"),
    ("fuzz-unsupported-modes", ["fuzz", "--kernel", "triton-replay", "--family", "mamba2", "--modes", "s64a64",
                                "--failures", "{T}/out"], EXIT_USAGE, "supports none"),
    ("bench-batches-zero", ["bench", "--batches", "0"], EXIT_USAGE, "--batches"),
    ("list-unknown-family", ["list", "--family", "nope"], EXIT_USAGE, "nope"),
    ("unknown-subcommand", ["frobnicate"], EXIT_USAGE, "invalid choice"),
]


def _params():
    for name, argv, code, needle, *cond in CASES:
        marks = [pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is present")] if cond else []
        yield pytest.param(argv, code, needle, id=name, marks=marks)


@pytest.mark.parametrize("argv,code,needle", list(_params()))
def test_refused_with_one_line_and_nothing_changed(env, capsys, argv, code, needle):
    argv = [_sub(env, a) for a in argv]
    before = _tree(env)
    got = main(argv)
    err = capsys.readouterr().err
    assert got == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    assert _tree(env) == before


def test_debug_prints_the_traceback(env, capsys):
    assert main([*[_sub(env, a) for a in VALIDATE], "--import", f"{env}/raises.py", "--debug"]) == EXIT_ENV
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("replayssm: environment: --import")


def test_every_help_states_the_contract_and_import(capsys):
    for sub in ("list", "validate", "fuzz", "drift", "bench"):
        with pytest.raises(SystemExit):
            main([sub, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert "3 environment" in out and "--import" in out, sub


@pytest.mark.parametrize("sub", ["validate", "drift"])
def test_a_second_writer_of_one_output_is_refused(env, capsys, sub):
    argv = [_sub(env, a) for a in (VALIDATE if sub == "validate" else DRIFT)]
    with output_lock(env / "out", "--out"):
        before = _tree(env)
        assert main(argv) == EXIT_ENV
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--out" in err and "another replayssm process" in err
        assert _tree(env) == before
