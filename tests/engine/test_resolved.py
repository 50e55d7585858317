"""A scenario is resolved once, at the engine's door (validators/engine/resolved.py, issue 49 item 2).

Oracle: the engine's source (an AST walk, as tests/core/test_layers.py) calls ``family(...)`` and
``parse_mode(...)`` only in the resolver and reads no name-derived property of a scenario
(``Scenario.precision``, ``Scenario.geometry_obj``) elsewhere; a ``run_scenario`` walk resolves
the scenario's family and mode once (counted at the resolver), and the calls of ``family`` and
``parse_mode`` anywhere (the scenarios layer's input generator included, counted by their code
objects) do not grow with the number of steps; ``resolve`` refuses bad input with a
``ValueError`` naming the argument, raised before any work (no inputs built, no kernel made).
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from replayssm import families, precision
from replayssm.precision import PrecisionMode
from replayssm.registry import get
from replayssm.scenarios import Scenario
from replayssm.validators.engine import resolved as resolver
from replayssm.validators.engine import runner
from replayssm.validators.engine.resolved import ResolvedScenario, resolve
from replayssm.validators.engine.runner import SR_REPLICAS, build_kernel, run_scenario
from replayssm.validators.engine.tolerances import tolerance_for

pytestmark = pytest.mark.usefixtures("one_thread")

NAME_LOOKUPS = ("family", "parse_mode")
DERIVED = ("precision", "geometry_obj")
ENGINE_DIR = Path(__file__).resolve().parents[2] / "validators" / "engine"
# The scenario engine: every module of validators/engine/ but the resolver, the mixer engine (mixer kernels
# have no Scenario; validate_mixer resolves its mode at its own door) and the mutants (test doubles).
ENGINE = sorted(p.relative_to(ENGINE_DIR).with_suffix("").as_posix() for p in ENGINE_DIR.rglob("*.py")
                if p.name != "resolved.py" and p.relative_to(ENGINE_DIR).parts[0] not in ("mixer", "mutants"))


def lookups(source: str) -> list[str]:
    """``line: what`` of every call of a name lookup and every read of a name-derived scenario property."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in NAME_LOOKUPS:
                out.append(f"{n.lineno}: {name}(...)")
        elif isinstance(n, ast.Attribute) and n.attr in DERIVED:
            out.append(f"{n.lineno}: .{n.attr}")
    return out


def test_the_engine_list_holds_the_engine():
    want = {"runner", "tolerances", "metrics", "invariants", "result", "checks/__init__", "checks/context",
            "checks/output_tolerance", "checks/flush_increment", "checks/stored_precision", "checks/fp64_bound",
            "checks/tolerance_rule"}
    assert want <= set(ENGINE)


@pytest.mark.parametrize("module", ENGINE)
def test_the_engine_resolves_no_name_again(module):
    found = lookups((ENGINE_DIR / f"{module}.py").read_text())
    assert not found, f"{module} resolves a scenario name again (use the run's ResolvedScenario):\n" + "\n".join(found)


def test_the_source_check_has_teeth():
    src = "def f(sc, ctx):\n    a = family(sc.family)\n    b = pm.parse_mode(sc.mode)\n    return sc.precision\n"
    assert lookups(src) == ["2: family(...)", "3: parse_mode(...)", "4: .precision"]
    assert lookups((ENGINE_DIR / "resolved.py").read_text())  # the resolver is where they are


def test_resolve_carries_what_the_engine_reads():
    sc = Scenario.tiny("gdn", "speculative", mode="s16a16-sr3")
    r = resolve(sc, "literal-replay", "cpu")
    assert r.sc is sc and r.family.name == "gdn" and r.mode == sc.precision and r.geometry == sc.geometry_obj
    assert r.kernel_cls is get("literal-replay", "gdn") and r.device == torch.device("cpu")
    assert r.decode == sc.decode_config.with_policy("spec") and r.conventions.is_default
    assert r.tolerance == tolerance_for(r.mode) and r.u_out > 0 and r.u_state > 0 and r.marginal_factor == 1.0
    assert resolve(r, "literal-replay") is r  # resolved already: nothing is looked up again
    twin = r.with_kernel("literal-baseline")
    assert twin.family is r.family and twin.mode is r.mode and twin.kernel_cls is get("literal-baseline", "gdn")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.mode = PrecisionMode()


class _Counted:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *a, **kw):
        self.calls += 1
        return self.fn(*a, **kw)


@pytest.mark.parametrize("mode,lookups_", [("s32a16", 1), ("s16a16-sr", 1 + SR_REPLICAS)], ids=["nearest", "sr"])
def test_a_run_resolves_the_scenario_once(monkeypatch, mode, lookups_):
    """Family and mode are looked up at the door (and once per stochastic-rounding replica's mode),
    not per step, check or literal model; the repeat run reuses the resolved scenario."""
    fam, pm = _Counted(resolver.family), _Counted(resolver.parse_mode)
    monkeypatch.setattr(resolver, "family", fam)
    monkeypatch.setattr(resolver, "parse_mode", pm)
    res = run_scenario(Scenario.tiny("mamba2", "speculative", mode=mode, steps=4), "literal-replay")
    assert res.passed, res.failures
    assert (fam.calls, pm.calls) == (lookups_, lookups_)


def _lookups_anywhere(fn) -> dict[str, int]:
    """Calls of ``family`` and ``parse_mode`` while ``fn`` runs, from any module (however imported)."""
    codes = {families.family.__code__: "family", precision.parse_mode.__code__: "parse_mode"}
    calls = dict.fromkeys(codes.values(), 0)

    def prof(frame, event, _arg):
        if event == "call" and frame.f_code in codes:
            calls[codes[frame.f_code]] += 1

    old = sys.getprofile()
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(old)
    return calls


@pytest.mark.parametrize("fam,mode", [("mamba2", "s32a16"), ("gdn", "s16a16-sr")], ids=["mamba2-nearest", "gdn-sr"])
def test_name_lookups_do_not_grow_with_the_steps(fam, mode):
    """Inputs, initial states and parameters come from the resolved scenario's generator: a run of 12
    steps looks names up as often as one of 3 (8 steps: 131 calls before the generator, 15 after)."""
    def run(steps):
        res = run_scenario(Scenario.tiny(fam, "speculative", mode=mode, steps=steps, schedule="slot-reuse"),
                           "literal-replay")
        assert res.passed, res.failures

    short, long = _lookups_anywhere(lambda: run(3)), _lookups_anywhere(lambda: run(12))
    assert short == long, f"name lookups grow with the steps: 3 steps {short}, 12 steps {long}"


BAD = {
    "sc": lambda: resolve({"family": "mamba2"}, "literal-replay"),
    "kernel-name": lambda: resolve(Scenario.tiny("mamba2"), "no-such-kernel"),
    "kernel-type": lambda: resolve(Scenario.tiny("mamba2"), 3),
    "kernel-instance": lambda: resolve(Scenario.tiny("mamba2", mode="s32a32"),
                                       build_kernel("literal-replay", Scenario.tiny("mamba2"), "cpu")),
    "device": lambda: resolve(Scenario.tiny("mamba2"), "literal-replay", "no-such-device"),
    "bookkeeping": lambda: resolve(Scenario.tiny("mamba2"), type("B", (get("literal-replay", "mamba2"),),
                                                                 {"name": "b", "bookkeeping": "sometimes"})),
    "conventions": lambda: resolve(Scenario.tiny("mamba2"), type("C", (get("literal-replay", "mamba2"),),
                                                                 {"name": "c", "conventions": {"l2_eps": 1e-5}})),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_resolve_refuses_bad_input_naming_the_argument(case):
    with pytest.raises(ValueError, match=f"^{case.split('-')[0]}: "):
        BAD[case]()


def test_a_bad_name_is_refused_at_the_door_before_any_work(monkeypatch):
    def no_work(*a, **kw):
        raise AssertionError("work started before the kernel name was resolved")
    monkeypatch.setattr(runner, "make_params", no_work)
    with pytest.raises(ValueError, match="^kernel: no kernel 'no-such-kernel' for family 'mamba2'"):
        run_scenario(Scenario.tiny("mamba2"), "no-such-kernel")
    with pytest.raises(ValueError, match="^sc: expected a Scenario, got dict"):
        run_scenario({"family": "mamba2"}, "literal-replay")
    with pytest.raises(ValueError, match="^kernel: "):
        runner.Lockstep(Scenario.tiny("mamba2"), "no-such-kernel")


def test_the_engine_accepts_a_resolved_scenario():
    sc = Scenario.tiny("mamba2", "speculative", steps=3)
    r = resolve(sc, "literal-replay")
    assert isinstance(r, ResolvedScenario)
    a, b = run_scenario(sc, "literal-replay"), run_scenario(r, "literal-replay")
    assert a.passed and b.passed and a.scenario == b.scenario and a.metrics == b.metrics
