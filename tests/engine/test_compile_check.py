"""The Triton kernels launched by CPU (interpreter) runs compile for the H200 (sm_90).

Oracle: the Triton compiler (``validators/engine/compile_check.py``: every distinct launch recorded under
the interpreter, compiled in a process without it, as the GPU would).  Expected: every
specialisation compiles.  The default run compiles the replay kernels' launches (both decodes,
ieee and tf32 readouts); the slow tier every Triton kernel's over the interpreted fuzz's draws.
The geometries are the small ones the fuzzer draws (key and state
dimensions of 4), where a compiled ``tl.dot``'s minimum width applies and the interpreter's does
not: the case the GPU nightly fuzz of 2026-12-01 found failing (kda ``s32a16-tf32``, K < 16).
"""

import pytest

from replayssm.registry import get, kernels
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.compile_check import compile_all, compile_one, record, spec_of
from replayssm.validators.engine.runner import run_scenario

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = {"mamba2": {"family": "mamba2", "nheads": 2, "headdim": 4, "dstate": 4, "ngroups": 1},
         "gdn": {"family": "gdn", "num_k_heads": 1, "num_v_heads": 2, "head_k_dim": 4, "head_v_dim": 4},
         "kda": {"family": "kda", "num_k_heads": 1, "num_v_heads": 2, "head_k_dim": 4, "head_v_dim": 4}}
MODES = ("s32a16", "s32a16-tf32")


def _runs(family: str):
    """(kernel, scenario) of ``family``'s Triton replay kernel, both decodes, in each mode it supports
    (the baselines and the state route: the slow tier's fuzz below)."""
    for (_f, name), cls in sorted(kernels(family).items()):
        if name != "triton-replay":
            continue
        for decode in cls.decodes:
            for mode in MODES:
                sc = Scenario.build(family, decode=decode, geometry=SMALL[family], mode=mode, steps=3)
                if cls.unsupported_reason(sc.precision, sc.decode_config, {}) is None:
                    yield name, sc


@pytest.mark.parametrize("family", sorted(SMALL))
def test_every_launch_of_the_triton_replay_kernel_compiles_for_sm90(family):
    with record() as specs:
        for name, sc in _runs(family):
            res = run_scenario(sc, name, repeat_check=False)
            assert res.passed, res.to_markdown()
    assert specs
    results = compile_all(specs)
    bad = [r for r in results if r["status"] != "compiled"]
    assert not bad, bad


def test_the_check_fails_a_dot_under_the_compiled_minimum():
    """The bug of 2026-12-01 put back by hand: the kda stream kernel with a 4-wide key tile."""
    sc = Scenario.build("kda", decode="standard", geometry=SMALL["kda"], mode="s32a16-tf32", steps=2)
    with record() as specs:
        assert run_scenario(sc, "triton-replay", repeat_check=False).passed
    stream = next(s for s in specs if s["qualname"] == "_kda_stream_kernel")
    assert stream["args"]["BK"] == ["value", 16]
    stream["args"]["BK"] = ["value", 4]
    (res,) = compile_all([stream])
    assert res["status"] == "failed" and "K >=" in res["error"], res


def test_an_undescribed_launch_is_not_checked():
    cls = get("triton-replay", "kda")
    spec = spec_of(type("F", (), {"__module__": cls.__module__, "__qualname__": "_kda_stream_kernel"}),
                   ["slot_ptr", "BK"], (object(), 16), {})
    assert spec["undescribed"] == ["slot_ptr=object"]
    res = compile_one(spec)
    assert res["status"] == "not checked" and "slot_ptr" in res["why"]


def test_arch_is_checked():
    with pytest.raises(ValueError, match="arch: expected a CUDA compute capability"):
        compile_all([], arch="sm90")


def _cli(capsys, *argv):
    from replayssm import cli

    rc = cli.main(list(argv))
    return rc, capsys.readouterr()


def test_validate_compile_for_reports_each_launch(capsys, tmp_path):
    rc, cap = _cli(capsys, "validate", "--kernel", "triton-replay", "--family", "gdn", "--precision",
                   "s32a16-tf32", "--decode", "standard", "--steps", "1", "--no-repeat", "--compile-for", "90",
                   "--quiet",
                   "--out", str(tmp_path))
    assert rc == 0, cap.out + cap.err
    line = next(x for x in cap.out.splitlines() if x.startswith("compile for sm_90"))
    assert line.startswith("compile for sm_90: PASS:") and "0 failed, 0 not checked" in line


def test_validate_compile_for_a_run_without_triton_is_not_a_pass(capsys, tmp_path):
    rc, cap = _cli(capsys, "validate", "--kernel", "literal-replay", "--family", "gdn", "--steps", "2",
                   "--compile-for", "90", "--quiet", "--out", str(tmp_path))
    assert rc == 1 and "compile for sm_90: INCOMPLETE" in cap.out and "launched none" in cap.out


@pytest.mark.parametrize("argv,needle", [
    (["--compile-for", "60"], "--compile-for: expected an integer >= 70, got 60 (a CUDA compute capability)"),
    (["--compile-for", "90", "--device", "cuda"], "--compile-for: needs --device cpu"),
], ids=["sm60", "on-cuda"])
def test_validate_compile_for_refused_before_any_work(capsys, tmp_path, argv, needle):
    out = tmp_path / "out"
    rc, cap = _cli(capsys, "validate", "--kernel", "triton-replay", "--family", "gdn", "--out", str(out), *argv)
    assert rc == 2 and needle in cap.err and not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("family,name", [(f, n) for f in sorted(SMALL) for (_f, n) in sorted(kernels(f))
                                         if n.startswith("triton-")])
def test_every_launch_of_the_interpreted_fuzz_compiles_for_sm90(family, name):
    """The shapes, modes and options the interpreted fuzz draws (20 scenarios), every launch compiled."""
    from replayssm.validators.jobs.fuzz.run import sweep_kernel

    with record() as specs:
        res = sweep_kernel(name, family, examples=20, seed=7)
    assert res["failures"] == 0, res["examples_failed"]
    bad = [r for r in compile_all(specs) if r["status"] != "compiled"]
    assert not bad, bad


def test_a_kernel_without_a_module_level_name_is_not_checked():
    spec = {"module": "replayssm.ops.kda.replay_split", "qualname": "make.<locals>._k", "args": {}, "options": {},
            "undescribed": []}
    res = compile_one(spec)
    assert res["status"] == "not checked" and "no module-level JIT function" in res["why"]


def test_fuzz_compile_for_compiles_the_fuzzed_launches(capsys, tmp_path):
    rc, cap = _cli(capsys, "fuzz", "--kernel", "triton-replay", "--family", "kda", "--max-examples", "2",
                   "--compile-for", "90", "--failures", str(tmp_path / "f"))
    assert rc == 0, cap.out + cap.err
    line = next(x for x in cap.out.splitlines() if x.startswith("compile for sm_90"))
    assert line.startswith("compile for sm_90: PASS:") and "0 failed, 0 not checked" in line


def test_fuzz_compile_for_refuses_a_kernel_on_the_gpu(capsys, tmp_path):
    rc, cap = _cli(capsys, "fuzz", "--kernel", "triton-replay", "--family", "kda", "--compile-for", "90",
                   "--kernel-device", "cuda", "--failures", str(tmp_path / "f"))
    assert rc == 2 and "--compile-for: needs the kernel on the cpu" in cap.err and not (tmp_path / "f").exists()
