"""Property-based fuzzing of kernels: Hypothesis draws scenarios, the validation engine judges them.

Oracle: :func:`replayssm.validators.engine.runner.run_scenario`, the same path as ``replayssm validate``
(fp64 reference, literal-model tolerance rule, exact invariants, repeat check).  Nothing is
re-implemented here: a drawn scenario fails exactly when the engine's result does not pass, and
the property reports the engine's first failure (step, row, window position, check).

* Profiles (Hypothesis settings profiles, selected by ``REPLAYSSM_FUZZ_PROFILE``, default ``ci``):
  ``ci`` derandomized and bounded (part of the default pytest run), ``dev`` (more examples, the
  local example database), ``nightly`` (thousands of examples).
* :func:`check_scenario` the property itself; on failure it saves the scenario as a failure
  artifact (``validators/engine/fuzz_artifacts.py``) that ``replayssm validate --scenario FILE`` replays.
* :func:`fuzz_kernel` runs the property for one kernel and reports what happened: examples run,
  time to the first failure, the shrunk reproducer and its size.  ``shrink_budget_examples``
  (a count of scenarios run after the first failure: what tests use, so a loaded machine reaches
  the same result) or ``shrink_budget_s`` (wall clock: the command line's time-boxed runs) bounds
  shrinking: past it, candidates not already seen failing are treated as passing, so Hypothesis
  stops improving and reports the best failing scenario found so far (a real failure, replayed).
* ``replayssm fuzz`` (``replayssm/cli_fuzz.py``) and the nox ``fuzz`` session run it over every
  registered kernel for a time budget.
* Verdicts (docs/validation.md): a ``marginal`` scenario (an error above the tolerance rule's bound
  within the marginal band, no failure) is recorded in the report (count, the worst ones, an
  artifact ``<family>-<kernel>-marginal.json``) and the search goes on for a real failure;
  ``strict`` makes a marginal a failure.  Every scenario run reports its worst ratio of error to
  bound to Hypothesis (``target(ratio, label=TARGET_LABEL)``) in the profiles with the target phase
  (dev, nightly; not ci, whose reproducers must not move), so the search moves toward the margin;
  ``example_db`` (a folder, ``DirectoryBasedExampleDatabase``, one subfolder per kernel)
  keeps the failing and the best-targeted scenarios of one run and replays them first in the next
  (docs/fuzzing.md: the nightly run saves it, a merge run replays it).
"""

from __future__ import annotations

import functools
import os
import random
import time
import unittest
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase

from replayssm.adapters._base import interpreter_reason
from replayssm.interface import KernelUnderTest
from replayssm.precision import parse_mode
from replayssm.registry import get, kernels
from replayssm.scenarios.scenario import Scenario
from replayssm.scenarios.schedules import default_steps
from replayssm.scenarios.strategies import FUZZ_MODES, scenarios
from replayssm.validators.engine.fuzz_artifacts import FailureRecord, record_of, save_failure
from replayssm.validators.engine.hosted import hosted
from replayssm.validators.engine.runner import run_scenario

PROFILE_ENV = "REPLAYSSM_FUZZ_PROFILE"
# The ci profile draws without Hypothesis's target phase: a target() observation changes what it
# generates and shrinks (measured: mamba2 mutant-stale-cursor-on-reuse shrank to 32 steps instead
# of <= 8 with target() called), and CI's reproducers must not move with it.  The dev and nightly
# profiles search toward the margin (Phase.target, fed by the worst ratio of error to bound).
NO_TARGET = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)
TARGETED = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
_COMMON = dict(deadline=None, print_blob=False, report_multiple_bugs=False,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
PROFILES = {
    # Derandomized (same examples every run), no example database: CI results never depend on
    # what ran before.  At most 100 scenarios per kernel: a failing kernel stops at its first
    # failure (the mutation gallery needs up to ~70 for the stochastic-rounding mutants); the
    # default pytest run gives each correct kernel CI_EXAMPLES of them (time budget).
    "ci": dict(max_examples=100, derandomize=True, database=None, phases=NO_TARGET),
    "dev": dict(max_examples=200, phases=TARGETED),
    "nightly": dict(max_examples=2000, phases=TARGETED),
}
for _name, _kw in PROFILES.items():
    settings.register_profile(_name, **_COMMON, **_kw)

# Scenarios per correct kernel in the default pytest run (ci profile): pure-PyTorch kernels,
# and Triton kernels run through the interpreter on CPU.
CI_EXAMPLES = 20
CI_EXAMPLES_INTERPRETED = 3
# The alternate literal kernels (each bookkeeping policy's literal model and the legitimate
# variants: every ``literal-*`` kernel but literal-replay and literal-baseline) get fewer, for
# ./dev test's time limit (they were the slowest of a loaded 2-core run; unrecorded); the
# nightly profile runs 2,000 each (docs/fuzzing.md).
CI_EXAMPLES_ALTERNATE = 8

# Strategy sizes.  Interpreted Triton kernels on CPU are slow per step: tiny shapes.
STRATEGY = {"max_steps": 64, "max_rows": 3, "max_dim": 8}
INTERPRETED_STRATEGY = {"max_steps": 6, "max_rows": 2, "max_dim": 4, "max_window": 3, "max_extra_buffer": 3,
                        "max_standard_buffer": 4, "max_resets": 1}


# The label of the Hypothesis target: the worst ratio of error to bound of the banded checks.
TARGET_LABEL = "worst bound ratio"
# Marginal scenarios a report keeps (the worst first).
KEEP_MARGINALS = 3


def example_database(folder, cls: type[KernelUnderTest]) -> DirectoryBasedExampleDatabase:
    """The example database of ``cls`` under ``folder``: ``<folder>/<family>/<kernel>`` (one per
    kernel: Hypothesis keys examples by the property's source, which every kernel shares)."""
    if folder is None or not str(folder).strip():
        raise ValueError(f"example_db: expected a folder, got {folder!r}")
    return DirectoryBasedExampleDatabase(Path(folder) / cls.family / cls.name)


def profile_name(name: str | None = None) -> str:
    """``name``, else ``$REPLAYSSM_FUZZ_PROFILE``, else ``ci``; ValueError for unknown names."""
    name = name or os.environ.get(PROFILE_ENV) or "ci"
    if name not in PROFILES:
        raise ValueError(f"profile: expected one of {sorted(PROFILES)} (or unset {PROFILE_ENV}), got {name!r}")
    return name


def fuzz_settings(name: str | None = None, **overrides) -> settings:
    """The Hypothesis settings of profile ``name`` (see :func:`profile_name`), with overrides."""
    return settings(settings.get_profile(profile_name(name)), **overrides)


def is_interpreted(cls: type[KernelUnderTest], device: str = "cpu") -> bool:
    """True for Triton kernels on CPU (run through the Triton interpreter: slow): ours, and kernels
    written elsewhere whose adapter declares a Triton source (``triton_source``)."""
    triton = "triton" in cls.name or "triton" in cls.__module__ or getattr(cls, "triton_source", False)
    return str(device).startswith("cpu") and bool(triton)


def drawable_modes(cls: type[KernelUnderTest], kernel_device, modes: tuple[str, ...]) -> tuple[str, ...]:
    """``modes`` less those a kernel written elsewhere cannot be judged at where it runs: under the
    Triton interpreter, the modes its declared ``interpreter_traps`` make unfaithful
    (``adapters._base.interpreter_reason``, the engine's refusal)."""
    if not (getattr(cls, "triton_source", False) and is_interpreted(cls, kernel_device)):
        return tuple(modes)
    traps = getattr(cls, "interpreter_traps", ("bf16-dot", "bf16-cast"))
    return tuple(m for m in modes if interpreter_reason(parse_mode(m), traps) is None)


def ci_examples(cls: type[KernelUnderTest]) -> int:
    """Scenarios for correct kernel ``cls`` in the default pytest run (the ``ci`` profile)."""
    if is_interpreted(cls):
        return CI_EXAMPLES_INTERPRETED
    if cls.name.startswith("literal-") and cls.name not in ("literal-replay", "literal-baseline"):
        return CI_EXAMPLES_ALTERNATE
    return CI_EXAMPLES


def fuzzable_kernels(family: str | None = None, include_mutants: bool = False) -> list[type[KernelUnderTest]]:
    """Registered kernels (mutants excluded unless asked), family then name order."""
    return [cls for (_f, _n), cls in kernels(family).items() if include_mutants or cls.kind != "mutant"]


def _resolve(kernel, family: str | None) -> type[KernelUnderTest]:
    if isinstance(kernel, str):
        if family is None:
            raise ValueError("family: a kernel given by name needs its family")
        return get(kernel, family)
    if isinstance(kernel, type) and issubclass(kernel, KernelUnderTest):
        return kernel
    raise ValueError(f"kernel: expected a registered name or a KernelUnderTest subclass, got {kernel!r}")


def _target(cls: type[KernelUnderTest], device: str, kernel_device: str | None, strategy: dict | None):
    """(scenario strategy keywords, what run_scenario gets) for ``cls`` computing on ``kernel_device``
    (default ``device``) with the engine on ``device``: a kernel elsewhere is hosted
    (``validators/engine/hosted.py``); a Triton kernel on the CPU gets the interpreter's small strategy."""
    kdev = kernel_device or device
    skw = dict(INTERPRETED_STRATEGY if is_interpreted(cls, kdev) else STRATEGY)
    skw.update(strategy or {})
    skw["modes"] = drawable_modes(cls, kdev, skw.get("modes", FUZZ_MODES))
    return skw, (_kernel_arg(cls) if kdev == device else hosted(cls, kdev))


def _kernel_arg(cls: type[KernelUnderTest]):
    """What run_scenario gets: the registered name when the class is the registered one (as the
    CLI does), else the class itself."""
    try:
        if get(cls.name, cls.family) is cls:
            return cls.name
    except ValueError:
        pass
    return cls


def check_scenario(sc: Scenario, kernel, *, device: str = "cpu", failures_dir=None, repeat_check: bool = True,
                   stop_on_failure: bool = True, strict: bool = False):
    """The fuzz property: ``kernel`` passes the engine's validation on ``sc``.

    Runs ``run_scenario`` (stopping at the first failing step, as ``replayssm validate
    --stop-on-failure`` does) and returns its result; on failure saves a failure artifact into
    ``failures_dir`` (when given) and raises ``AssertionError`` with the engine's first failure
    (``strict``: a marginal result too)."""
    cls = _resolve(kernel, sc.family)
    res = run_scenario(sc, _kernel_arg(cls), device=device, repeat_check=repeat_check,
                       stop_on_failure=stop_on_failure)
    if not res.ok(strict):
        path = None
        if failures_dir is not None:
            path = save_failure(failures_dir, sc, record_of(res, cls.name))
        raise AssertionError(res.headline() + (f"\nreproducer: {path} (replay: replayssm validate --scenario "
                                               f"{path})" if path else ""))
    return res


@dataclass
class FuzzReport:
    """What one fuzzing run of one kernel found."""

    kernel: str
    family: str
    profile: str
    examples: int = 0
    caught: bool = False
    time_to_first_failure_s: float | None = None
    examples_to_first_failure: int | None = None
    wall_s: float = 0.0
    shrink_stopped_by_budget: bool = False
    scenario: Scenario | None = None
    record: FailureRecord | None = None
    artifact: Path | None = None
    notes: list[str] = field(default_factory=list)
    raised: int = 0  # scenarios that only raised, not counted as failures (fuzz_kernel's exceptions_fail)
    strict: bool = False  # a marginal was a failure
    marginals: int = 0  # scenarios judged marginal (the search went on)
    marginal_examples: list[dict] = field(default_factory=list)  # the worst KEEP_MARGINALS: ratio, headline, scenario
    marginal_artifact: Path | None = None
    worst_ratio: float | None = None  # the largest ratio of error to bound of any scenario run (the target)

    def observe(self, sc: Scenario, res) -> float:
        """Keep the margin of ``res`` (the scenario ``sc``); returns its ratio (0 without one)."""
        ratio = float(res.margin["ratio"]) if res.margin else 0.0
        if self.worst_ratio is None or ratio > self.worst_ratio:
            self.worst_ratio = ratio
        if res.verdict == "marginal":
            self.marginals += 1
            self.marginal_examples.append({"ratio": ratio, "headline": res.headline(), "margin": res.margin,
                                           "scenario": sc, "result": res})
            self.marginal_examples.sort(key=lambda e: -e["ratio"])
            del self.marginal_examples[KEEP_MARGINALS:]
        return ratio

    def merge_marginals(self, earlier: FuzzReport) -> None:
        """Fold the marginals of an ``earlier`` chunk of the same kernel into this report."""
        self.marginals += earlier.marginals
        self.marginal_examples = sorted(self.marginal_examples + earlier.marginal_examples,
                                        key=lambda e: -e["ratio"])[:KEEP_MARGINALS]
        if earlier.worst_ratio is not None:
            self.worst_ratio = max(self.worst_ratio or 0.0, earlier.worst_ratio)
        self.marginal_artifact = self.marginal_artifact or earlier.marginal_artifact

    @property
    def reproducer_rows(self) -> int | None:
        return None if self.scenario is None else len(self.scenario.active_rows)

    @property
    def reproducer_steps(self) -> int | None:
        if self.scenario is None:
            return None
        return self.scenario.steps if self.scenario.steps is not None else default_steps(self.scenario)

    def summary(self) -> str:
        if not self.caught:
            worst = "" if self.worst_ratio is None else f", worst {self.worst_ratio:.3f} x the bound"
            if self.marginals:
                best = self.marginal_examples[0]
                return (f"MARGINAL {self.kernel} [{self.family}]: {self.examples} scenarios, {self.wall_s:.1f} s "
                        f"({self.profile}), no failure; {self.marginals} marginal scenario(s), the worst "
                        f"{best['ratio']:.3f} x the bound at [{best['margin']['check']}] step {best['margin']['step']}"
                        + (f" -> {self.marginal_artifact}" if self.marginal_artifact else ""))
            return (f"PASS {self.kernel} [{self.family}]: {self.examples} scenarios, {self.wall_s:.1f} s "
                    f"({self.profile}{worst})")
        r = self.record
        return (f"FAIL {self.kernel} [{self.family}]: first failure after {self.time_to_first_failure_s:.1f} s, "
                f"shrunk to {self.reproducer_rows} active row(s) x {self.reproducer_steps} step(s), "
                f"{self.scenario.mode} {self.scenario.decode} T'={self.scenario.window} B={self.scenario.buffer}; "
                f"[{r.check}] at step {r.first_bad_step}" + (f" -> {self.artifact}" if self.artifact else ""))


def fuzz_kernel(kernel, family: str | None = None, *, profile: str | None = None, device: str = "cpu",
                failures_dir=None, max_examples: int | None = None, seed: int | None = None,
                shrink_budget_s: float | None = 20.0, shrink_budget_examples: int | None = None,
                strategy: dict | None = None, overrides: dict | None = None,
                kernel_device: str | None = None, exceptions_fail: bool = True, strict: bool = False,
                example_db=None, marginal_factor: float | None = None) -> FuzzReport:
    """Fuzz one kernel with Hypothesis under ``profile``; never raises for a kernel failure.

    ``strict``: a marginal scenario is a failure (else it is recorded and the search goes on);
    ``example_db``: a folder for the example database (:func:`example_database`; the profile's
    derandomization and ``seed`` are then off: Hypothesis uses no database under either);
    ``marginal_factor``: run_scenario's band.

    ``exceptions_fail`` False: a scenario whose only failing check is ``exception`` (the kernel raised)
    counts as passing (``report.raised`` counts them): a mutant whose declared bug is not raising
    is caught only by a check that names its bug (validators/jobs/fuzz/gallery.py).

    ``strategy`` overrides :data:`STRATEGY` (keyword arguments of :func:`scenarios`); ``seed``
    fixes Hypothesis's random seed (non-derandomized profiles); ``overrides`` are Hypothesis
    settings on top of the profile; ``failures_dir`` receives the shrunk reproducer as
    ``<family>-<kernel>.json``; ``kernel_device``: the kernel computes there, the engine on
    ``device`` (``validators/engine/hosted.py``)."""
    cls = _resolve(kernel, family)
    name = profile_name(profile)
    skw, kernel_arg = _target(cls, device, kernel_device, strategy)
    report = FuzzReport(kernel=cls.name, family=cls.family, profile=name, strict=strict)
    targeting = Phase.target in fuzz_settings(name, **dict(overrides or {})).phases
    failing: dict[str, object] = {}
    state: dict = {"last": None}
    t0 = time.perf_counter()

    def prop(sc: Scenario) -> None:
        key = sc.to_json(indent=None)
        res = failing.get(key)
        if res is None:
            t_first = report.time_to_first_failure_s
            if (shrink_budget_s is not None and t_first is not None
                    and time.perf_counter() - t0 - t_first > shrink_budget_s):
                report.shrink_stopped_by_budget = True
                return
            report.examples += 1
            res = run_scenario(sc, kernel_arg, device=device, stop_on_failure=True, marginal_factor=marginal_factor)
            ratio = report.observe(sc, res)
            if targeting:
                target(ratio, label=TARGET_LABEL)
            if res.ok(strict):
                return
            if report.time_to_first_failure_s is None:
                report.time_to_first_failure_s = time.perf_counter() - t0
            failing[key] = res
        state["last"] = (sc, res)
        # One raise site: Hypothesis identifies a failure by where it was raised.
        raise AssertionError(res.headline())

    # Derandomized profiles seed Hypothesis from the property's source, so the count bound wraps
    # ``prop`` (functools.wraps: Hypothesis reads the source through ``__wrapped__``) instead of
    # editing it: the ci profile draws the same scenarios with or without the bound.
    @functools.wraps(prop)
    def bounded(sc: Scenario) -> None:
        n_first = report.examples_to_first_failure
        if (shrink_budget_examples is not None and n_first is not None
                and report.examples - n_first >= shrink_budget_examples
                and sc.to_json(indent=None) not in failing):
            report.shrink_stopped_by_budget = True
            return
        last = state["last"]
        try:
            prop(sc)
        except AssertionError:
            if not exceptions_fail and set(state["last"][1].failure_counts) == {"exception"}:
                # only raised: a pass here (prop's source is left alone: it seeds the derandomized draws)
                report.raised += 1
                failing.pop(sc.to_json(indent=None), None)
                state["last"] = last
                if report.examples_to_first_failure is None:
                    report.time_to_first_failure_s = None
                return
            if report.examples_to_first_failure is None:
                report.examples_to_first_failure = report.examples
            raise

    hyp = dict(overrides or {})
    if max_examples is not None:
        hyp["max_examples"] = max_examples
    if example_db is not None:
        hyp.update(database=example_database(example_db, cls), derandomize=False)
    test = given(scenarios(kernel=cls, **skw))(bounded)
    test = fuzz_settings(name, **hyp)(test)
    if seed is not None and example_db is None:
        test = hypothesis_seed(seed)(test)
    elif seed is not None:  # Hypothesis does not read or write the database of a test given a seed
        report.notes.append(f"seed {seed} not applied: an explicit seed turns the example database off")
    try:
        test()
    except AssertionError:
        report.caught = True
    except unittest.SkipTest:  # no phase could run an example (a replay-only run of an empty database)
        report.notes.append("no scenario ran: the phases given generate none and the example database has none")
    report.wall_s = time.perf_counter() - t0
    if not report.caught and report.marginal_examples and failures_dir is not None:
        worst = report.marginal_examples[0]
        try:
            report.marginal_artifact = save_failure(failures_dir, worst["scenario"],
                                                    record_of(worst["result"], cls.name),
                                                    stem=f"{cls.family}-{cls.name}-marginal")
        except OSError as e:
            report.notes.append(f"the marginal scenario could not be written to {failures_dir}: "
                                f"{e.strerror or type(e).__name__}")
    if report.caught and state["last"] is not None:
        sc, res = state["last"]
        report.scenario = sc
        report.record = record_of(res, cls.name)
        if failures_dir is not None:
            try:
                report.artifact = save_failure(failures_dir, sc, report.record)
            except OSError as e:  # the shrunk reproducer is kept in the report (report.scenario)
                report.notes.append(f"the reproducer could not be written to {failures_dir}: "
                                    f"{e.strerror or type(e).__name__}")
    return report


def fuzz_target(cls: type[KernelUnderTest], *, profile: str | None = None, device: str = "cpu",
                kernel_device: str | None = None, failures_dir=None, seed: int | None = None,
                max_examples: int | None = None, modes: tuple[str, ...] | None = None, strict: bool = False,
                example_db=None, share_s: float | None = None) -> FuzzReport:
    """``replayssm fuzz``'s unit of work: one kernel fuzzed (:func:`fuzz_kernel`), in one run, or with a
    time share ``share_s`` in chunks of fresh random seeds (each chunk sized to the time left, by the
    scenarios per second of the chunks before) until the share is spent or a failure is caught.  The
    chunks are merged into one report whose ``seeds`` lists each chunk's seed."""
    seeds, merged = [], None
    t_k = time.perf_counter()
    while True:
        # One run (the profile's own seeding), or with a share chunks of fresh random seeds.
        chunk_seed = seed if not seeds and seed is not None else (
            random.randrange(2**32) if share_s is not None else None)
        n = max_examples
        if share_s is not None:
            n = max_examples or 50
            if merged is not None and merged.examples:
                per = merged.wall_s / merged.examples
                n = max(1, min(n, int((share_s - (time.perf_counter() - t_k)) / per)))
        r = fuzz_kernel(cls, profile=profile, device=device, kernel_device=kernel_device, failures_dir=failures_dir,
                        seed=chunk_seed, max_examples=n, strategy=None if modes is None else {"modes": modes},
                        overrides={"derandomize": False} if share_s is not None else None, strict=strict,
                        example_db=example_db)
        seeds.append(chunk_seed)
        if merged is not None:
            r.examples += merged.examples
            r.wall_s += merged.wall_s
            r.merge_marginals(merged)
            if r.time_to_first_failure_s is not None:
                r.time_to_first_failure_s += merged.wall_s
        merged = r
        if merged.caught or share_s is None or time.perf_counter() - t_k >= share_s:
            break
    merged.seeds = seeds
    return merged


# The estimated cost of one kernel's fuzzing relative to a pure-PyTorch kernel on the same device
# (:func:`fuzz_cost`): a Triton kernel through the interpreter costs far more per step than a
# PyTorch one (the strategy sizes above), so it is taken first by a dynamic scheduler.
INTERPRETED_COST = 40.0


def fuzz_cost(cls: type[KernelUnderTest], kernel_device: str = "cpu") -> float:
    """Estimated cost of fuzzing ``cls`` with the kernel on ``kernel_device``: :data:`INTERPRETED_COST`
    for a Triton kernel under the interpreter, else 1 (the order a scheduler takes kernels in)."""
    return INTERPRETED_COST if is_interpreted(cls, kernel_device) else 1.0


def sweep_kernel(kernel, family: str | None = None, *, examples: int, seed: int, device: str = "cpu",
                 budget_s: float | None = None, strategy: dict | None = None, keep: int = 3,
                 kernel_device: str | None = None) -> dict:
    """Run ``examples`` Hypothesis-drawn scenarios on ``kernel`` without stopping or shrinking
    (the nightly false-alarm count): every scenario runs to its first failing step; returns
    ``{"kernel", "family", "seed", "planned", "scenarios", "failures", "checks", "examples_failed",
    "wall_s", "stopped_by_budget", "marginals", "worst_ratio"}`` (marginal scenarios are no failures)
    with the first ``keep`` failing scenarios (JSON and headline) under ``examples_failed``.
    ``budget_s``: scenarios drawn after it are not run (counted out of ``scenarios``).
    ``kernel_device``: the kernel computes there while the engine, the literal model and the
    reference run on ``device`` (``validators/engine/hosted.py``; default: ``device``)."""
    cls = _resolve(kernel, family)
    skw, kernel_arg = _target(cls, device, kernel_device, strategy)
    out = {"kernel": cls.name, "family": cls.family, "seed": seed, "device": device,
           "kernel_device": kernel_device or device,
           "planned": examples,
           "scenarios": 0, "failures": 0, "checks": {}, "examples_failed": [], "stopped_by_budget": False,
           "marginals": 0, "worst_ratio": None}
    t0 = time.perf_counter()

    def prop(sc: Scenario) -> None:
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            out["stopped_by_budget"] = True
            return
        res = run_scenario(sc, kernel_arg, device=device, stop_on_failure=True)
        out["scenarios"] += 1
        ratio = float(res.margin["ratio"]) if res.margin else 0.0
        out["worst_ratio"] = ratio if out["worst_ratio"] is None else max(out["worst_ratio"], ratio)
        out["marginals"] += res.verdict == "marginal"
        if not res.passed:
            out["failures"] += 1
            check = res.first_failure.check if res.first_failure is not None else "exception"
            out["checks"][check] = out["checks"].get(check, 0) + 1
            if len(out["examples_failed"]) < keep:
                out["examples_failed"].append({"headline": res.headline(), "scenario": sc.to_dict()})

    test = settings(settings.get_profile("nightly"), max_examples=examples, database=None, derandomize=False,
                    phases=(Phase.generate,))(given(scenarios(kernel=cls, **skw))(prop))
    hypothesis_seed(seed)(test)()
    out["wall_s"] = round(time.perf_counter() - t0, 3)
    return out


__all__ = ["CI_EXAMPLES", "CI_EXAMPLES_ALTERNATE", "CI_EXAMPLES_INTERPRETED", "INTERPRETED_COST", "KEEP_MARGINALS",
           "TARGET_LABEL", "FuzzReport", "INTERPRETED_STRATEGY", "PROFILES", "PROFILE_ENV", "STRATEGY",
           "check_scenario", "ci_examples", "example_database", "fuzz_cost", "fuzz_kernel", "fuzz_settings",
           "fuzz_target", "fuzzable_kernels", "is_interpreted", "profile_name", "sweep_kernel"]
