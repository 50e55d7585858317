"""A hosted kernel (computing on one device behind the interface, validators/engine/hosted.py) is judged
exactly as the plain one.

Oracle: the plain run of the same kernel on the same scenario.  Hosting moves tensors across the
interface and nothing else, so every recorded metric, failure and verdict must be bit-identical
(expected difference: none), for correct kernels and for mutants, over drawn scenarios that use
every call form (padded and packed windows, standard steps, host-owned cursor tables, recycled
slots, permuted rows).  Here the kernel's device is the CPU too (CI has no GPU); the CUDA test
runs a compiled Triton kernel hosted on the GPU for a CPU engine.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from replayssm.registry import get
from replayssm.scenarios.scenario import Scenario
from replayssm.scenarios.strategies import scenarios
from replayssm.validators.engine.checks import CHECKS
from replayssm.validators.engine.hosted import hosted
from replayssm.validators.engine.mutants import all_mutants
from replayssm.validators.engine.runner import run_scenario
from replayssm.validators.jobs.fuzz.run import STRATEGY, sweep_kernel

pytestmark = pytest.mark.usefixtures("one_thread")

KERNELS = [("mamba2", "literal-replay"), ("gdn", "literal-replay-host-cursors"), ("kda", "literal-baseline"),
           ("gdn", "literal-replay-flush-when-full")]


def same_verdict(a, b) -> None:
    assert (a.passed, a.steps_run, a.failure_counts, a.exception) == (b.passed, b.steps_run, b.failure_counts,
                                                                       b.exception)
    assert [f.__dict__ for f in a.failures] == [f.__dict__ for f in b.failures]
    assert a.metrics == b.metrics


@pytest.mark.parametrize("family,name", KERNELS, ids=[f"{f}-{k}" for f, k in KERNELS])
def test_hosted_kernel_is_judged_bit_for_bit_as_the_plain_one(family, name):
    cls = get(name, family)
    box = hosted(cls, "cpu")
    assert (box.name, box.family, box.kind, box.decodes, box.bookkeeping) == (
        cls.name, cls.family, cls.kind, cls.decodes, cls.bookkeeping)

    @settings(max_examples=4, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(scenarios(kernel=cls, **dict(STRATEGY, max_steps=10)))
    def prop(sc):
        same_verdict(run_scenario(sc, box, stop_on_failure=True), run_scenario(sc, name, stop_on_failure=True))

    prop()


@pytest.mark.parametrize("check", ["cursor", "output", "padding-output", "committed-ring-rows"])
def test_hosted_mutant_fails_as_the_plain_one(check):
    spec = all_mutants()[CHECKS[check].mutant]
    kw = dict(CHECKS[check].witness)
    family = kw.pop("family", next(iter(spec.classes)))
    decode = kw.pop("decode", spec.decodes[0])
    kw.setdefault("steps", 6)
    sc = Scenario.tiny(family, decode, **kw)
    plain = run_scenario(sc, spec.classes[family])
    assert not plain.passed and plain.first_failure.check == check
    same_verdict(run_scenario(sc, hosted(spec.classes[family], "cpu")), plain)


def test_hosted_refuses_what_it_cannot_host():
    cls = get("literal-replay", "mamba2")
    with pytest.raises(ValueError, match="cls: expected a KernelUnderTest subclass"):
        hosted("literal-replay", "cpu")
    with pytest.raises(ValueError, match="already hosted"):
        hosted(hosted(cls, "cpu"), "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="kernel_device: 'cuda' needs CUDA"):
            hosted(cls, "cuda")


def test_sweep_kernel_hosts_the_kernel_on_its_device():
    res = sweep_kernel("literal-replay", "gdn", examples=2, seed=5, kernel_device="cpu:0")
    assert (res["device"], res["kernel_device"], res["scenarios"], res["failures"]) == ("cpu", "cpu:0", 2, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_triton_replay_on_the_gpu_judged_by_a_cpu_engine(family):
    res = sweep_kernel("triton-replay", family, examples=6, seed=11, kernel_device="cuda")
    assert (res["scenarios"], res["failures"]) == (6, 0), res["examples_failed"]


def test_fuzz_kernel_and_the_cli_take_a_kernel_device(capsys, tmp_path):
    from replayssm import cli
    from replayssm.validators.jobs.fuzz.run import fuzz_kernel

    rep = fuzz_kernel("literal-replay", "kda", max_examples=2, kernel_device="cpu:0", failures_dir=tmp_path)
    assert rep.examples == 2 and not rep.caught
    rc = cli.main(["fuzz", "--kernel", "literal-replay", "--family", "gdn", "--max-examples", "2",
                   "--kernel-device", "gpu", "--failures", str(tmp_path / "f")])
    assert rc == 2 and "--kernel-device: expected cpu or cuda[:N], got 'gpu'" in capsys.readouterr().err
    assert not (tmp_path / "f").exists()


def test_fuzz_modes_restricts_the_draws_and_leaves_out_kernels_supporting_none(capsys, tmp_path, monkeypatch):
    """``replayssm fuzz --modes``: every drawn scenario is in one of the modes; a kernel supporting
    none of them is left out with a line (not fuzzed, not reported as passing)."""
    import json

    from replayssm import cli, cli_fuzz
    from replayssm.registry import get
    from replayssm.validators.jobs.fuzz import run as fuzz

    out = tmp_path / "r.json"
    rc = cli.main(["fuzz", "--family", "mamba2", "--kernel", "literal-replay", "--kernel", "triton-replay",
                   "--max-examples", "1", "--modes", "s64a64", "--failures", str(tmp_path / "f"), "--json", str(out)])
    assert rc == 2 and "triton-replay supports none" in capsys.readouterr().err  # named with --kernel: refused
    seen, real = [], fuzz.run_scenario

    def spy(sc, *a, **kw):
        seen.append(sc.mode)
        return real(sc, *a, **kw)
    monkeypatch.setattr(fuzz, "run_scenario", spy)
    rc = cli.main(["fuzz", "--family", "gdn", "--kernel", "literal-replay", "--max-examples", "2", "--modes",
                   "s64a64,s32a32", "--failures", str(tmp_path / "f"), "--json", str(out)])
    assert rc == 0 and len(seen) == 2 and set(seen) <= {"s64a64", "s32a32"}
    assert [r["kernel"] for r in json.loads(out.read_text())] == ["literal-replay"]
    kept = cli_fuzz._supporting([get("literal-replay", "mamba2"), get("triton-replay", "mamba2")], ("s64a64",),
                                named=False, kernel_device="cpu")
    assert kept == [get("literal-replay", "mamba2")]
    assert "mamba2/triton-replay left out: supports none of --modes s64a64" in capsys.readouterr().out


@pytest.mark.parametrize("argv, interpret", [
    (["fuzz", "--device", "cpu"], True),
    (["fuzz", "--device=cpu", "--kernel-device", "cpu"], True),
    (["fuzz", "--device", "cpu", "--kernel-device", "cuda"], False),
    (["fuzz", "--device", "cpu", "--kernel-device=cuda:1"], False),
    (["fuzz", "--device", "cuda"], False),
    (["validate"], False),
], ids=["cpu", "cpu-kernel-cpu", "cpu-kernel-cuda", "cpu-kernel-cuda1", "cuda", "default"])
def test_interpreter_only_where_the_kernel_runs_on_the_cpu(argv, interpret):
    """``--device cpu --kernel-device cuda`` hosts a compiled kernel on the GPU: the CLI must not
    switch the Triton interpreter on for it (it ran NumPy on device pointers: every adapter failed
    its first fuzz scenario on the H200, 2026-12-04)."""
    from replayssm.cli import wants_interpreter
    assert wants_interpreter(argv) is interpret


def test_hosted_forwards_every_operation_of_the_interface():
    """Each operation a kernel implements (``KernelUnderTest``'s public methods that are not argument
    checks) is forwarded to the hosted instance: one left out would run the class's own code on an
    empty shell (the materialisation operation once did: ``AttributeError: ... write_pos``)."""
    import inspect

    from replayssm.interface import KernelUnderTest

    ops = {n for n, f in inspect.getmembers(KernelUnderTest, inspect.isfunction)
           if not n.startswith(("_", "check_", "unsupported_", "call_"))}
    assert {"reset", "verify", "commit", "materialize"} <= ops
    shell = hosted(get("literal-replay", "gdn"), "cpu")
    assert sorted(n for n in ops if n not in vars(shell)) == []
