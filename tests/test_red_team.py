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
    ("validate-steps-zero", [*VALIDATE, "--steps", "0"], EXIT_USAGE, "scenario.steps"),
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


# ---- issue 46: a data file never runs code; an unusable drift checkpoint is set aside ----------------------
# The planted payloads below would each create a marker file if anything imported or unpickled them.
PLANTED = "from pathlib import Path\nPath({marker!r}).write_text('planted code ran')\n"
TINY_DRIFT = ["drift", "--families", "mamba2", "--modes", "s32a32", "--schedules", "standard", "--tokens", "128",
              "--rows", "1", "--workers", "1", "--no-progress", "--checkpoint-every", "0"]


def _artifact(path: Path, module: str) -> Path:
    d = json.loads(Scenario.tiny("mamba2", schedule="random", steps=2).to_json())
    d["failure"] = {"kind": "replayssm-failure", "kernel": "planted-kernel", "family": "mamba2", "check": "state",
                    "first_bad_step": 0, "module": module}
    path.write_text(json.dumps(d))
    return path


@pytest.mark.parametrize("variant", ["absolute-path", "relative-path", "dotted-name", "with-kernel"])
def test_a_scenario_file_naming_a_module_never_imports_it(tmp_path, capsys, monkeypatch, variant):
    import sys
    marker = tmp_path / "marker"
    (tmp_path / "planted_evil_46.py").write_text(PLANTED.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # the dotted name would import if anything tried
    module = {"absolute-path": str(tmp_path / "planted_evil_46.py"), "relative-path": "planted_evil_46.py",
              "dotted-name": "planted_evil_46", "with-kernel": "planted_evil_46"}[variant]
    art = _artifact(tmp_path / "bug report.json", module)
    out = tmp_path / "out"
    argv = ["validate", "--scenario", str(art), "--out", str(out), "--quiet"]
    if variant == "with-kernel":  # a registered kernel given: the run goes ahead, the module is still ignored
        assert main([*argv, "--kernel", "literal-replay"]) == 0, capsys.readouterr().err
    else:
        assert main(argv) == EXIT_USAGE
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        import shlex
        assert f"replayssm --import {shlex.quote(module)} validate --scenario {shlex.quote(str(art))}" in err, err
        assert not out.exists()
    assert not marker.exists() and "planted_evil_46" not in sys.modules
    assert not any(m.startswith("replayssm_user_planted") for m in sys.modules)


@pytest.fixture(scope="module")
def drift_done(tmp_path_factory):
    """A finished tiny drift run: its folder and its report's bytes."""
    out = tmp_path_factory.mktemp("drift46") / "out"
    assert main([*TINY_DRIFT, "--out", str(out)]) == 0
    return out, (out / "drift_report.json").read_bytes()


def _cut_short(drift_done, tmp_path):
    """A copy of the finished run whose one cell was cut short at its start: a stopped cell and its
    (valid) checkpoint, which the next run resumes."""
    import shutil
    import time

    from replayssm.validators import drift as D
    out = tmp_path / "out"
    shutil.copytree(drift_done[0], out)
    cfg = D.SweepConfig.from_dict(json.loads((out / "config.json").read_text()))
    (spec,) = cfg.cells()[0]
    D.run_cell(spec, cfg, out, checkpoint_every_s=0.0, deadline=time.time())
    cp = D.ckpt_path(out, spec.id)
    assert cp.is_file()
    return out, spec, cp


def _resumes_clean(capsys, out, drift_done, planted: Path, extra=()):
    """The rerun completes, writes the same report as an undisturbed run, says one line naming the
    planted file, and has moved it into quarantine/."""
    (out / "drift_report.json").unlink()
    assert main([*TINY_DRIFT, "--out", str(out), *extra]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    err = [ln for ln in lines if not ln.startswith("drift: ")]  # beside the run's own summary lines
    assert len(err) == 1 and "set aside" in err[0] and str(planted) in err[0], lines
    assert (out / "drift_report.json").read_bytes() == drift_done[1]
    assert not planted.exists() and len(list((out / "quarantine").iterdir())) == 1
    return err[0]


@pytest.mark.parametrize("where", ["old-format-name", "new-format-name"])
def test_a_planted_pickle_in_a_resume_folder_is_never_unpickled(drift_done, tmp_path, capsys, where):
    import pickle

    from replayssm.validators import drift as D
    out, spec, cp = _cut_short(drift_done, tmp_path)
    marker = tmp_path / "marker"

    class Planted:
        def __init__(self, path):
            self.path = path

        def __reduce__(self):
            return (Path.write_text, (self.path, "planted pickle ran"))

    probe = tmp_path / "probe"  # the payload is live: unpickled, it writes its file
    pickle.loads(pickle.dumps(Planted(probe)))
    assert probe.exists()
    payload = pickle.dumps({"provenance": None, "x": Planted(marker)})
    planted = out / "checkpoints" / f"{spec.id}.pt" if where == "old-format-name" else cp
    if where == "old-format-name":
        cp.unlink()
    planted.write_bytes(payload)
    line = _resumes_clean(capsys, out, drift_done, planted)
    assert "pickle" in line and not marker.exists()
    assert D.cell_status(json.loads(D.cell_path(out, spec.id).read_text())) == "complete"


def _truncated(data: bytes) -> bytes:
    return data[:len(data) // 2]


def _random(data: bytes) -> bytes:
    import random
    return random.Random(46).randbytes(len(data))


def _digest_mismatch(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])  # one payload bit flipped: a well-formed file, the wrong digest


@pytest.mark.parametrize("corrupt,why,extra", [(_truncated, "truncated", ()), (_random, "foreign", ()),
                                               (_digest_mismatch, "SHA-256", ()),
                                               (_digest_mismatch, "SHA-256", ("--allow-incomplete",))],
                         ids=["truncated", "random-bytes", "digest-mismatch", "digest-mismatch-allow-incomplete"])
def test_an_unusable_checkpoint_is_set_aside_and_its_cell_recomputed(drift_done, tmp_path, capsys, corrupt, why,
                                                                      extra):
    out, spec, cp = _cut_short(drift_done, tmp_path)
    good = cp.read_bytes()
    cp.write_bytes(corrupt(good))
    line = _resumes_clean(capsys, out, drift_done, cp, extra)
    assert why in line and spec.id in line
    (kept,) = (out / "quarantine").iterdir()
    assert kept.read_bytes() == corrupt(good)  # set aside as it was, never deleted
