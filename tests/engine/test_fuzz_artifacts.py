"""Failure artifacts: saved, loaded, replayed by the CLI; corrupt or hand-edited files name the field.

Oracle: the artifact is ``Scenario.to_json`` plus a ``failure`` record; loading must give back the
same Scenario and record, and every malformed field must raise ValueError (CLI: exit 2, one line)
naming it, before anything runs.
"""

import json

import pytest

from replayssm.cli import main
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.fuzz_artifacts import FailureRecord, load_failure, parse_failure, save_failure

SC = Scenario(family="mamba2", geometry={"family": "mamba2", "nheads": 2, "headdim": 2, "dstate": 4, "ngroups": 1},
              mode="s32a32", decode="speculative", window=2, buffer=2, rows=2, num_slots=3, slot_ids=(1, -1),
              origins=(3, 0), schedule="explicit",
              schedule_params={"accepted": [[2, 0], [1, 0], [2, 0]], "resets": [[2, 0, 1]]})
REC = FailureRecord(kernel="mutant-no-commit", family="mamba2", check="cursor", first_bad_step=0, row=0, slot=1,
                    message="cursor after commit")


def _artifact(tmp_path, edit=None, name="a.json"):
    d = json.loads(SC.to_json())
    d["failure"] = REC.to_dict()
    if edit:
        edit(d)
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def test_round_trip(tmp_path):
    p = save_failure(tmp_path, SC, REC)
    assert p.name == "mamba2-mutant-no-commit.json"
    sc, rec = load_failure(p)
    assert sc == SC and rec == REC
    # A plain Scenario loader reads the artifact too (the record is not a scenario field).
    assert Scenario.load(p) == SC


def test_cli_replays_the_artifact_without_kernel_flag(tmp_path, capsys):
    p = save_failure(tmp_path, SC, REC)
    assert main(["validate", "--scenario", str(p), "--out", str(tmp_path / "o"), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "mutant-no-commit" in out and "step 0" in out and "[cursor]" in out


def _set(path, value):
    def edit(d):
        node = d
        for k in path[:-1]:
            node = node[k]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return edit


BAD = [
    (("failure", "kernel"), KeyError, "failure.kernel: missing"),
    (("failure", "kernel"), 7, "failure.kernel: expected str"),
    (("failure", "first_bad_step"), "3", "failure.first_bad_step: expected int"),
    (("failure", "first_bad_step"), -1, "failure.first_bad_step: expected a step >= 0"),
    (("failure", "kind"), "something", "failure.kind: expected 'replayssm-failure'"),
    (("failure", "status"), "maybe", "failure.status: expected one of"),
    (("failure", "bogus"), 1, "failure.bogus: unknown field"),
    (("failure", "family"), "gdn", "failure.family: the record says 'gdn'"),
    (("failure",), [1, 2], "failure: expected an object"),
    (("schedule_params", "accepted", 0, 0), 5, "scenario.schedule_params: accepted[0][0]"),
    (("schedule_params", "accepted", 1, 1), 1, "scenario.schedule_params: accepted[1][1]: row 1 is a padding row"),
    (("schedule_params", "resets", 0), [9, 0, 1], "scenario.schedule_params: resets[0]: step expected"),
    (("schedule_params", "accepted"), [], "scenario.schedule_params: accepted: expected a non-empty list"),
    (("window",), 0, "scenario.window"),
    (("buffer",), 1, "scenario.buffer"),
    (("slot_ids",), [1, 7], "scenario.slot_ids"),
    (("origins",), [99, 0], "scenario.origins"),
    (("mode",), "s33a16", "scenario.mode"),
    (("wat",), 1, "scenario.wat: unknown field"),
]


@pytest.mark.parametrize("path,value,needle", BAD, ids=[".".join(map(str, p)) + f"={v!r}"[:20] for p, v, _ in BAD])
def test_bad_artifact_names_the_field(tmp_path, capsys, path, value, needle):
    p = _artifact(tmp_path, _set(path, value))
    with pytest.raises(ValueError) as e:
        load_failure(p)
    assert needle in str(e.value)
    assert main(["validate", "--scenario", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error" in err


def test_not_json_and_not_an_artifact(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"family": "mamba2",')
    with pytest.raises(ValueError, match="not valid JSON"):
        load_failure(p)
    with pytest.raises(ValueError, match="failure: missing"):
        parse_failure(SC.to_json())
    with pytest.raises(ValueError, match="cannot read"):
        load_failure(tmp_path / "missing.json")


def test_plain_scenario_without_kernel_is_a_usage_error(tmp_path, capsys):
    p = SC.save(tmp_path / "plain.json")
    assert main(["validate", "--scenario", str(p), "--out", str(tmp_path / "o")]) == 2
    assert "--kernel: required" in capsys.readouterr().err


def test_unknown_kernel_in_record_is_a_usage_error(tmp_path, capsys):
    p = _artifact(tmp_path, _set(("failure", "kernel"), "no-such-kernel"))
    assert main(["validate", "--scenario", str(p), "--out", str(tmp_path / "o")]) == 2
    assert "no-such-kernel" in capsys.readouterr().err


USER_KERNEL = '''
from replayssm.ops.mamba2.literal import Mamba2LiteralReplay
from replayssm.registry import register


@register
class UserBroken(Mamba2LiteralReplay):
    name = "user-broken-replay"
    description = "a user kernel whose outputs are 1.5x too large"

    def verify(self, *a, **k):
        out = super().verify(*a, **k)
        out.mul_(1.5)
        return out
'''


def test_artifact_of_a_user_kernel_records_its_module_and_replays_only_with_an_explicit_import(tmp_path, capsys):
    import sys

    from replayssm import registry
    from replayssm.cli import import_kernels
    from replayssm.validators.engine.fuzz_artifacts import module_of_file, record_of
    from replayssm.validators.engine.runner import run_scenario

    src = tmp_path / "user_kernels.py"
    src.write_text(USER_KERNEL)
    key = ("mamba2", "user-broken-replay")
    try:
        import_kernels(str(src))
        res = run_scenario(SC, "user-broken-replay", repeat_check=False, stop_on_failure=True)
        assert not res.passed
        rec = record_of(res, "user-broken-replay")
        assert rec.module == str(src.resolve())
        p = save_failure(tmp_path, SC, rec)
        assert module_of_file(p) == str(src.resolve())
        # A fresh process: the user module is neither imported nor registered.  The file names it, but
        # a data file runs no code: validate prints the command with --import and does nothing.
        registry._REGISTRY.pop(key)
        sys.modules.pop("replayssm_user_user_kernels")
        capsys.readouterr()
        assert main(["validate", "--scenario", str(p), "--out", str(tmp_path / "o"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"replayssm --import {src.resolve()} validate --scenario {p}" in err, err
        assert "replayssm_user_user_kernels" not in sys.modules and not (tmp_path / "o").exists()
        assert main(["--import", str(src), "validate", "--scenario", str(p), "--out", str(tmp_path / "o"),
                     "--quiet"]) == 1
        assert capsys.readouterr().out.startswith("FAIL user-broken-replay")
    finally:
        registry._REGISTRY.pop(key, None)
        sys.modules.pop("replayssm_user_user_kernels", None)


def test_builtin_kernel_records_no_module():
    from replayssm.registry import get
    from replayssm.validators.engine.fuzz_artifacts import module_to_import
    assert module_to_import(get("literal-replay", "mamba2")) is None
