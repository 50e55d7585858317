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
from replayssm.guard import output_lock
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
    ("drift-bad-shard", [*DRIFT, "--shard", "2/2"], EXIT_USAGE, "--shard"),
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

    from replayssm.validators.jobs.drift import cells as DCells
    from replayssm.validators.jobs.drift import store as DStore
    from replayssm.validators.jobs.drift import sweep as D
    out = tmp_path / "out"
    shutil.copytree(drift_done[0], out)
    cfg = DCells.SweepConfig.from_dict(json.loads((out / "config.json").read_text()))
    (spec,) = cfg.cells()[0]
    D.run_cell(spec, cfg, out, checkpoint_every_s=0.0, deadline=time.time())
    cp = DStore.ckpt_path(out, spec.id)
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

    from replayssm.validators.jobs.drift import provenance as DProv
    from replayssm.validators.jobs.drift import store as DStore
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
    assert DProv.cell_status(json.loads(DStore.cell_path(out, spec.id).read_text())) == "complete"


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


# ================================================================================================
# Issue 46, item 5: every refusal before work.  Huge sizes are refused from an estimate (memory
# by cause, the exhaustive plan's build time) before any plan, tensor or Python object per row
# exists, so they cost nothing; output paths are probed before the run (a path whose parent is a
# regular file: tests may run as root, where permissions do not stop writes); every numeric flag
# refuses nan/inf; each message names a flag of its own subcommand; names that become file names
# are refused; the --out lock is released on every exit path.  Each case runs with the working
# directory in the tmp folder, whose files and folders must be unchanged afterwards.
# ================================================================================================

from replayssm import guard  # noqa: E402
from replayssm.validators.engine.fuzz_artifacts import FailureRecord, artifact_json  # noqa: E402

HUGE = str(10**10)
FAKE_MEMORY = 64 << 30  # the estimate's limit, the same on every machine


def _state(root: Path) -> dict[str, str]:
    """Every file (sha256) and folder under ``root``: a created empty folder counts as a change."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder")
            for p in sorted(root.rglob("*"))}


def _flags_of(sub: str) -> set[str]:
    """The option strings of subcommand ``sub`` (and the global ones every subcommand takes)."""
    from replayssm.cli import build_parser
    parser = build_parser()
    subs = next(a for a in parser._actions if a.choices and sub in a.choices).choices
    return {o for a in subs[sub]._actions for o in a.option_strings} | {"--import", "--debug", "--help"}


def _assert_names_own_flags(argv: list[str], line: str) -> None:
    import re
    sub = argv[0]
    line = re.sub(r"pip (install|download)[^;)]*", "", line)  # install hints quote pip's flags, not ours
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line))
    assert named <= _flags_of(sub), f"{sub}: the message names {sorted(named - _flags_of(sub))}: {line}"


@pytest.fixture
def env46(env, monkeypatch):
    """``env`` plus scenario files with huge sizes, a failure artifact naming a kernel with a path
    in it, a module registering such a kernel; the working directory is the tmp folder."""
    base = json.loads(Scenario.tiny("mamba2", schedule="random").to_json())
    for name, change in (("plain", {}), ("huge_slots", {"num_slots": 10**10}), ("huge_buffer", {"buffer": 10**9}),
                         ("huge_steps", {"steps": 10**10})):
        (env / f"{name}.json").write_text(json.dumps({**base, **change}))
    sc = Scenario.tiny("mamba2", schedule="random")
    rec = FailureRecord(kernel="../escaped", family="mamba2", check="output", first_bad_step=0)
    (env / "artifact_dotdot.json").write_text(artifact_json(sc, rec))
    (env / "big.json").write_bytes(b" " * ((16 << 20) + 1))
    (env / "evil_kernel.py").write_text(
        "from replayssm.registry import get, register\n"
        "class Evil(get('literal-replay', 'mamba2')):\n"
        "    name = '../evil'\n"
        "register(Evil)\n")
    monkeypatch.setattr(guard, "available_memory", lambda: FAKE_MEMORY)
    monkeypatch.chdir(env)
    return env


CASES_46 = [
    # sizes: refused from the estimate before Scenario.build (exit 3, the flag named)
    ("validate-batch-1e7", [*VALIDATE, "--batch", "10000000"], EXIT_ENV, "--batch"),
    ("validate-slots-huge", [*VALIDATE, "--slots", HUGE], EXIT_ENV, "--slots"),
    ("validate-buffer-huge-standard", [*VALIDATE, "--decode", "standard", "--buffer", HUGE], EXIT_ENV, "--buffer"),
    ("validate-window-huge", [*VALIDATE, "--schedule", "random", "--window", HUGE, "--buffer", HUGE], EXIT_ENV,
     "--window"),
    ("validate-exhaustive-plan-time", [*VALIDATE, "--buffer", "3000"], EXIT_ENV, "--buffer"),
    ("scenario-num-slots-huge", [*VALIDATE, "--scenario", "{T}/huge_slots.json"], EXIT_ENV, "scenario.num_slots"),
    ("scenario-buffer-huge", [*VALIDATE, "--scenario", "{T}/huge_buffer.json"], EXIT_ENV, "scenario.buffer"),
    ("scenario-steps-huge", [*VALIDATE, "--scenario", "{T}/huge_steps.json"], EXIT_ENV, "scenario.steps"),
    ("scenario-slots-flag-over-file", [*VALIDATE, "--scenario", "{T}/plain.json", "--slots", HUGE], EXIT_ENV,
     "--slots"),
    ("scenario-file-too-big", [*VALIDATE, "--scenario", "{T}/big.json"], EXIT_USAGE, "--scenario"),
    ("drift-rows-huge", [*DRIFT, "--rows", "100000000"], EXIT_ENV, "--rows"),
    ("drift-history-huge", [*DRIFT, "--schedules", "spec-random", "--history", HUGE], EXIT_ENV, "--history"),
    ("drift-state-samples-huge", [*DRIFT, "--state-samples", HUGE], EXIT_ENV, "--state-samples"),
    ("drift-merge-not-a-sweep", [*DRIFT, "--merge", "{T}/afile"], EXIT_USAGE, "--merge"),
    # output paths checked before the run (a parent that is a regular file)
    ("validate-out-file-parent", [*VALIDATE[:-1], "{T}/afile/out"], EXIT_ENV, "--out"),
    ("drift-write-budgets-file-parent", [*DRIFT, "--write-budgets", "{T}/afile/b.toml"], EXIT_ENV, "--write-budgets"),
    ("fuzz-failures-file-parent", [*FUZZ[:-1], "{T}/afile/f"], EXIT_ENV, "--failures"),
    ("fuzz-json-file-parent", [*FUZZ, "--json", "{T}/afile/r.json"], EXIT_ENV, "--json"),
    ("bench-against-out-file-parent", ["bench", "--against", "literal-replay", "--out", "{T}/afile/o"], EXIT_ENV,
     "--out"),
    ("golden-regenerate-dir-file-parent", ["golden", "regenerate", "--dir", "{T}/afile/g"], EXIT_ENV, "--dir"),
    # non-finite and out-of-range numbers, refused by the flag's type
    ("fuzz-budget-nan", [*FUZZ, "--budget-s", "nan"], EXIT_USAGE, "--budget-s"),
    ("fuzz-budget-inf", [*FUZZ, "--budget-s", "inf"], EXIT_USAGE, "--budget-s"),
    ("fuzz-max-examples-inf", [*FUZZ, "--max-examples", "inf"], EXIT_USAGE, "--max-examples"),
    ("bench-rep-ms-nan", ["bench", "--rep-ms", "nan"], EXIT_USAGE, "--rep-ms"),
    ("drift-budget-inf", [*DRIFT, "--budget", "inf"], EXIT_USAGE, "--budget"),
    ("validate-seed-2-63", [*VALIDATE, "--seed", str(2**63)], EXIT_USAGE, "--seed"),
    ("validate-kernel-option-nan", [*VALIDATE, "--kernel-option", "eps=nan"], EXIT_USAGE, "--kernel-option"),
    # the three messages that named the wrong flag, and their kin
    ("validate-threads-huge", [*VALIDATE, "--threads", "100000000"], EXIT_USAGE, "--threads"),
    ("fuzz-family-unknown", ["fuzz", "--family", "nope", "--failures", "{T}/out"], EXIT_USAGE, "--family"),
    ("fuzz-kernel-family-unknown", [*FUZZ[:4], "--family", "nope", "--failures", "{T}/out"], EXIT_USAGE, "--family"),
    ("validate-family-unknown", [*VALIDATE, "--family", "nope"], EXIT_USAGE, "--family"),
    ("bench-family-unknown", ["bench", "--family", "nope"], EXIT_USAGE, "--family"),
    ("list-family-unknown", ["list", "--family", "nope"], EXIT_USAGE, "--family"),
    # names that would become paths
    ("validate-kernel-dotdot", ["validate", "--kernel", "../x", "--out", "{T}/out"], EXIT_USAGE, "--kernel"),
    ("validate-kernel-slash", ["validate", "--kernel", "a/b", "--out", "{T}/out"], EXIT_USAGE, "--kernel"),
    ("drift-kernels-dotdot", [*DRIFT, "--kernels", "../../x"], EXIT_USAGE, "--kernels"),
    ("drift-geometry-slash", [*DRIFT, "--geometry", "mamba2=../tiny"], EXIT_USAGE, "--geometry"),
    ("fuzz-kernel-slash", ["fuzz", "--kernel", "a/b", "--failures", "{T}/out"], EXIT_USAGE, "--kernel"),
    ("artifact-kernel-dotdot", ["validate", "--scenario", "{T}/artifact_dotdot.json", "--out", "{T}/out"],
     EXIT_USAGE, "failure.kernel"),
    ("registered-kernel-dotdot", [*DRIFT, "--import", "{T}/evil_kernel.py", "--kernels", "../evil"], EXIT_ENV,
     "--import"),
]


@pytest.mark.parametrize("argv,code,needle", [pytest.param(a, c, n, id=i) for i, a, c, n in CASES_46])
def test_refused_before_work_naming_its_own_flag(env46, capsys, argv, code, needle):
    argv = [_sub(env46, a) for a in argv]
    before = _state(env46)
    got = main(argv)
    err = capsys.readouterr().err
    assert got == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    _assert_names_own_flags(argv, lines[0])
    assert _state(env46) == before


@pytest.mark.parametrize("argv,code,needle", [p for p in _params() if p.values[0][0] != "frobnicate"])
def test_every_refusal_names_a_flag_of_its_own_subcommand(env, capsys, argv, code, needle):
    """The earlier red-team cases too: a ``--flag`` in a refusal exists on that subcommand."""
    argv = [_sub(env, a) for a in argv]
    main(argv)
    _assert_names_own_flags(argv, capsys.readouterr().err.strip().splitlines()[0])


def test_the_batch_layout_is_linear_in_the_batch():
    """The speculative origins of Scenario.build looked each row up in a list (quadratic): 200,000
    rows now build in about a second; the layout is unchanged (active row i starts at 5 + 7i)."""
    sc = Scenario.build("mamba2", batch=200_001, padding=1, schedule="random", steps=1)
    ring = sc.ring_rows
    assert sc.resolved_origins[:4] == (5 % ring, 0, 12 % ring, 19 % ring)
    assert sc.resolved_origins[-1] == (5 + 7 * 199_999) % ring


def test_the_exhaustive_plan_is_the_same_with_one_walk_per_order():
    """The cover walk is computed once per row order (at most T'), not once per row: the plan of
    a 9-row batch equals the per-row walks of the schedule's own definition."""
    from replayssm.scenarios import schedules as S

    sc = Scenario.build("mamba2", batch=9, padding=0, window=4, buffer=12, schedule="exhaustive")
    plans = S._exhaustive(sc)
    ring = sc.ring_rows
    for r in range(sc.rows):
        order = [((j + r % 4) % 4) + 1 for j in range(4)]
        ks, resets = S._cover_walk(sc, order)
        ks = S._until_wrap(sc, ks, resets, sc.resolved_origins[r], (ring - 1 - r) % ring)
        assert [p.accepted[r] for p in plans[:len(ks)]] == ks


def test_check_writable_probes_instead_of_trusting_permissions(tmp_path):
    """os.access says yes to root everywhere; the probe creates (and removes) a file, so a folder
    that refuses files is refused and a writable one is left unchanged."""
    guard.check_writable(tmp_path / "new" / "deeper", "--out")
    guard.check_writable(tmp_path, "--out")
    assert list(tmp_path.iterdir()) == []
    if Path("/proc/self").is_dir():
        with pytest.raises(guard.EnvironmentProblem, match="--out"):
            guard.check_writable("/proc/replayssm-probe/out", "--out")


def test_out_path_keeps_every_file_under_its_folder(tmp_path):
    from replayssm.validators.jobs.drift import store as DStore

    assert guard.out_path(tmp_path, "mamba2-literal-replay-s32a16.json", "--kernel").parent == tmp_path
    for bad in ("../x.json", "a/b.json", "..", "/etc/passwd", ""):
        with pytest.raises(ValueError, match="--kernel"):
            guard.out_path(tmp_path, bad, "--kernel")
    with pytest.raises(ValueError, match="cell id"):
        DStore.cell_path(tmp_path, "mamba2.../../../x.s32a32.mild.standard")
    for bad in ("../x", "a/b", "..", "a b", ""):
        with pytest.raises(ValueError, match="--kernel"):
            guard.check_name(bad, "--kernel")


def test_check_fits_names_the_largest_cause_on_host_and_gpu():
    terms = [("--batch", 10, 2**30, "rows"), ("--slots", 10, 40 * 2**30, "slots"), ("--steps", 2**30, 0, "plan")]
    guard.check_fits(terms, "cpu", available=100 * 2**30)
    with pytest.raises(guard.EnvironmentProblem, match=r"^--slots: .* of host memory .* lower --slots$"):
        guard.check_fits(terms, "cpu", available=40 * 2**30)
    # on a GPU the tensors count against the device, the plan against the host
    guard.check_fits(terms, "cuda:0", available=2 * 2**30, device_available=100 * 2**30)
    with pytest.raises(guard.EnvironmentProblem, match=r"^--slots: .* of GPU memory on cuda:0"):
        guard.check_fits(terms, "cuda:0", available=100 * 2**30, device_available=40 * 2**30)
    with pytest.raises(guard.EnvironmentProblem, match=r"^--steps: .* of host memory"):
        guard.check_fits(terms, "cuda:0", available=2**30, device_available=100 * 2**30)


def test_a_reproducer_that_cannot_be_written_is_printed(env, capsys, monkeypatch):
    """The --failures folder passed the check, then writing fails (disk full, folder removed): the
    shrunk reproducer is printed, not lost."""
    from replayssm.validators.engine import fuzz_artifacts

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fuzz_artifacts.Path, "write_text", full)
    code = main(["fuzz", "--kernel", "mutant-no-commit", "--family", "gdn", "--include-mutants", "--max-examples", "5",
                 "--seed", "0", "--failures", str(env / "out")])
    out = capsys.readouterr().out
    assert code == 1
    assert "No space left on device" in out and "replayssm validate --scenario" in out
    artifact, _ = json.JSONDecoder().raw_decode(out[out.index("{"):])
    assert artifact["failure"]["kernel"] == "mutant-no-commit"
    assert Scenario.from_dict(artifact).family == "gdn"
    assert sorted(p.name for p in (env / "out").iterdir()) == ["earlier.json"]


@pytest.mark.parametrize("raised,code", [(RuntimeError("kernel crashed"), EXIT_ENV), (KeyboardInterrupt(), 130)])
@pytest.mark.parametrize("sub", ["validate", "drift"])
def test_the_lock_is_released_when_a_run_fails(env, capsys, monkeypatch, sub, raised, code):
    """An exception or Ctrl-C inside the locked run releases the --out lock: the next run takes it."""
    def boom(*a, **k):
        raise raised

    if sub == "validate":
        from replayssm import cli_validate
        monkeypatch.setattr(cli_validate, "run_scenario", boom)
        argv = [*VALIDATE, "--schedule", "random", "--steps", "2"]
    else:
        from replayssm import drift_cli
        monkeypatch.setattr(drift_cli, "run_sweep", boom)
        argv = DRIFT
    assert main([_sub(env, a) for a in argv]) == code
    capsys.readouterr()
    with output_lock(env / "out", "--out"):  # refused (EnvironmentProblem) if still held
        pass


def test_a_refused_run_leaves_no_lock_and_no_folder(env46, capsys):
    out = env46 / "fresh"
    assert main(["validate", "--kernel", "literal-replay", "--batch", "10000000", "--out", str(out)]) == EXIT_ENV
    assert "--batch" in capsys.readouterr().err
    assert not out.exists()


# ==== issue 46 (drift46): drift judges by default, interpreter honesty, reset(None), bookkeeping messages ====
# Oracle: the planted kernels of tests/fixtures/broken_drift_kernels.py (65 % output error; NaN from
# token 301) must fail a drift run without --check, one ``drift: FAIL`` line each naming the cell, the
# token and what; the literal model beside them passes.  On the CPU a kernel written elsewhere is
# refused at a mode the Triton interpreter cannot run faithfully (bf16 tl.dot, truncating bf16 casts),
# naming --device cuda, before anything runs.  reset(initial_state=None) is exercised and judged
# against zeros; a bookkeeping failure names the step's k, window and cursors.

import os  # noqa: E402
import sys  # noqa: E402

from replayssm.validators.engine.runner import run_scenario  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
_HERE = Path(__file__).resolve().parents[2]
VLLM_SRC = next((p for p in (Path(os.environ.get("REPLAYSSM_VLLM_SRC", "/nonexistent")),
                             _HERE.parent / "shared" / "peers" / "vllm-replayssm",
                             _HERE.parent.parent / "shared" / "peers" / "vllm-replayssm") if p.is_dir()), None)


def test_drift_fails_planted_broken_kernels_without_check(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["drift", "--import", str(FIXTURES / "broken_drift_kernels.py"), "--families", "mamba2",
            "--kernels", "broken-65-percent,broken-nan-from-301,literal-replay", "--modes", "s32a16",
            "--schedules", "standard", "--tokens", "512", "--rows", "1", "--workers", "1", "--no-progress",
            "--out", str(out)]
    try:
        code = main(argv)
    finally:
        sys.modules.pop("broken_drift_kernels", None)
    err = capsys.readouterr().err
    assert code == 1, err
    fails = [ln for ln in err.splitlines() if ln.startswith("drift: FAIL ")]
    assert len(fails) == 2, err  # one line per failing cell, the literal model not among them
    by = {ln.split()[2].rstrip(":"): ln for ln in fails}
    bad65 = by["mamba2.broken-65-percent.s32a16.long-memory.standard"]
    assert "output error 0.65" in bad65 and "gross bound 0.5" in bad65 and "from token 1" in bad65, bad65
    nan = by["mamba2.broken-nan-from-301.s32a16.long-memory.standard"]
    assert "non-finite output from token 301" in nan and "'non-finite'" in nan, nan
    report = json.loads((out / "drift_report.json").read_text())
    verdict = {c["kernel"]: c["verdict"]["pass"] for c in report["cells"]}
    assert verdict == {"broken-65-percent": False, "broken-nan-from-301": False, "literal-replay": True}
    assert report["verdict"]["pass"] is False and report["check"]["enabled"] is False
    # the ⚠ of the legend: 0.65 is far below the declared bf16 activation format, uncalibrated or not
    ep = next(c for c in report["cells"] if c["kernel"] == "broken-65-percent")["output"]["effective_precision"]
    assert ep["worse"] and ep["basis"] == "literal" and ep["bits_eff"] < 8 - 1
    md = (out / "drift_report.md").read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| mamba2.broken-65-percent"))
    assert "⚠" in row and "**FAIL**" in row, row


@pytest.mark.skipif(VLLM_SRC is None, reason="no vLLM ReplaySSM source tree (shared/peers/vllm-replayssm)")
@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is present: the kernel would run compiled")
@pytest.mark.parametrize("sub", ["validate", "drift"])
def test_cpu_refuses_an_adapter_at_a_mode_the_interpreter_cannot_run(env, capsys, monkeypatch, sub):
    """vLLM's Mamba-2 replay kernel at s32a16 on the CPU failed with a 1.4e10 error called "a bookkeeping
    error" (bf16 tl.dot under the interpreter); it is refused, before any work, naming the GPU."""
    monkeypatch.delenv("REPLAYSSM_VLLM_SRC", raising=False)
    argv = ({"validate": ["validate", "--kernel", "vllm-replay", "--family", "mamba2", "--precision", "s32a16",
                          "--decode", "standard", "--buffer", "4", "--steps", "2"],
             "drift": ["drift", "--families", "mamba2", "--kernels", "vllm-replay", "--modes", "s32a16",
                       "--schedules", "standard", "--device", "cpu", "--no-progress"]}[sub]
            + ["--vllm-src", str(VLLM_SRC), "--out", str(env / "out")])
    before = _tree(env)
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "cannot be judged at s32a16 on the CPU" in lines[0] and "--device cuda" in lines[0], lines[0]
    assert "tl.dot" in lines[0]
    assert _tree(env) == before


def test_reset_with_none_is_exercised_and_judged_against_zeros(tmp_path, capsys):
    """A kernel keeping the old state on reset(initial_state=None) passed validate and 1,827 fuzz
    scenarios: the default validation (exhaustive schedule) now re-admits rows through that default."""
    out = tmp_path / "out"
    assert main(["validate", "--kernel", "mutant-reset-none-keeps-state", "--family", "mamba2",
                 "--out", str(out), "--quiet"]) == 1
    res = run_scenario(Scenario.tiny("mamba2", schedule="exhaustive"), "literal-replay")
    assert res.passed and res.coverage["resets through the defaults (initial_state=None)"] > 0
    # the mutant is right wherever an explicit state is given: only the default path shows it
    explicit = Scenario.tiny("mamba2", schedule="slot-reuse", steps=24, initial_state="random")
    assert run_scenario(explicit, "mutant-reset-none-keeps-state").passed
    zeros = explicit.replace(initial_state="zeros")
    assert not run_scenario(zeros, "mutant-reset-none-keeps-state").passed


def test_a_bookkeeping_failure_names_k_the_window_and_the_cursors():
    res = run_scenario(Scenario.tiny("mamba2", schedule="exhaustive"), "mutant-stale-read")
    msg = next(f.message for f in res.failures if "a bookkeeping error" in f.message)
    for needle in ("accepted k = ", "of a window of 4", "cursors before the verify write_pos", "origin",
                   "is_flush", "after the commit write_pos", "row ", "(slot "):
        assert needle in msg, msg


def test_interpreter_refusal_is_decided_in_one_place_from_what_the_adapter_declares():
    from replayssm.adapters._base import SlotAdapter, interpreter_reason
    from replayssm.precision import parse_mode
    assert SlotAdapter.interpreter_traps == ("bf16-dot", "bf16-cast")  # an adapter's Triton code, unless it says less
    assert interpreter_reason(parse_mode("s32a16"))[0] == "act"
    assert interpreter_reason(parse_mode("s16a32"))[0] == "state"
    assert interpreter_reason(parse_mode("s32a32")) is None and interpreter_reason(parse_mode("sfp16a32")) is None
    assert "tl.dot" not in interpreter_reason(parse_mode("s32a16"), ("bf16-cast",))[1]  # casts alone still refuse
    assert interpreter_reason(parse_mode("s32a16"), ()) is None  # a kernel declaring neither runs
    with pytest.raises(ValueError, match="interpreter_traps"):
        interpreter_reason(parse_mode("s32a16"), ("bf16-dto",))
