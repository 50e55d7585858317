"""The family protocol, proved by a family the package has never heard of (``tests/toyfam``).

A new family is one folder (naive.py, literal.py, family.py) plus one registration line; with it
every job works: validate (engine + every check), fuzz, drift, bench and the CLI.  An unknown
family is an error everywhere, never a fallback to another family's math."""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys

import pytest

from replayssm import families as fam_registry
from replayssm import registry
from replayssm.cli import main
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario
from replayssm.validators.jobs.bench.run import bench_cases, bench_family, measure_case
from replayssm.validators.jobs.drift.sweep import SweepConfig, run_sweep
from replayssm.validators.jobs.fuzz.run import fuzz_kernel


@pytest.fixture(scope="module")
def toy():
    """Register the test family (the one registration line), and take it away afterwards so other
    tests see the built-in families only."""
    importlib.import_module("toyfam")  # the registration line
    yield fam_registry.family("toy")
    fam_registry.unregister_family("toy")
    registry.unregister_family_kernels("toy")
    for mod in [m for m in sys.modules if m == "toyfam" or m.startswith("toyfam.")]:
        del sys.modules[mod]


@pytest.mark.parametrize("decode", ["speculative", "standard"])
@pytest.mark.parametrize("kernel", ["literal-replay", "literal-baseline"])
def test_validate_runs_a_new_family(toy, kernel, decode):
    sc = Scenario.tiny("toy", decode=decode, mode="s32a16", schedule="exhaustive")
    res = run_scenario(sc, kernel)
    assert res.passed, res.failures[:3]
    assert res.steps_run == res.steps_planned > 0 and res.tokens_accepted > 0


def test_validate_catches_a_broken_kernel_of_a_new_family(toy):
    """The checks are family-agnostic: the toy literal model committing one token too few fails."""

    class Uncommitted(toy.literal_replay):
        name = "toy-commits-too-few"

        def commit(self, slot_ids, accepted):
            # (in-range counts only: an out-of-range one is still refused, accepted-range's business)
            super().commit(slot_ids, accepted.where((accepted <= 1) | (accepted > self.decode.window), 1))

    res = run_scenario(Scenario.tiny("toy", mode="s32a32", schedule="always-T"), Uncommitted)
    assert not res.passed and res.failures[0].check in ("state", "output", "cursor")


def test_fuzz_runs_a_new_family(toy):
    rep = fuzz_kernel("literal-replay", "toy", profile="ci", max_examples=6, seed=1)
    assert not rep.caught and rep.examples >= 6, rep.notes


def test_drift_runs_a_new_family(toy, tmp_path):
    cfg = SweepConfig(families=("toy",), kernels=("literal-replay",), modes=("s32a32",), schedules=("standard",),
                      geometry=(("toy", "tiny"),), tokens=64, rows=2, blocks=8, nbins=8)
    out = run_sweep(cfg, tmp_path, progress=False)
    assert out.ran and out.tokens >= 64 * 2
    assert cfg.families == ("toy",)


def test_bench_runs_a_new_family(toy):
    res = bench_family("toy", "tiny", "s32a32", L=2, batches=(1,), spec_batches=(1,), window=2, spec_buffer=2,
                       device="cpu", sweep=False, copy={"tbps": 1.0, "bytes": 1, "ms": 1.0}, max_sets=2,
                       baseline="literal-baseline", replay="literal-replay", log=lambda s: None)
    assert len(res["rows"]) == 3 and all("of bound" in r["check"] for r in res["rows"])


def test_benchmark_suite_picks_up_a_new_family(toy):
    """tests/bench asks the registry: a new family's deployable kernels get every case of the suite
    (its literal models are oracles, never benchmarked), and a case runs end to end."""

    class ToyKernel(toy.literal_replay):
        name = "toy-kernel"

    registry.register(ToyKernel)  # the toy fixture unregisters the family's kernels at the end
    cases = [c for c in bench_cases() if c.family == "toy"]
    assert {c.kernel for c in cases} == {"toy-kernel"}
    assert len(cases) == len([c for c in bench_cases() if c.family == "mamba2" and c.kernel == "triton-replay"])
    case = next(c for c in cases if c.decode == "standard" and c.batch == 1)
    timing, extra = measure_case(dataclasses.replace(case, geometry="tiny", mode="s32a32", L=2), copy=None,
                                 device="cpu", max_sets=2)
    assert "of bound" in timing.verdict and extra["bytes_per_step"] > 0


def test_cli_lists_a_new_family(toy, capsys):
    assert main(["list", "kernels", "--family", "toy", "--json"]) == 0
    names = {k["name"] for k in json.loads(capsys.readouterr().out)["kernels"]}
    assert {"literal-replay", "literal-baseline"} <= names


def test_unknown_family_is_an_error_not_a_fallback():
    with pytest.raises(ValueError, match="family: expected one of"):
        fam_registry.family("kda-not-registered")
    with pytest.raises(ValueError, match="family"):
        Scenario.tiny("kda-not-registered")
    with pytest.raises(ValueError, match="family"):
        SweepConfig(families=("kda-not-registered",))
    with pytest.raises(ValueError, match="family"):
        fam_registry.geometry_from_dict({"family": "kda-not-registered"})
